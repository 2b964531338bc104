// Histograms as TensorBoard draws them: "offset" (one ridge per step, older ones
// behind and above) and "overlay" (all steps on one axis), plus aligned-bin
// overlays of several runs. Buckets are [left, right, count] (docs/HTTP_API.md). Aligned, with `onHover`,
// the run whose outline (or legend entry) is under the pointer is reported, and `highlight` brings one run
// forward; beyond MANY runs each is an outline and the tooltip lists the runs nearest the pointer.

import { h, s, clear, replace } from "../dom.js";
import { axisFormat, fmtNum, fmtPercent } from "../format.js";
import { COLORS } from "./colors.js";
import { markHighlighted } from "./highlight.js";
import { linearScale, niceDomain } from "./scale.js";
import { tooltip } from "./tooltip.js";

const M = { top: 10, right: 56, bottom: 26, left: 16 };
const RIGHT_PER_STEP = 116; // the labels say each ridge's own range too
const LABEL_PX = 12; // ridge labels closer than this would overlap

/** The range a ridge is drawn on when each has its own: symmetric about 0 when it holds both signs. */
export function ownRange(buckets) {
  const r = valueRange([buckets]);
  if (!r) return null;
  const [lo, hi] = r;
  if (lo >= 0) return [0, hi];
  if (hi <= 0) return [lo, 0];
  const m = Math.max(-lo, hi);
  return [-m, m];
}

/** How many times wider the widest ridge's range is than the narrowest's (1: one ridge, or none). */
export function rangeSpread(bucketLists) {
  const widths = bucketLists.map(ownRange).filter(Boolean).map(([a, b]) => b - a).filter((w) => w > 0);
  return widths.length ? Math.max(...widths) / Math.min(...widths) : 1;
}

/** The ridges worth a label, newest and chosen first, none within LABEL_PX of another. */
export function labelledRidges(bases, currentK) {
  const order = [...(currentK >= 0 ? [currentK] : []), bases.length - 1];
  for (let k = bases.length - 2; k >= 0; k--) order.push(k);
  const placed = [];
  for (const k of order) {
    if (k < 0 || placed.includes(k)) continue;
    if (placed.every((j) => Math.abs(bases[j] - bases[k]) >= LABEL_PX)) placed.push(k);
  }
  return new Set(placed);
}
const HOVER_PX = 6; // an outline this close to the pointer is the one hovered
const MANY = 12;

/** [min left, max right] over histograms that hold something. */
export function valueRange(bucketLists) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const b of bucketLists) {
    if (!b || !b.length || !b.some((x) => x[2] > 0)) continue;
    lo = Math.min(lo, b[0][0]);
    hi = Math.max(hi, b[b.length - 1][1]);
  }
  if (!(lo <= hi)) return null;
  if (lo === hi) {
    const d = Math.abs(lo) * 0.1 || 1;
    return [lo - d, hi + d];
  }
  return [lo, hi];
}

/** `count` equal-width bin edges over [lo, hi]. */
export function edges(lo, hi, count) {
  const e = new Array(count + 1);
  for (let k = 0; k <= count; k++) e[k] = lo + ((hi - lo) * k) / count;
  return e;
}

/**
 * Counts of `buckets` redistributed onto the bins `e` (each bucket's count is
 * spread uniformly over its width; a zero-width bucket goes to the bin holding it).
 */
export function rebin(buckets, e) {
  const K = e.length - 1;
  const out = new Array(K).fill(0);
  for (const [l, r, c] of buckets || []) {
    if (!(c > 0)) continue;
    if (!(r > l)) {
      let k = Math.floor(((l - e[0]) / (e[K] - e[0])) * K);
      out[Math.max(0, Math.min(K - 1, k))] += c;
      continue;
    }
    for (let k = 0; k < K; k++) {
      const overlap = Math.min(r, e[k + 1]) - Math.max(l, e[k]);
      if (overlap > 0) out[k] += (c * overlap) / (r - l);
    }
  }
  return out;
}

function total(buckets) {
  let t = 0;
  for (const b of buckets || []) t += b[2];
  return t;
}

export class HistogramChart {
  /**
   * @param {HTMLElement} parent
   * @param {{title?: string, height?: number, onPick?: (key: any) => void, onHover?: (key: any) => void}} opts
   * `onHover(key)` (aligned): the run whose outline or legend entry is under the pointer, null when none.
   */
  constructor(parent, opts = {}) {
    this.opts = opts;
    this.titleEl = h("div", { class: "lg-chart-title", text: opts.title || "" });
    this.svg = s("svg", { class: "lg-hist", role: "img", tabindex: "0" });
    this.legend = h("div", { class: "lg-legend" });
    this.root = h("div", { class: "lg-chart" }, this.titleEl, this.svg, this.legend);
    parent.appendChild(this.root);
    this.data = null;
    this.highlighted = null;
    this._resize = new ResizeObserver(() => {
      if (this.data && this.root.clientWidth !== this._width) this.update(this.data);
    });
    this._resize.observe(this.root);
  }

  setTitle(text) {
    this.titleEl.textContent = text;
  }

  /**
   * @param {{items: {key: any, label: string, color?: string, buckets: number[][]}[], mode: "offset"|"overlay"|"aligned",
   *          current?: any, bins?: number, empty?: string, color?: string, perStep?: boolean}} data
   *   `color`: the series' colour (offset/overlay), so that a colour means one series across the view;
   *   the chosen step is drawn in COLORS.selected.
   *   offset/overlay: one item per step (ascending). aligned: one item per run, re-binned onto common bins
   *   and shown as fractions of each run's finite elements. `perStep` (offset): each ridge on its own range
   *   (`ownRange`, said in its label), for a gradient whose size changes by decades between steps.
   */
  update(data) {
    this.data = data;
    this.byKey = null;
    const width = Math.max(260, this.root.clientWidth || 420);
    this._width = this.root.clientWidth;
    const height = this.opts.height || 260;
    const svg = this.svg;
    clear(svg);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("aria-label", this.titleEl.textContent || "histograms");
    const items = (data.items || []).filter((it) => it.buckets && it.buckets.length);
    this._legend(data.mode === "aligned" ? items : []);
    const range = valueRange(items.map((it) => it.buckets));
    const perStep = Boolean(data.perStep) && data.mode === "offset";
    const right = perStep ? RIGHT_PER_STEP : M.right;
    const plotW = width - M.left - right;
    const plotH = height - M.top - M.bottom;
    svg.dataset.perStep = perStep ? "1" : "0";
    if (!range) {
      svg.appendChild(s("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "lg-empty-text", text: data.empty || "no finite values to bucket" }));
      this.layout = null;
      return;
    }
    const [d0, d1, ticks] = niceDomain(range[0], range[1], { max: Math.min(6, Math.max(3, Math.floor(plotW / 70))) });
    const x = linearScale(d0, d1, M.left, M.left + plotW);
    const axis = s("g", { class: "lg-grid" });
    if (perStep) {
      // No common value axis: the ends are each ridge's own (its label), 0 where the ranges hold it.
      const ends = [["−max", 0], ["0", 0.5], ["+max", 1]];
      for (const [text, f] of ends) {
        const px = M.left + f * plotW;
        axis.appendChild(s("line", { x1: px, x2: px, y1: M.top, y2: M.top + plotH, class: f === 0.5 ? "lg-zero" : null }));
        axis.appendChild(s("text", { x: px, y: M.top + plotH + 16, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle", class: "lg-tick lg-xtick lg-xtick-own", text }));
      }
    } else {
      const fmt = axisFormat(ticks);
      for (const t of ticks) {
        const px = x(t);
        axis.appendChild(s("line", { x1: px, x2: px, y1: M.top, y2: M.top + plotH, class: t === 0 ? "lg-zero" : null }));
        axis.appendChild(s("text", { x: px, y: M.top + plotH + 16, "text-anchor": "middle", class: "lg-tick lg-xtick", text: fmt(t) }));
      }
    }
    svg.appendChild(axis);
    const g = s("g");
    svg.appendChild(g);
    this.layout = { x, items, plotH, plotW, mode: data.mode };

    if (data.mode === "aligned") this._aligned(g, data, items, range, x, plotH);
    else if (data.mode === "overlay") this._overlay(g, data, items, x, plotH);
    else this._offset(g, data, items, x, plotH, plotW, perStep);

    const catcher = s("rect", { x: M.left, y: M.top, width: plotW, height: plotH, class: "lg-catcher" });
    catcher.addEventListener("mousemove", (e) => this._hover(e));
    catcher.addEventListener("mouseleave", () => {
      tooltip().hide();
      this._hoverKey(null);
    });
    catcher.addEventListener("click", (e) => {
      const it = this._itemAt(e);
      if (it && this.opts.onPick && data.mode !== "aligned") this.opts.onPick(it.key);
    });
    if (this.opts.onPick && data.mode !== "aligned") catcher.style.cursor = "pointer";
    svg.appendChild(catcher);
    this.highlight(this.highlighted);
  }

  /** Aligned: bring run `key` forward and fade the others (null: none); its legend entry too. */
  highlight(key) {
    this.highlighted = key ?? null;
    const mark = this.byKey && key !== null && key !== undefined ? this.byKey.get(key) : null;
    markHighlighted(this, key, mark ? [mark] : null);
    if (mark) mark.parentNode.appendChild(mark); // drawn last: on top
  }

  _hoverKey(key) {
    if (!this.opts.onHover || key === this.hoverKey) return;
    this.hoverKey = key;
    this.opts.onHover(key);
  }

  _legend(items) {
    if (!items.length) {
      clear(this.legend);
      return;
    }
    const on = (it) => (this.opts.onHover ? { mouseenter: () => this._hoverKey(it.key), mouseleave: () => this._hoverKey(null) } : null);
    this.legend.classList.toggle("lg-legend-many", items.length > MANY);
    replace(
      this.legend,
      items.map((it) =>
        h("span", { class: "lg-legend-item", dataset: { series: it.label, key: it.key }, on: on(it) },
          h("span", { class: "lg-swatch", style: { background: it.color } }),
          h("span", { class: "lg-legend-name", text: it.label }),
          it.note ? h("span", { class: "lg-legend-note", text: it.note }) : null),
      ),
    );
  }

  _ridgePath(buckets, x, base, scaleY) {
    // Through the bucket centres, closed on the baseline at the outer edges.
    const first = buckets[0][0];
    const last = buckets[buckets.length - 1][1];
    if (!(last > first)) {
      const c = buckets.reduce((a, b) => a + b[2], 0);
      const px = x(first);
      return { d: `M${px - 1.5},${base}L${px},${base - scaleY(c)}L${px + 1.5},${base}Z`, spike: true };
    }
    let d = `M${x(first).toFixed(1)},${base}`;
    for (const [l, r, c] of buckets) d += `L${x((l + r) / 2).toFixed(1)},${(base - scaleY(c)).toFixed(1)}`;
    d += `L${x(last).toFixed(1)},${base}Z`;
    return { d, spike: false };
  }

  _offset(g, data, items, x0, plotH, plotW, perStep) {
    const n = items.length;
    const color = data.color || COLORS.selected;
    const ridgeH = n > 1 ? Math.min(plotH * 0.45, Math.max(24, plotH * 0.3)) : plotH;
    const spacing = n > 1 ? (plotH - ridgeH) / (n - 1) : 0;
    let maxC = 0;
    for (const it of items) for (const b of it.buckets) maxC = Math.max(maxC, b[2]);
    const scaleY = (c) => (maxC ? (c / maxC) * ridgeH : 0);
    const bases = items.map((_, k) => M.top + ridgeH + k * spacing);
    this.layout.bases = bases;
    const currentK = items.findIndex((it) => data.current !== undefined && it.key === data.current);
    const labelled = labelledRidges(bases, currentK);
    // Each ridge's own x scale (per step), else the common one.
    const own = items.map((it) => (perStep ? ownRange(it.buckets) : null));
    this.layout.xs = items.map((_, k) => (own[k] && own[k][1] > own[k][0] ? linearScale(own[k][0], own[k][1], M.left, M.left + plotW) : x0));
    let currentPath = null;
    items.forEach((it, k) => {
      const base = bases[k];
      const x = this.layout.xs[k];
      const t = n > 1 ? k / (n - 1) : 1;
      const isCurrent = data.current !== undefined && it.key === data.current;
      const { d } = this._ridgePath(it.buckets, x, base, scaleY);
      g.appendChild(
        s("path", {
          d,
          class: isCurrent ? "lg-ridge lg-current" : "lg-ridge",
          fill: isCurrent ? COLORS.selected : color,
          "fill-opacity": isCurrent ? 0.14 : (0.06 + 0.22 * t).toFixed(3),
          stroke: isCurrent ? COLORS.selected : color,
          "stroke-opacity": isCurrent ? 1 : (0.35 + 0.55 * t).toFixed(3),
          dataset: { step: it.key },
        }),
      );
      if (isCurrent) currentPath = d;
      if (labelled.has(k)) {
        const span = own[k] ? (own[k][0] === -own[k][1] ? `±${fmtNum(own[k][1])}` : `${fmtNum(own[k][0])}…${fmtNum(own[k][1])}`) : "";
        g.appendChild(
          s("text", {
            x: M.left + plotW + 6,
            y: base + 3,
            class: isCurrent ? "lg-tick lg-ridge-label lg-current-label" : "lg-tick lg-ridge-label",
            text: span ? `${it.label} ${span}` : it.label,
            dataset: { step: it.key },
          }),
        );
      }
    });
    if (currentPath) g.appendChild(s("path", { d: currentPath, class: "lg-ridge-top", fill: "none", stroke: COLORS.selected }));
  }

  _overlay(g, data, items, x, plotH) {
    let maxC = 0;
    for (const it of items) for (const b of it.buckets) maxC = Math.max(maxC, b[2]);
    const base = M.top + plotH;
    const scaleY = (c) => (maxC ? (c / maxC) * (plotH - 4) : 0);
    const n = items.length;
    let current = null;
    items.forEach((it, k) => {
      const t = n > 1 ? k / (n - 1) : 1;
      const isCurrent = data.current !== undefined && it.key === data.current;
      const { d } = this._ridgePath(it.buckets, x, base, scaleY);
      const p = s("path", { d, class: "lg-overlay-line", fill: "none", stroke: data.color || COLORS.selected, "stroke-opacity": (0.2 + 0.6 * t).toFixed(3), dataset: { step: it.key } });
      if (isCurrent) current = p;
      else g.appendChild(p);
    });
    if (current) {
      current.setAttribute("stroke", COLORS.selected);
      current.setAttribute("stroke-opacity", "1");
      current.setAttribute("class", "lg-overlay-line lg-current");
      g.appendChild(current);
    }
    g.appendChild(s("text", { x: M.left + 4, y: M.top + 10, class: "lg-tick", text: `${items.length} steps; highlighted: step ${data.current ?? "—"}` }));
  }

  _aligned(g, data, items, range, x, plotH) {
    const bins = data.bins || 40;
    const e = edges(range[0], range[1], bins);
    const fractions = items.map((it) => {
      const counts = rebin(it.buckets, e);
      const t = total(it.buckets) || 1;
      return counts.map((c) => c / t);
    });
    let maxF = 0;
    for (const f of fractions) for (const v of f) maxF = Math.max(maxF, v);
    const base = M.top + plotH;
    const y = (v) => base - (maxF ? (v / maxF) * (plotH - 6) : 0);
    this.layout.aligned = { e, fractions, y };
    this.byKey = new Map();
    this.svg.classList.toggle("lg-many", items.length > MANY);
    items.forEach((it, k) => {
      let d = `M${x(e[0]).toFixed(1)},${base}`;
      fractions[k].forEach((v, b) => {
        d += `L${x(e[b]).toFixed(1)},${y(v).toFixed(1)}L${x(e[b + 1]).toFixed(1)},${y(v).toFixed(1)}`;
      });
      d += `L${x(e[bins]).toFixed(1)},${base}Z`;
      const path = s("path", { d, class: "lg-aligned", fill: it.color, stroke: it.color, dataset: { series: it.label, key: it.key } });
      this.byKey.set(it.key, path);
      g.appendChild(path);
    });
    g.appendChild(s("text", { x: M.left + 4, y: M.top + 10, class: "lg-tick", text: `fraction of finite elements, ${bins} common bins` }));
  }

  _itemAt(e) {
    const L = this.layout;
    if (!L || !L.items.length) return null;
    const r = this.svg.getBoundingClientRect();
    const py = e.clientY - r.top;
    if (L.mode === "offset" && L.bases) {
      // The ridge whose baseline is the first at or below the pointer.
      let k = L.bases.findIndex((b) => b >= py - 2);
      if (k < 0) k = L.bases.length - 1;
      return L.items[k];
    }
    const cur = L.items.find((it) => it.key === this.data.current);
    return cur || L.items[L.items.length - 1];
  }

  _hover(e) {
    const L = this.layout;
    if (!L) return;
    const r = this.svg.getBoundingClientRect();
    if (L.mode === "aligned") {
      this._hoverAligned(e, L.x.invert(e.clientX - r.left), e.clientY - r.top);
      return;
    }
    const it = this._itemAt(e);
    if (!it) return;
    const k = L.items.indexOf(it);
    const xv = (L.xs && L.xs[k] ? L.xs[k] : L.x).invert(e.clientX - r.left); // the ridge's own scale, per step
    const bucket = it.buckets.find((b, k) => (xv >= b[0] && xv < b[1]) || (k === it.buckets.length - 1 && xv >= b[0] && xv <= b[1]));
    const rows = [["elements", fmtNum(total(it.buckets))]];
    if (bucket) rows.push([`[${fmtNum(bucket[0])}, ${fmtNum(bucket[1])})`, fmtNum(bucket[2])]);
    rows.push(["range", `${fmtNum(it.buckets[0][0])} … ${fmtNum(it.buckets[it.buckets.length - 1][1])}`]);
    tooltip().show(e.clientX, e.clientY, it.label, rows, this.opts.onPick ? "click: go to this step" : "");
  }

  /** The runs' fractions in the bin under the pointer; the outline nearest it (within HOVER_PX) is hovered. */
  _hoverAligned(e, xv, py) {
    const { e: ed, fractions, y } = this.layout.aligned;
    const b = Math.max(0, Math.min(ed.length - 2, Math.floor(((xv - ed[0]) / (ed[ed.length - 1] - ed[0])) * (ed.length - 1))));
    let rows = this.layout.items.map((it, k) => ({ it, row: [it.label, fmtPercent(fractions[k][b])], away: Math.abs(y(fractions[k][b]) - py) }));
    const near = rows.reduce((a, q) => (q.away < (a ? a.away : HOVER_PX) ? q : a), null);
    this._hoverKey(near ? near.it.key : null);
    let more = "";
    if (rows.length > MANY) {
      const all = rows.length;
      rows = rows.slice().sort((a, q) => a.away - q.away).slice(0, MANY);
      more = `and ${all - rows.length} more: move closer to an outline`;
    }
    const shown = rows.map((q) => (q === near ? [...q.row, "lg-tooltip-hi"] : q.row));
    tooltip().show(e.clientX, e.clientY, `[${fmtNum(ed[b])}, ${fmtNum(ed[b + 1])})`, shown, more);
  }
}
