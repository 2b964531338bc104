// SVG line charts: statistics over steps, several series, linear or log y axis,
// a marker at the chosen step, hover read-out, click to pick a step. One path per series,
// so a hundred runs of a thousand steps stay one path each; with `onHover`, the line (or
// legend entry) under the pointer is reported, and `highlight` brings one series forward.

import { h, s, clear, replace } from "../dom.js";
import { axisFormat, fmtNum } from "../format.js";
import { ema } from "../smoothing.js";
import { COLORS } from "./colors.js";
import { bandPaths, isOk } from "./bands.js";
import { markHighlighted } from "./highlight.js";
import { nonPositive, nonPositiveMarks, noteText } from "./log_zeros.js";
import { extent, linearScale, logScale, logTicks, nearestIndex, niceLogDomain, niceTicks } from "./scale.js";
import { tooltip } from "./tooltip.js";

const M = { top: 8, right: 14, bottom: 26, left: 58 };
const HOVER_PX = 6; // a line this close to the pointer is the one hovered
const MANY = 12; // more series than this: a scrolling legend, and the tooltip lists the nearest lines
const RAW = Symbol("raw values of a smoothed series");

export class LineChart {
  /**
   * @param {HTMLElement} parent
   * @param {{title?: string, height?: number, onPick?: (x: number) => void, className?: string,
   *          onHover?: (key: string|null) => void}} opts
   * `onHover(key)`: the series (its `key`, else its name) whose line or legend entry is under the pointer, null
   * when none; the owner calls `highlight` (of this chart and others showing the same runs).
   */
  constructor(parent, opts = {}) {
    this.opts = opts;
    this.titleEl = h("div", { class: "lg-chart-title", text: opts.title || "" });
    this.svg = s("svg", { class: "lg-lines", role: "img" });
    this.svg.setAttribute("tabindex", "0"); // focusable: the step keys work the same with focus on a chart
    this.legend = h("div", { class: "lg-legend" });
    this.note = h("div", { class: "lg-chart-note" });
    this.root = h("div", { class: `lg-chart ${opts.className || ""}` }, this.titleEl, this.svg, this.legend, this.note);
    parent.appendChild(this.root);
    this.data = null;
    this.highlighted = null;
    this.hoverKey = null;
    this._resize = new ResizeObserver(() => {
      if (this.data && this.root.clientWidth !== this._width) this.update(this.data);
    });
    this._resize.observe(this.root);
  }

  setTitle(text) {
    this.titleEl.textContent = text;
  }

  /**
   * @param {{series: {name: string, color: string, xs: number[], ys: (number|null)[], dash?: string, width?: number}[],
   *          log?: boolean, marker?: number|null, xMarks?: {x: number, color?: string, title?: string}[],
   *          xLabel?: string, yLabel?: string, integerX?: boolean, empty?: string, xFormat?: (x) => string,
   *          bands?: {name: string, color: string, xs: number[], lo: (number|null)[], hi: (number|null)[]}[],
   *          yDomain?: [number, number], smoothing?: number, xBands?: {x0: number, x1: number, title: string}[],
   *          nonPositiveWhy?: string}} data
   * A series' `key` (default: its name) names it for `highlight` and `onHover` (a label may add to the name).
   * `bands`: filled areas between `lo` and `hi` (e.g. a spread over examples), drawn under the lines.
   * `yDomain`: a fixed y range (fractions: [0, 1]). `smoothing`: TensorBoard's EMA weight; each series
   * (unless `smooth: false`) is drawn smoothed, its raw values faint behind. `xBands`: shaded step ranges
   * (e.g. where a value is not defined), with their reason as a tooltip. On a log axis, values <= 0 are
   * marked under the plot and named in a note (with `nonPositiveWhy`): never dropped silently. A recorded step
   * without a value (null, NaN, ±Inf) is not drawn, and the steps are named in the note (with `gapWhy`); a
   * smoothed line is drawn only where its raw values are (TensorBoard's Scalars do the same).
   */
  update(data) {
    this.data = data;
    const width = Math.max(240, this.root.clientWidth || 400);
    this._width = this.root.clientWidth;
    const height = this.opts.height || 170;
    const svg = this.svg;
    clear(svg);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("aria-label", this.titleEl.textContent || "line chart");
    const bands = data.bands || [];
    const rawAll = [...(data.series || []).map((x) => x.ys), ...bands.flatMap((b) => [b.lo, b.hi])];
    let log = Boolean(data.log);
    if (log && !extent(rawAll, true) && extent(rawAll)) log = false; // nothing positive: a log axis could show nothing
    // Smoothed on the axis chosen: a smoothed value only where the raw one is drawn.
    const series = smoothed(data.series || [], data.smoothing || 0, log);
    this.series = series;
    this._legend(series);
    const ysAll = [...series.map((x) => x.ys), ...bands.flatMap((b) => [b.lo, b.hi])];
    const xr = extent([...series.map((x) => x.xs), ...bands.map((b) => b.xs)]);
    const yr = extent(ysAll, log);
    const plotW = width - M.left - M.right;
    const plotH = height - M.top - M.bottom;
    svg.dataset.empty = !xr || !yr ? "1" : "0";
    if (!xr || !yr) {
      svg.appendChild(s("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "lg-empty-text", text: data.empty || "no finite values" }));
      this.scales = null;
      replace(this.note);
      return;
    }
    let [y0, y1] = yr;
    if (data.yDomain) [y0, y1] = data.yDomain;
    else if (log) {
      const pad = Math.max(0.05, 0.05 * Math.log10(y1 / y0));
      y0 /= Math.pow(10, pad);
      y1 *= Math.pow(10, pad);
    } else {
      const pad = (y1 - y0) * 0.06 || Math.abs(y1) * 0.1 || 1;
      y0 -= pad;
      y1 += pad;
    }
    let logTickValues = null;
    if (log && !data.yDomain) [y0, y1, logTickValues] = niceLogDomain(y0, y1);
    const x = linearScale(xr[0], xr[1], M.left, M.left + plotW);
    const y = (log ? logScale : linearScale)(y0, y1, M.top + plotH, M.top);
    svg.dataset.y0 = String(y.domain[0]); // the axes' ranges, for tests and for reading
    svg.dataset.y1 = String(y.domain[1]);
    svg.dataset.x0 = String(x.domain[0]);
    svg.dataset.x1 = String(x.domain[1]);
    svg.dataset.log = log ? "1" : "0";
    this.scales = { x, y, xs: [...new Set(series.flatMap((q) => q.xs))].sort((a, b) => a - b) };

    // Axes and grid.
    const grid = s("g", { class: "lg-grid" });
    const yTicks = log ? logTickValues || logTicks(y.domain[0], y.domain[1]) : niceTicks(y.domain[0], y.domain[1]);
    const yFormat = axisFormat(yTicks.filter((t) => y(t) >= M.top - 0.5 && y(t) <= M.top + plotH + 0.5));
    for (const t of yTicks) {
      const py = y(t);
      if (!(py >= M.top - 0.5 && py <= M.top + plotH + 0.5)) continue;
      grid.appendChild(s("line", { x1: M.left, x2: M.left + plotW, y1: py, y2: py }));
      grid.appendChild(s("text", { x: M.left - 6, y: py + 3.5, "text-anchor": "end", class: "lg-tick lg-ytick", text: yFormat(t) }));
    }
    const xTicks = niceTicks(xr[0], xr[1], { integer: data.integerX !== false, max: Math.min(6, Math.max(2, Math.floor(plotW / 60))) });
    const xFormat = data.xFormat || axisFormat(xTicks);
    for (const t of xTicks) {
      const px = x(t);
      grid.appendChild(s("line", { x1: px, x2: px, y1: M.top + plotH, y2: M.top + plotH + 4, class: "lg-tickmark" }));
      grid.appendChild(s("text", { x: px, y: M.top + plotH + 16, "text-anchor": "middle", class: "lg-tick lg-xtick", text: xFormat(t) }));
    }
    for (const b of data.xBands || []) {
      const [a, z] = [x(b.x0), x(b.x1)];
      const band = s("rect", { x: Math.min(a, z) - 1, y: M.top, width: Math.max(2, Math.abs(z - a) + 2), height: plotH, class: "lg-undefined-band", dataset: { x0: b.x0, x1: b.x1 } });
      band.appendChild(s("title", { text: b.title }));
      grid.appendChild(band);
    }
    grid.appendChild(s("rect", { x: M.left, y: M.top, width: plotW, height: plotH, class: "lg-frame" }));
    svg.appendChild(grid);
    if (data.xLabel) svg.appendChild(s("text", { x: M.left + plotW, y: height - 1, "text-anchor": "end", class: "lg-axis-label", text: data.xLabel }));

    // Marks on the x axis (e.g. steps with non-finite values).
    for (const m of data.xMarks || []) {
      const px = x(m.x);
      const mark = s("path", {
        d: `M${px},${M.top + plotH - 7} l4,7 l-8,0 z`,
        fill: m.color || COLORS.nonfinite,
        class: "lg-xmark",
      });
      if (m.title) mark.appendChild(s("title", { text: m.title }));
      svg.appendChild(mark);
    }

    // Series.
    const clipId = `clip${Math.random().toString(36).slice(2)}`;
    svg.appendChild(s("clipPath", { id: clipId }, s("rect", { x: M.left, y: M.top - 2, width: plotW, height: plotH + 4 })));
    const lines = s("g", { "clip-path": `url(#${clipId})` });
    this.linesG = lines;
    this.byKey = new Map(); // key -> the series' marks, for highlight()
    const mark = (q, el) => {
      const key = keyOf(q);
      if (!this.byKey.has(key)) this.byKey.set(key, []);
      this.byKey.get(key).push(el);
      return el;
    };
    for (const b of bands) for (const d of bandPaths(b, x, y, log)) lines.appendChild(s("path", { d, class: "lg-band", fill: b.color, "fill-opacity": 0.25, stroke: "none", dataset: { band: b.name } }));
    series.forEach((q, k) => {
      let d = "";
      let pen = false;
      const dots = [];
      for (let n = 0; n < q.xs.length; n++) {
        const v = q.ys[n];
        const ok = typeof v === "number" && Number.isFinite(v) && (!log || v > 0);
        if (!ok) {
          pen = false;
          continue;
        }
        const px = x(q.xs[n]).toFixed(1);
        const py = y(v).toFixed(1);
        const prevOk = n > 0 && isOk(q.ys[n - 1], log);
        const nextOk = n + 1 < q.xs.length && isOk(q.ys[n + 1], log);
        if (!prevOk && !nextOk) dots.push([px, py]);
        d += `${pen ? "L" : "M"}${px},${py}`;
        pen = true;
      }
      const path = s("path", {
        d: d || "M0,0",
        class: q.faint ? "lg-line-raw" : "lg-line",
        stroke: q.color,
        "stroke-width": q.width || 1.6,
        "stroke-dasharray": q.dash || null,
        fill: "none",
        dataset: q.faint ? { raw: q.name, key: keyOf(q) } : { series: q.name, index: k, key: keyOf(q) },
      });
      lines.appendChild(mark(q, path));
      for (const [px, py] of dots) lines.appendChild(mark(q, s("circle", { cx: px, cy: py, r: 2.2, fill: q.color, class: "lg-dot" })));
    });
    svg.appendChild(lines);
    const bad = log ? nonPositive(series.filter((q) => !q.faint).map((q) => ({ ...q, ys: q[RAW] || q.ys }))) : [];
    svg.appendChild(nonPositiveMarks(bad, x, M.top + plotH));
    const unit = ["step", "layer"].includes(data.xLabel) ? data.xLabel : "point";
    const linearWhy = data.log && !log ? "no value above 0: drawn on a linear scale (a log scale could show none)" : "";
    const named = data.xFormatHover || ((v) => String(v)); // a layer by its name, a step by its number
    const gaps = gapText(series.filter((q) => !q.faint).map((q) => ({ ...q, ys: q[RAW] || q.ys })), data.gapWhy, unit, named);
    const notes = [bad.length ? noteText(bad, data.nonPositiveWhy, unit) : linearWhy, gaps].filter(Boolean);
    replace(this.note, notes.map((n) => h("div", { text: n, class: n === gaps ? "lg-gap-note" : null })));

    // The chosen step.
    this.markerEl = s("line", { x1: 0, x2: 0, y1: M.top, y2: M.top + plotH, class: "lg-marker", stroke: COLORS.selected });
    svg.appendChild(this.markerEl);
    this._placeMarker(data.marker);

    // Hover / click layer.
    this.hoverG = s("g", { class: "lg-hover" });
    svg.appendChild(this.hoverG);
    const catcher = s("rect", { x: M.left, y: M.top, width: plotW, height: plotH, class: "lg-catcher" });
    catcher.addEventListener("mousemove", (e) => this._hover(e));
    catcher.addEventListener("mouseleave", () => {
      clear(this.hoverG);
      tooltip().hide();
      this._hoverKey(null);
    });
    this._dragSelect(catcher, plotH);
    catcher.addEventListener("click", (e) => {
      if (this._dragged) {
        this._dragged = false;
        return; // the end of a drag-select
      }
      const xv = this._xAt(e);
      if (xv !== null && this.opts.onPick) this.opts.onPick(xv);
    });
    if (this.opts.onPick) catcher.style.cursor = "pointer";
    svg.appendChild(catcher);
    this.highlight(this.highlighted);
  }

  /** Bring the series `key` forward and fade the others (null: none); its legend entry too. */
  highlight(key) {
    this.highlighted = key ?? null;
    const marks = this.byKey && key !== null && key !== undefined ? this.byKey.get(key) : null;
    markHighlighted(this, key, marks);
    for (const el of marks || []) if (!el.classList.contains("lg-line-raw")) this.linesG.appendChild(el); // drawn last: on top
  }

  _hoverKey(key) {
    if (!this.opts.onHover || key === this.hoverKey) return;
    this.hoverKey = key;
    this.opts.onHover(key);
  }

  /** With `opts.onSelect(x0, x1)`: a horizontal drag across the plot picks an x range (e.g. to zoom in). */
  _dragSelect(catcher, plotH) {
    if (!this.opts.onSelect) return;
    const band = s("rect", { x: 0, y: M.top, width: 0, height: plotH, class: "lg-select-band", fill: "rgba(33,150,243,0.25)" });
    band.style.display = "none";
    this.svg.appendChild(band);
    const px = (e) => e.clientX - this.svg.getBoundingClientRect().left;
    catcher.addEventListener("mousedown", (e) => {
      this.drag = { x0: px(e), x1: px(e) };
    });
    catcher.addEventListener("mousemove", (e) => {
      if (!this.drag) return;
      this.drag.x1 = px(e);
      band.style.display = "";
      band.setAttribute("x", Math.min(this.drag.x0, this.drag.x1));
      band.setAttribute("width", Math.abs(this.drag.x1 - this.drag.x0));
    });
    const end = (e) => {
      const d = this.drag;
      this.drag = null;
      band.style.display = "none";
      if (!d || !this.scales || Math.abs(px(e) - d.x0) < 5) return;
      this._dragged = e.target === catcher;
      const [a, b] = [this.scales.x.invert(d.x0), this.scales.x.invert(px(e))].sort((p, q) => p - q);
      this.opts.onSelect(a, b);
    };
    if (this._endDrag) window.removeEventListener("mouseup", this._endDrag);
    this._endDrag = end;
    window.addEventListener("mouseup", end);
  }

  /** Move the step marker without redrawing the chart. */
  setMarker(x) {
    if (this.data) this.data.marker = x;
    this._placeMarker(x);
  }

  _placeMarker(v) {
    const el = this.markerEl;
    if (!el || !this.scales) return;
    const px = v === null || v === undefined ? NaN : this.scales.x(v);
    const [a, b] = [this.scales.x.domain[0], this.scales.x.domain[1]].map(this.scales.x);
    const show = Number.isFinite(px) && px >= a - 1 && px <= b + 1;
    el.style.display = show ? "" : "none";
    if (show) {
      el.setAttribute("x1", px);
      el.setAttribute("x2", px);
    }
  }

  _legend(all) {
    const series = all.filter((q) => !q.faint);
    if (this.opts.legend === false || (series.length < 2 && !this.opts.alwaysLegend)) {
      clear(this.legend);
      return;
    }
    replace(
      this.legend,
      series.map((q) =>
        h("span", { class: "lg-legend-item", dataset: { series: q.name, key: keyOf(q) }, on: this.opts.onHover ? { mouseenter: () => this._hoverKey(keyOf(q)), mouseleave: () => this._hoverKey(null) } : null },
          h("span", { class: "lg-swatch", style: swatchStyle(q) }),
          h("span", { class: "lg-legend-name", text: q.name })),
      ),
    );
    this.legend.classList.toggle("lg-legend-many", series.length > MANY);
  }

  _xAt(e) {
    if (!this.scales || !this.scales.xs.length) return null;
    const r = this.svg.getBoundingClientRect();
    const xv = this.scales.x.invert(e.clientX - r.left);
    return this.scales.xs[nearestIndex(this.scales.xs, xv)];
  }

  _hover(e) {
    const xv = this._xAt(e);
    if (xv === null) return;
    const { x, y } = this.scales;
    const data = this.data;
    clear(this.hoverG);
    const px = x(xv);
    this.hoverG.appendChild(s("line", { x1: px, x2: px, y1: M.top, y2: (this.opts.height || 170) - M.bottom, class: "lg-crosshair" }));
    let rows = [];
    const log = this.scales.y.log;
    const py = e.clientY - this.svg.getBoundingClientRect().top;
    for (const q of this.series) {
      const n = q.xs.indexOf(xv);
      if (n < 0 || q.faint) continue;
      const v = q.ys[n];
      const raw = q[RAW] ? q[RAW][n] : v;
      const shown = log && typeof raw === "number" && raw <= 0 ? `${fmtNum(raw)} (not drawn on a log scale)` : fmtNum(raw);
      const away = isOk(v, log) ? Math.abs(y(v) - py) : Infinity;
      rows.push({ row: [q.name, q[RAW] && v !== raw && v !== null ? `${fmtNum(v)} (raw ${shown})` : shown], q, v, away });
    }
    // The line under the pointer (within a few pixels) is the one hovered.
    const near = rows.reduce((a, b) => (b.away < (a ? a.away : HOVER_PX) ? b : a), null);
    this._hoverKey(near ? keyOf(near.q) : null);
    let more = "";
    if (rows.length > MANY) {
      // Many runs: the lines nearest the pointer, the hovered one first.
      const total = rows.length;
      rows = rows.slice().sort((a, b) => a.away - b.away).slice(0, MANY);
      more = `and ${total - rows.length} more: move closer to a line`;
    }
    for (const r of rows) {
      if (isOk(r.v, log) && (!more || r === near)) this.hoverG.appendChild(s("circle", { cx: px, cy: y(r.v), r: 3.2, fill: r.q.color, stroke: "#fff" }));
    }
    const title = (data.xFormatHover || ((v) => `${data.xLabel || "step"} ${v}`))(xv);
    tooltip().show(e.clientX, e.clientY, title, rows.map((r) => (r === near ? [...r.row, "lg-tooltip-hi"] : r.row)), more);
  }
}

function keyOf(q) {
  return q.key ?? q.name;
}

/** A legend swatch: a filled square, or for a dashed line a dashed (or dotted) stroke of its colour. */
function swatchStyle(q) {
  if (!q.dash) return { background: q.color };
  const dotted = Number(String(q.dash).split(" ")[0]) < 2;
  return { background: "none", "border-top": `2px ${dotted ? "dotted" : "dashed"} ${q.color}`, height: "0", "margin-top": "4px" };
}

/**
 * With a smoothing weight: each series smoothed (its raw values kept under RAW), after a faint copy of the raw.
 * The smoothed line has a point only where the raw value can be drawn on the axis (`log`): the average
 * runs on over a step without a value, as TensorBoard's, but is never drawn there, so no line crosses a
 * stretch the data leave empty.
 */
function smoothed(series, w, log) {
  if (!(w > 0)) return series;
  return series.flatMap((q) => {
    if (q.smooth === false) return [q];
    const ys = ema(q.ys, w).map((v, n) => (isOk(q.ys[n], log) ? v : null));
    return [{ ...q, faint: true, width: 1, dash: null }, { ...q, ys, [RAW]: q.ys }];
  });
}

/** Runs of consecutive x among `xs` as "a–b" (at most `max`, then "…"), each x as `fmt` names it. */
function spans(xs, all, fmt, max = 3) {
  const pos = new Map(all.map((x, n) => [x, n]));
  const out = [];
  let start = null;
  let prev = null;
  for (const x of xs) {
    if (start !== null && pos.get(x) === pos.get(prev) + 1) {
      prev = x;
      continue;
    }
    if (start !== null) out.push(start === prev ? fmt(start) : `${fmt(start)}–${fmt(prev)}`);
    start = prev = x;
  }
  if (start !== null) out.push(start === prev ? fmt(start) : `${fmt(start)}–${fmt(prev)}`);
  return out.length > max ? `${out.slice(0, max).join(", ")}, …` : out.join(", ");
}

/** "L2 norm: no value at 84 steps (17–100) — why": the recorded steps of each series without a value. */
function gapText(series, why, unit, fmt) {
  const bits = [];
  for (const q of series) {
    const missing = q.xs.filter((_, n) => !(typeof q.ys[n] === "number" && Number.isFinite(q.ys[n])));
    if (!missing.length) continue;
    const n = missing.length;
    const where = n === q.xs.length ? `any of its ${n} ${unit}${n === 1 ? "" : "s"}` : `${n} ${unit}${n === 1 ? "" : "s"} (${spans(missing, q.xs, fmt)})`;
    bits.push(`${q.name}: no value at ${where}`);
  }
  return bits.length ? `not drawn: ${bits.join(" · ")}${why ? ` — ${why}` : ""}` : "";
}
