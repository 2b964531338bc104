// Gradient flow overview: layers (rows, model order) x steps (columns) of one run,
// colour = log10 of a statistic, anomalies marked, hover for exact values, click
// for the layer's detail at that step.

import { api, isAbort, isTransient } from "../api.js";
import { dominatedRule, findingsOf, firstNonfinite, flagNames, flagOf, fromRoute, isOrigin, stateChip, FLAG } from "../anomalies.js";
import { pointsFor, rangeOf, stepOfBin, stepsOfColumns, zoomBar } from "../bins.js";
import { indexAtOrBefore, logTicks, niceTicks } from "../charts/scale.js";
import { COLORS, VIRIDIS, lutIndex, packHex } from "../charts/colors.js";
import { Heatmap } from "../charts/heatmap.js";
import { tooltip } from "../charts/tooltip.js";
import { h, s, clear, replace, select, setOptions } from "../dom.js";
import { capitalize, commonPrefix, EXAMPLE_STATS, fmtNum, fmtPercent, MAGNITUDE_STATS, statLabel } from "../format.js";
import { anyExamples, findRun, hasActivations, hasExamples, valuesOf } from "../model.js";
import { errorBox, field, note, Toggle } from "./common.js";
import { NoiseScalePanel } from "./noise_panel.js";
import { markOrigin, verdictWhy } from "./verdict.js";

const RED = packHex(COLORS.nonfinite);
const ZERO = packHex(COLORS.zero);
const MISSING = packHex(COLORS.missing);
const CHIP_W = 168;
// Loaded with the colour statistic: the tooltip shows them, `nonfinite` paints cells red.
// The anomaly flags come from the `anomalies` route (the rules are tb_layergrad/reader/anomalies.py).
const HOVER_STATS = ["norm", "rms", "nonfinite", "zero_frac"];

export class OverviewView {
  constructor(app) {
    this.app = app;
    this.data = null; // {key, layers, steps, m: {stat: rows}, an: the `anomalies` answer}
    this.abort = null;
    this.statSelect = select(MAGNITUDE_STATS.map((x) => [x, statLabel(x)]), "norm", (v) => app.setState({ stat: v }), { "aria-label": "statistic" });
    this.marks = h("input", { type: "checkbox", checked: true, on: { change: () => this.draw() } });
    // Colour by the gradients (of the target and source picked) or by the forward values (activations).
    this.ofToggle = new Toggle([["gradient", "gradients"], ["activation", "activations"]], "gradient", (v) => app.setState({ of: v }), "values");
    this.ofField = field("Values", this.ofToggle.el);
    this.ofField.title = "colour by a statistic of the gradients, or of the layers' outputs themselves (recorded activations)";
    this.csv = h("a", { class: "lg-button", download: "", text: "Download CSV", title: "every statistic of every layer of this run (the plugin's csv route)" });
    this.toolbar = h(
      "div",
      { class: "lg-toolbar" },
      app.runControls(),
      this.ofField,
      field("Colour", this.statSelect),
      h("label", { class: "lg-check" }, this.marks, h("span", { text: "mark anomalies" })),
      h("span", { class: "lg-spacer" }),
      this.csv,
    );
    this.summary = h("div", { class: "lg-summary" });
    this.message = h("div", { class: "lg-messages" });
    this.legend = h("div", { class: "lg-heat-legend" });
    this.labels = h("div", { class: "lg-row-labels", role: "list", "aria-label": "layers in model order" });
    this.chips = h("div", { class: "lg-row-chips" });
    this.plot = h("div", { class: "lg-heat-plot" });
    this.axis = s("svg", { class: "lg-step-axis" });
    this.heatmap = new Heatmap(this.plot, {
      label: "gradient flow heatmap: layers by steps",
      onHover: (c) => this._hover(c),
      onLeave: () => tooltip().hide(),
      onClick: (c) => this._open(c.i, c.j),
      onSelect: ({ j0, j1 }) => this._zoom(j0, j1),
    });
    this.plot.appendChild(this.axis);
    this.grid = h("div", { class: "lg-heat-grid" }, this.labels, this.plot, this.chips);
    this.zoomBox = h("div", { class: "lg-zoom" });
    // The run's gradient noise scale, when it was recorded.
    this.noise = new NoiseScalePanel();
    this.el = h("section", { class: "lg-view lg-overview", dataset: { view: "overview" } }, this.toolbar, this.message, this.summary, this.zoomBox, this.legend, this.grid, this.noise.el);
    this._resize = new ResizeObserver(() => {
      if (this.data && this.el.clientWidth !== this._width) this.draw();
    });
    this._resize.observe(this.el);
  }

  _wanted(state) {
    return [...new Set([this._stat(state), ...HOVER_STATS])];
  }

  /** The run, if it may have the noise-scale scalars (written with per-example records only): a run without
   * them asks nothing more than before. */
  _noiseRuns(state) {
    return state.run && anyExamples(findRun(this.app.runs, state.run)) ? [state.run] : [];
  }

  /** The colour statistics the run offers: the per-example ones only when it has such records. */
  _stats(state) {
    const of = this._of(state);
    const ex = of !== "activation" && hasExamples(findRun(this.app.runs, state.run), state.target, state.source);
    return ex ? [...MAGNITUDE_STATS, ...EXAMPLE_STATS] : MAGNITUDE_STATS;
  }

  /** The colour asked for, or the default when this run cannot show it (a link from a run with examples). */
  _stat(state) {
    return this._stats(state).includes(state.stat) || !EXAMPLE_STATS.includes(state.stat) ? state.stat : "norm";
  }

  _key(state) {
    return JSON.stringify([state.run, state.target, state.source, this._of(state), state.zoom]);
  }

  /** The heatmap's width in CSS pixels (as `draw` lays it out), for `points`. */
  _plotWidth() {
    return this._lastPlotWidth || Math.max(120, (this.el.clientWidth || 900) - 300);
  }

  /** Zoom to the steps of columns j0..j1 (a drag across the heatmap): refetched at full resolution when few enough. */
  _zoom(j0, j1) {
    const d = this.data;
    if (!d || !d.steps.length) return;
    tooltip().hide();
    const [a, b] = stepsOfColumns(d.bins || d, j0, j1);
    if (a === undefined || b === undefined) return;
    this.app.setState({ zoom: [a, b], step: null });
  }

  /** "activation" when the run has forward values and they are asked for, else "gradient". */
  _of(state) {
    return state.of === "activation" && hasActivations(findRun(this.app.runs, state.run)) ? "activation" : "gradient";
  }

  /** Called whenever the state changes while this view is shown. */
  async show(state) {
    this.state = state;
    setOptions(this.statSelect, this._stats(state).map((x) => [x, statLabel(x)]), this._stat(state));
    this.noise.show(this._noiseRuns(state));
    // Offered once any run has activations; for a run without them, disabled with the reason.
    this.ofField.hidden = !this.app.runs.runs.some(hasActivations);
    const mine = hasActivations(findRun(this.app.runs, state.run));
    this.ofToggle.disable("activation", mine ? null : `Nothing to show: run '${state.run}' recorded no activations (GradientLogger(activations=True) records them)`);
    this.ofToggle.set(this._of(state));
    this.csv.href = api.csvUrl({ run: state.run, target: state.target, source: state.source });
    this.csv.setAttribute("download", `layergrad-${state.run}.csv`);
    const key = this._key(state);
    const missing = this._wanted(state).filter((x) => !(this.data && this.data.key === key && this.data.m[x]));
    if (this.data && this.data.key === key && !missing.length) {
      this.draw();
      return;
    }
    await this._load(state, this.data && this.data.key === key && !this.data.bins ? missing : this._wanted(state), false);
  }

  /** Poll: fetch the steps from the last one known on (the last may have been partial). */
  async refresh() {
    if (this.abort) return; // a load is under way: it brings the new data too
    this.state = this.app.resolved();
    const state = this.state;
    if (!this.data || this.data.key !== this._key(state)) return this.show(state);
    // Binned or zoomed: the bins move as the run grows, so ask for the whole picture again (it is small).
    if (this.data.bins || state.zoom) this.data.refetch = true;
    this.noise.show(this._noiseRuns(state));
    await this._load(state, Object.keys(this.data.m), !(this.data.bins || state.zoom));
  }

  async _load(state, stats, incremental) {
    if (!state.run) return;
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    const key = this._key(state);
    const start = incremental && this.data.steps.length ? this.data.steps[this.data.steps.length - 1] : undefined;
    const quiet = incremental || Boolean(this.data && this.data.refetch);
    if (!quiet) this.app.busy(true);
    // One bin per pixel of the heatmap (docs/HTTP_API.md, "Binned answers"); a zoom narrows the range.
    const window_ = start !== undefined ? { start } : { ...rangeOf(state.zoom), points: pointsFor(this._plotWidth()) };
    try {
      // The flags depend on the whole run (a layer's baseline is its first steps): always asked for in full.
      // They, and where the run broke (`summary.origin`), are of the gradients, whichever values colour the cells.
      const values = this._of(state) === "activation" ? valuesOf({ of: "activation" }) : { target: state.target, source: state.source };
      let [bodies, an] = await Promise.all([
        Promise.all(stats.map((stat) => api.matrix({ run: state.run, ...values, stat, ...window_ }, { signal: abort.signal }))),
        api.anomalies({ run: state.run, target: state.target, source: state.source }, { signal: abort.signal }),
      ]);
      if (abort.signal.aborted) return;
      // The layers and bins of a statistics answer; a per-example one is put on its rows by layer name.
      const ref = bodies[stats.findIndex((x) => !EXAMPLE_STATS.includes(x))] || bodies[0];
      bodies = bodies.map((b) => onLayers(b, ref.layers));
      const layers = ref.layers;
      const sameLayers = this.data && this.data.key === key && JSON.stringify(this.data.layers) === JSON.stringify(layers);
      if (incremental && !sameLayers) {
        // A layer appeared: start over with every step.
        this.data = null;
        return await this._load(state, this._wanted(state), false);
      }
      const binned = ref.binned === true;
      const fresh = !(this.data && this.data.key === key && sameLayers) || binned || Boolean(this.data.bins);
      if (fresh) this.data = { key, layers, steps: [], m: {}, bins: binned ? ref : null };
      if (!merge(this.data, stats, bodies.map(asColumns), start)) {
        this.data = null;
        return await this._load(state, this._wanted(state), false);
      }
      this.data.an = an;
      this.data.refetch = false;
      this.data.version = (this.data.version || 0) + 1;
      this.retryOnPoll = false;
      clear(this.message);
      this.draw();
    } catch (e) {
      if (isAbort(e)) return;
      this.retryOnPoll = isTransient(e);
      if (!quiet) {
        this.data = null;
        this._clearPlot();
      }
      replace(this.message, errorBox(e, `the gradient-flow matrix of run '${state.run}'`, { retry: this.app.retry }));
    } finally {
      if (this.abort === abort) this.abort = null;
      if (!quiet) this.app.busy(false);
    }
  }

  _clearPlot() {
    clear(this.labels);
    clear(this.chips);
    clear(this.summary);
    clear(this.legend);
    clear(this.axis);
    this.heatmap.draw({ rows: 0, cols: 0, width: 1, rowHeight: 1, cell: () => 0 });
  }

  /** Redraw from the loaded data (no fetching). */
  draw() {
    const d = this.data;
    const state = this.state;
    if (!d) return;
    this._width = this.el.clientWidth;
    const stat = d.m[state.stat] ? state.stat : Object.keys(d.m)[0];
    const rows = d.layers.length;
    const cols = d.steps.length;
    if (!rows) {
      this._clearPlot();
      replace(this.message, note(this._of(state) === "activation" ? `Run '${state.run}' has no activation statistics.` : `Run '${state.run}' has no ${state.source} statistics for target '${state.target}'.`));
      return;
    }
    const values = d.m[stat];
    const nonfinite = d.m.nonfinite;
    if (this._anFor !== d || this._anVersion !== d.version) {
      // Gradient flags go on gradient cells only: coloured by activations, the grid shows none.
      this.anomalies = fromRoute(this._of(state) === "activation" ? null : d.an, d.layers, d.steps);
      if (d.bins) onBins(this.anomalies, d, this._of(state) === "activation" ? null : d.an);
      this._anFor = d;
      this._anVersion = d.version;
    }
    const an = this.anomalies;
    const showMarks = this.marks.checked;

    // Colour scale: log10 of the positive finite values.
    let lo = Infinity;
    let hi = -Infinity;
    for (const row of values) for (const v of row) if (v > 0 && Number.isFinite(v)) {
      const l = Math.log10(v);
      if (l < lo) lo = l;
      if (l > hi) hi = l;
    }
    if (!(lo <= hi)) {
      lo = 0;
      hi = 1;
    }
    if (hi - lo < 1e-9) {
      lo -= 0.5;
      hi += 0.5;
    }
    const span = hi - lo;
    const redOverride = stat !== "nonfinite";
    const colorOf = (v) => (v === null || v === undefined ? MISSING : v === 0 ? ZERO : v > 0 ? VIRIDIS.packed[lutIndex((Math.log10(v) - lo) / span)] : MISSING);
    const cell = (i, j) => (redOverride && nonfinite[i][j] > 0 ? RED : colorOf(values[i][j]));
    const bin = (i, j0, j1) => {
      let best = null;
      let any = false;
      for (let j = j0; j < j1; j++) {
        if (redOverride && nonfinite[i][j] > 0) return RED;
        const v = values[i][j];
        if (v === null || v === undefined) continue;
        any = true;
        if (best === null || v > best) best = v;
      }
      return any ? colorOf(best) : MISSING;
    };
    const pick = (i, j0, j1) => {
      let bestJ = j0;
      let best = -Infinity;
      for (let j = j0; j < j1; j++) {
        if (nonfinite[i][j] > 0) return j;
        const v = values[i][j];
        if (v !== null && v > best) {
          best = v;
          bestJ = j;
        }
      }
      return bestJ;
    };

    // Layout: labels | heatmap | chips.
    const prefix = commonPrefix(d.layers);
    const names = d.layers.map((l) => l.slice(prefix.length));
    const labelW = Math.max(90, Math.min(280, 24 + 7.2 * Math.max(...names.map((n) => n.length))));
    const avail = this.el.clientWidth || 900;
    const anyChip = an.layers.some((l) => (l.verdict && stateChip(l.verdict.state)) || l.dominated);
    const chipW = anyChip ? CHIP_W : 12;
    const width = Math.max(120, avail - labelW - chipW - 24);
    this._lastPlotWidth = width;
    replace(this.zoomBox, zoomBar(state.zoom, d.bins ? `${cols} bins of ${d.bins.counts.reduce((a, b) => a + b, 0)} steps (one per pixel: each bin's largest value, red if any step in it is non-finite)` : "", () => this.app.setState({ zoom: null, step: null })));
    const rowH = Math.max(3, Math.min(22, Math.floor(560 / rows)));
    this.geom = { rowH, labelW, prefix, names, stat, lo, hi };
    this.grid.style.gridTemplateColumns = `${labelW}px ${width}px ${chipW}px`;

    const first = firstNonfinite(an);
    this.heatmap.draw({
      rows,
      cols,
      width,
      rowHeight: rowH,
      cell,
      bin,
      pick,
      selected: {},
      decorate: (ctx, g) => this._decorate(ctx, g, an, first, showMarks),
    });
    this._labels(names, rowH);
    this._chips(an, rowH);
    this._axis(width, first);
    this._legend(stat, lo, hi, showMarks, an.info);
    this._summary(an);
  }

  _decorate(ctx, g, an, first, showMarks) {
    const { rows, cols } = g;
    // Rings around the first non-finite cell of each layer (always, at least 5 px), outside a narrow cell
    // so that a one-pixel column (a bin of a long run) stays red inside it.
    ctx.lineWidth = 2;
    for (let i = 0; i < rows; i++) {
      const j = an.layers[i].firstNonfinite;
      if (j === null) continue;
      const w = g.colWidth < 5 ? g.colWidth + 4 : g.colWidth;
      const hgt = Math.max(5, g.rowHeight);
      const x = g.x(j) + g.colWidth / 2 - w / 2;
      const y = g.y(i) + g.rowHeight / 2 - hgt / 2;
      ctx.strokeStyle = "#000";
      ctx.strokeRect(x + 1, y + 1, w - 2, hgt - 2);
    }
    // The cell where the run's first NaN/Inf was born (the route's verdict `nan_origin`): a thick red ring
    // with a white halo, on its own row even when that row's gradient stayed finite (a backward-pass origin).
    for (let i = 0; i < rows; i++) {
      const v = an.layers[i].verdict;
      const j = isOrigin(v) ? this._column(v.step) : null;
      if (j === null) continue;
      const w = Math.max(9, g.colWidth + 4);
      const hgt = Math.max(9, g.rowHeight + 2);
      const x = g.x(j) + g.colWidth / 2 - w / 2;
      const y = g.y(i) + g.rowHeight / 2 - hgt / 2;
      ctx.lineWidth = 4;
      ctx.strokeStyle = "#fff";
      ctx.strokeRect(x, y, w, hgt);
      ctx.lineWidth = 2;
      ctx.strokeStyle = COLORS.nonfinite;
      ctx.strokeRect(x, y, w, hgt);
    }
    if (!showMarks || g.rowHeight < 6) return;
    // A bar along the bottom of each run of flagged cells: the row reads "vanishing from here to there".
    const barH = Math.max(2, Math.round(g.rowHeight * 0.2));
    const colorOf = (f) => (f & FLAG.EXPLODING ? COLORS.exploding : f & FLAG.DEAD ? "#263238" : f & FLAG.VANISHING ? COLORS.vanishing : null);
    const px = Math.max(1, Math.round(g.width));
    const perPx = g.binned ? cols / px : 1;
    const n = g.binned ? px : cols;
    for (let i = 0; i < rows; i++) {
      let runStart = 0;
      let runColor = null;
      const y = g.y(i) + g.rowHeight - barH;
      for (let k = 0; k <= n; k++) {
        let color = null;
        if (k < n) {
          let f = 0;
          const j0 = Math.floor(k * perPx);
          const j1 = g.binned ? Math.max(j0 + 1, Math.floor((k + 1) * perPx)) : j0 + 1;
          for (let j = j0; j < j1; j++) f |= an.flags[i * cols + j];
          if (!(f & FLAG.NONFINITE)) color = colorOf(f);
        }
        if (color !== runColor) {
          if (runColor) {
            const x0 = g.binned ? runStart : g.x(runStart);
            const x1 = g.binned ? k : g.x(k);
            ctx.fillStyle = runColor;
            ctx.fillRect(x0, y, x1 - x0, barH);
          }
          runColor = color;
          runStart = k;
        }
      }
    }
  }

  /** The grid column holding `step` (its bin when binned; else the first logged step at or after it), or null. */
  _column(step) {
    const d = this.data;
    if (step === null || step === undefined) return null;
    if (d.bins) {
      const j = indexAtOrBefore(d.bins.steps, step);
      return j >= 0 && d.bins.last_steps[j] >= step ? j : null;
    }
    const j = d.steps.findIndex((x) => x >= step);
    return j >= 0 ? j : null;
  }

  _labels(names, rowH) {
    const d = this.data;
    // Rows under 13 px cannot hold text: then labels float over their row, one every `every` rows.
    const dense = rowH < 13;
    const every = dense ? Math.ceil(14 / rowH) : 1;
    this.labels.classList.toggle("lg-dense", dense);
    this.labels.style.height = `${rowH * names.length}px`;
    const items = names.map((name, i) => {
      const full = d.layers[i];
      const el = h("div", {
        class: "lg-row-label",
        role: "listitem",
        title: `${full} — click for the layer's detail`,
        dataset: { layer: full, row: i },
        style: dense ? { top: `${(i + 0.5) * rowH - 7}px` } : { height: `${rowH}px`, "line-height": `${rowH}px` },
        on: { click: () => this._open(i, null) },
      });
      el.textContent = name;
      if (i % every !== 0) el.hidden = true;
      // The route's verdict of the layer (tb_layergrad/reader/verdict.py), as the chips, banners and report say.
      const v = this.anomalies.layers[i].verdict;
      const kind = v && (v.now || v.state === "nan_origin") ? stateChip(v.state) : null;
      if (kind) el.classList.add(`lg-flag-${kind}`);
      if (v) el.dataset.state = v.state;
      if (isOrigin(v)) {
        el.style.fontWeight = "700";
        el.title = `${full} — the first NaN/Inf was born here (step ${v.step}) — click for the layer's detail`;
      }
      return el;
    });
    replace(this.labels, items);
  }

  _chips(an, rowH) {
    const d = this.data;
    const dense = rowH < 12;
    this.chips.classList.toggle("lg-dense", dense);
    this.chips.style.height = `${rowH * an.layers.length}px`;
    const items = [];
    an.layers.forEach((f, i) => {
      const chips = [];
      const n = Math.max(1, f.recorded);
      // One chip for the layer's verdict (the route decides it; its text is the report's `verdict` column).
      const v = f.verdict;
      const kind = v ? stateChip(v.state) : null;
      if (kind) {
        const why = verdictWhy(v, { counts: f.count, recorded: n, thresholds: an.thresholds, originLine: (d.an.summary.origin || {}).line });
        chips.push([kind, v.text, why, null, v.state]);
      }
      const dom = f.dominated;
      if (dom) chips.push(["dominated", `1 example ${Math.round(100 * dom.worst_share)}% @${dom.worst_step}`, `${dom.line}: ${dominatedRule(d.an)} — click: this layer at step ${dom.worst_step}`, dom]);
      if (dense) {
        // One thin bar per flagged row, in the colour of its most serious flag.
        if (chips.length) {
          items.push(h("span", {
            class: `lg-row-bar lg-chip-${chips[0][0]}`,
            title: `${d.layers[i]}\n${chips.map((c) => c[2]).join("\n")}`,
            dataset: { row: i },
            style: { top: `${i * rowH}px`, height: `${Math.max(2, rowH)}px` },
          }));
        }
        return;
      }
      const row = h("div", { class: "lg-row-chip", style: { height: `${rowH}px` }, dataset: { row: i } });
      // At most two chips; "dominated" (not a flag of the cells) goes last and keeps its place.
      const shown = chips.length > 2 && chips[chips.length - 1][0] === "dominated" ? [chips[0], chips[chips.length - 1]] : chips.slice(0, 2);
      for (const [kind, text, title, dom, state] of shown) {
        const open = dom ? { click: () => this._openStep(dom.layer, dom.worst_step) } : null;
        const chip = h("span", { class: `lg-chip lg-chip-${kind}${dom ? " lg-chip-link" : ""}`, text, title, dataset: dom ? { layer: dom.layer, step: dom.worst_step } : { state }, on: open });
        if (state === "nan_origin") markOrigin(chip); // born here, not merely reached
        row.appendChild(chip);
      }
      items.push(row);
    });
    replace(this.chips, items);
  }

  _axis(width, first) {
    const d = this.data;
    const svg = this.axis;
    clear(svg);
    const H = 30;
    svg.setAttribute("width", width);
    svg.setAttribute("height", H);
    const cols = d.steps.length;
    if (!cols) return;
    const colW = width / cols;
    // Round steps (4 to 6 of them) where they fall: inside a bin's steps, or between two logged steps.
    const last = d.bins ? d.bins.last_steps : d.steps;
    const ticks = niceTicks(d.steps[0], last[cols - 1], { integer: true, max: Math.min(6, Math.max(2, Math.floor(width / 70))) });
    // The first non-finite step is labelled too (in red, under its mark); round ticks too close to it give way.
    const firstX = first && first.col !== null ? (first.col + 0.5) * colW : null;
    if (firstX !== null) svg.appendChild(s("text", { x: firstX, y: 15, "text-anchor": "middle", class: "lg-tick lg-tick-nonfinite", text: fmtNum(first.step) }));
    for (const step of ticks) {
      const j = indexAtOrBefore(d.steps, step);
      if (j < 0) continue;
      const next = j + 1 < cols ? d.steps[j + 1] : d.steps[j] + 1;
      const frac = d.bins ? (step - d.steps[j] + 0.5) / (last[j] - d.steps[j] + 1) : 0.5 + (step - d.steps[j]) / (next - d.steps[j]);
      const x = (j + frac) * colW;
      if (firstX !== null && Math.abs(x - firstX) < 30) continue;
      const anchor = x < 20 ? "start" : x > width - 20 ? "end" : "middle";
      svg.appendChild(s("line", { x1: x, x2: x, y1: 0, y2: 4, class: "lg-tickmark" }));
      svg.appendChild(s("text", { x, y: 15, "text-anchor": anchor, class: "lg-tick lg-xtick", text: fmtNum(step) }));
    }
    const what = d.bins ? `${cols} bins` : `${cols} logged`;
    svg.appendChild(s("text", { x: width, y: H - 2, "text-anchor": "end", class: "lg-axis-label", text: `step (${what}${cols > width ? `; a pixel column shows the largest value of ${(cols / width).toFixed(1)} steps` : ""})` }));
    if (first && first.col !== null) {
      const x = (first.col + 0.5) * colW;
      const m = s("path", { d: `M${x},0 l5,8 l-10,0 z`, fill: COLORS.nonfinite, class: "lg-xmark" });
      m.appendChild(s("title", { text: `first non-finite gradient: step ${first.step}` }));
      svg.appendChild(m);
    }
  }

  _legend(stat, lo, hi, showMarks, info) {
    const W = 220;
    const bar = h("canvas", { width: W, height: 10, class: "lg-colorbar" });
    const ctx = bar.getContext("2d");
    for (let x = 0; x < W; x++) {
      ctx.fillStyle = VIRIDIS.css[lutIndex(x / (W - 1))];
      ctx.fillRect(x, 0, 1, 10);
    }
    const ticks = h("div", { class: "lg-colorbar-ticks", style: { width: `${W}px` } });
    // Round values of the log10 range, as many as fit apart (labels are centred on their value; the bar has
    // room on both sides for half a label, so that none reaches the title or the swatches beside it).
    const at = (l, text) => ticks.appendChild(h("span", { class: "lg-colorbar-tick", style: { left: `${((l - lo) / (hi - lo || 1)) * 100}%` }, text }));
    const px = (v) => ((Math.log10(v) - lo) / (hi - lo || 1)) * W;
    let shown = [];
    for (let max = 5; max >= 2 && !shown.length; max--) {
      const vs = logTicks(Math.pow(10, lo), Math.pow(10, hi), { min: 2, max });
      if (vs.every((v, k) => k === 0 || px(v) - px(vs[k - 1]) >= 48)) shown = vs;
    }
    for (const v of shown) at(Math.log10(v), fmtNum(v));
    if (!shown.length) {
      // A range too narrow for two round values far enough apart: its two ends, each inside the bar.
      ticks.appendChild(h("span", { class: "lg-colorbar-tick lg-colorbar-start", text: fmtNum(Math.pow(10, lo)) }));
      ticks.appendChild(h("span", { class: "lg-colorbar-tick lg-colorbar-end", text: fmtNum(Math.pow(10, hi)) }));
    }
    const swatch = (color, text, title) => h("span", { class: "lg-legend-item", title }, h("span", { class: "lg-swatch", style: { background: color } }), h("span", { text }));
    const glyph = (cls, text, title) => h("span", { class: "lg-legend-item", title }, h("span", { class: `lg-bar ${cls}` }), h("span", { text }));
    replace(
      this.legend,
      h("span", { class: "lg-legend-title", text: `${this._of(this.state) === "activation" ? "activation " : ""}${statLabel(stat)} (log10 colour)` }),
      h("span", { class: "lg-colorbar-wrap" }, bar, ticks),
      swatch(COLORS.zero, "0", "exactly zero (e.g. no gradient reaches the layer)"),
      swatch(COLORS.missing, "no record", "nothing logged for this layer at this step"),
      stat !== "nonfinite" ? swatch(COLORS.nonfinite, "NaN/Inf", "the gradient holds NaN or ±Inf at this step; a black box marks each layer's first, a red ring the cell where the first NaN/Inf was born") : null,
      showMarks ? glyph("lg-bar-vanishing", "vanishing", info[2].rule) : null,
      showMarks ? glyph("lg-bar-exploding", "exploding", info[1].rule) : null,
      showMarks ? glyph("lg-bar-dead", "dead", info[3].rule) : null,
    );
  }

  _summary(an) {
    const d = this.data;
    const state = this.state;
    const cols = d.steps.length;
    const parts = [];
    const head = h(
      "div",
      { class: "lg-summary-head" },
      h("span", { class: "lg-run-name", text: state.run }),
      h("span", { class: "lg-muted", text: ` · ${d.layers.length} layers × ${d.bins ? `${d.bins.counts.reduce((a, b) => a + b, 0)} steps in ${cols} bins` : `${cols} steps`}` + (cols ? ` (${d.steps[0]}–${(d.bins ? d.bins.last_steps : d.steps)[cols - 1]})` : "") + (this.geom.prefix ? ` · model ${this.geom.prefix.slice(0, -1)}` : "") }),
    );
    parts.push(head);
    // The route's findings (tb_layergrad/reader/verdict.py): one line each however many layers it spans, the
    // same lines as `tb-layergrad report`; inserted as text (names come from user code). A click opens the
    // layer and step it names.
    const origin = d.an && d.an.summary ? d.an.summary.origin : null;
    for (const f of findingsOf(d.an)) {
      const cls = f.kind === "dominated" ? "lg-alert-dominated" : f.kind === "nonfinite" ? `lg-alert-nonfinite${origin && origin.pass ? " lg-origin" : ""}` : `lg-alert-${f.kind}`;
      const dataset = { kind: f.kind, layer: f.layer ?? "", step: f.step ?? "", layers: String(f.layers.length) };
      if (f.kind === "nonfinite" && origin && origin.pass) Object.assign(dataset, { pass: origin.pass, origin: origin.origin ?? "" });
      const open = f.layer && d.layers.includes(f.layer);
      const link = h("button", {
        type: "button",
        class: `lg-alert ${cls}`,
        title: f.kind === "dominated" ? `${dominatedRule(d.an)}\nopen ${f.layer} at step ${f.step}` : open ? `open ${f.layer} at step ${f.step}` : "",
        dataset,
        on: { click: () => (open ? this._openStep(f.layer, f.step) : null) },
      });
      link.textContent = `${capitalize(f.line)}${open ? " →" : ""}`;
      parts.push(link);
    }
    const last = cols - 1;
    const lastStep = d.an && d.an.summary && d.an.summary.last_step !== null ? d.an.summary.last_step : (d.bins ? d.bins.last_steps : d.steps)[last];
    // How many layers are flagged at the run's latest step: the route's `summary.latest`, as the report says it.
    const latest = (d.an && d.an.summary && d.an.summary.latest) || {};
    const counts = { "non-finite": latest.nonfinite || 0, vanishing: latest.vanishing || 0, exploding: latest.exploding || 0, dead: latest.dead || 0, "vanishing through time": latest.vanishing_through_time || 0 };
    const bits = Object.entries(counts).filter(([, c]) => c).map(([k, c]) => `${c} ${k}`);
    const health = h("span", { class: bits.length ? "lg-health lg-health-bad" : "lg-health lg-health-ok" });
    health.textContent = cols
      ? bits.length
        ? `At the latest step (${lastStep}): ${bits.join(", ")} of ${d.layers.length} layers.`
        : `At the latest step (${lastStep}): no non-finite, vanishing, exploding or dead layer.`
      : "No steps logged yet.";
    health.title = an.info.map((x) => `${x.label}: ${x.rule}`).join("\n");
    if (this._of(state) === "activation") {
      health.className = "lg-health";
      health.textContent = "Coloured by the layers' outputs (activations); the anomaly flags are the gradients': pick Values: gradients.";
    }
    parts.push(health);
    replace(this.summary, parts);
  }

  /** The layer view of `layer` at `step` (a step, not a column: it holds in a binned matrix too). */
  _openStep(layer, step) {
    tooltip().hide();
    this.app.setState({ view: "layer", layer, step, series: null });
  }

  _hover(c) {
    const d = this.data;
    if (!d) return;
    const { i, j, j0, j1 } = c;
    const stat = this.geom.stat;
    const m = d.m;
    const rows = [["step", j1 - j0 > 1 ? `${d.steps[j]} (this pixel: steps ${d.steps[j0]}–${d.steps[j1 - 1]})` : String(d.steps[j])]];
    let action = "click: this layer at this step";
    if (d.bins) {
      const open = stepOfBin(d.bins, i, j);
      const b = d.bins;
      rows[0] = ["steps", `${b.steps[j]}–${b.last_steps[j]} (${b.counts[j]} steps in this bin)`];
      rows.push([`${statLabel(b.stat || stat)} min–max`, `${fmtNum(b.min[i][j])} – ${fmtNum(b.max[i][j])}`]);
      action = `click: this layer at step ${open.step} (${open.why})`;
    }
    rows.push([statLabel(stat), fmtNum(m[stat][i][j])]);
    for (const x of ["norm", "rms", "mean_abs", "std"]) if (x !== stat && m[x]) rows.push([statLabel(x), fmtNum(m[x][i][j])]);
    if (m.zero_frac) rows.push(["zero fraction", fmtPercent(m.zero_frac[i][j])]);
    if (m.nonfinite) rows.push(["non-finite", fmtNum(m.nonfinite[i][j])]);
    const f = this.anomalies.flags[i * d.steps.length + j];
    const flags = flagNames(f);
    if (flags.length) rows.push(["anomaly", flags.join(", "), "lg-tip-bad"]);
    if (f & FLAG.VANISHING && m.rms) rows.push(["vs. largest", `${fmtNum(m.rms[i][j] / this.anomalies.maxRms[j])} × (threshold ${this.anomalies.thresholds.VANISH_REL})`]);
    tooltip().show(c.clientX, c.clientY, d.layers[i], rows, action);
  }

  _open(i, j) {
    const d = this.data;
    tooltip().hide();
    // A bin opens its first non-finite (else anomalous, else first) step, as its tooltip says.
    const step = j === null ? null : d.bins ? stepOfBin(d.bins, i, j).step : d.steps[j];
    this.app.setState({ view: "layer", layer: d.layers[i], step, series: null });
  }

  onKey() {
    return false;
  }
}

/**
 * Put matrix answers (for `stats`, fetched from step `start` on) into `data`.
 * False when they do not line up with what `data` holds (then reload everything).
 */
function merge(data, stats, bodies, start) {
  const steps = [...new Set(bodies.flatMap((b) => b.steps))].sort((a, b) => a - b);
  // Columns kept from before: those before `start`.
  let keep = data.steps.length;
  if (start !== undefined) {
    keep = data.steps.findIndex((x) => x >= start);
    if (keep < 0) keep = data.steps.length;
  }
  const oldSteps = data.steps.slice(0, keep);
  const rowsN = data.layers.length;
  // Stats held from before and not fetched now must have exactly these steps.
  const others = Object.keys(data.m).filter((name) => !stats.includes(name));
  if (others.length && (start !== undefined || JSON.stringify(data.steps) !== JSON.stringify(steps))) return false;
  stats.forEach((stat, k) => {
    const b = bodies[k];
    const pos = new Map(b.steps.map((x, n) => [x, n]));
    const old = data.m[stat] && start !== undefined ? data.m[stat] : null;
    const rows = new Array(rowsN);
    for (let i = 0; i < rowsN; i++) {
      const src = b.values[i] || [];
      const row = old ? old[i].slice(0, keep) : [];
      for (const x of steps) {
        const n = pos.get(x);
        row.push(n === undefined ? null : src[n]);
      }
      rows[i] = row;
    }
    data.m[stat] = rows;
  });
  data.steps = start !== undefined ? oldSteps.concat(steps) : steps;
  return true;
}

/** A matrix answer with its rows in the order of `layers` (empty for a layer it lacks): a per-example
 * answer lists the layers with such records, which a statistics answer's rows need not all be. */
function onLayers(body, layers) {
  if (JSON.stringify(body.layers) === JSON.stringify(layers)) return body;
  const at = new Map(body.layers.map((l, i) => [l, i]));
  const rows = (values) => layers.map((l) => (at.has(l) && values ? values[at.get(l)] : []));
  return { ...body, layers, values: rows(body.values), ...(body.binned ? { max: rows(body.max), min: rows(body.min) } : {}) };
}

/** A binned matrix answer in the shape `merge` takes: a column per bin, its largest value. */
function asColumns(body) {
  return body.binned ? { ...body, values: body.max } : body;
}

/**
 * Put the flags of a binned matrix (each bin's flags ORed, computed by the route on the whole run) on the
 * grid, and find each layer's first non-finite and latest columns among the bins.
 */
function onBins(an, d, route) {
  const b = d.bins;
  const cols = b.steps.length;
  if (!route) return;
  b.flags.forEach((text, i) => {
    for (let j = 0; j < cols; j++) an.flags[i * cols + j] = flagOf(text[j]);
  });
  const rowOf = new Map(d.layers.map((l, i) => [l, i]));
  for (const entry of route.layers) {
    const i = rowOf.get(entry.layer);
    if (i === undefined) continue;
    const l = an.layers[i];
    if (l.firstNonfiniteStep !== null) {
      const j = indexAtOrBefore(b.steps, l.firstNonfiniteStep);
      l.firstNonfinite = j >= 0 && b.last_steps[j] >= l.firstNonfiniteStep ? j : null;
    }
    if (entry.last_step !== null && entry.last_step !== undefined) {
      const j = indexAtOrBefore(b.steps, entry.last_step);
      l.latestStep = j === cols - 1 && b.last_steps[j] >= entry.last_step ? j : null;
    }
  }
}
