// Gradient flow overview: layers (rows, model order) x steps (columns) of one run,
// colour = log10 of a statistic, anomalies marked, hover for exact values, click
// for the layer's detail at that step.

import { api, isAbort, isTransient } from "../api.js";
import { firstNonfinite, flagNames, fromRoute, stateChip, FLAG } from "../anomalies.js";
import { pointsFor, rangeOf, stepOfBin, stepsOfColumns, zoomBar } from "../bins.js";
import { Heatmap } from "../charts/heatmap.js";
import { tooltip } from "../charts/tooltip.js";
import { h, s, clear, replace, select, setOptions } from "../dom.js";
import { commonPrefix, EXAMPLE_STATS, fmtNum, fmtPercent, MAGNITUDE_STATS, statLabel } from "../format.js";
import { anyExamples, findRun, hasActivations, hasExamples, valuesOf } from "../model.js";
import { errorBox, field, note, Toggle } from "./common.js";
import { NoiseScalePanel } from "./noise_panel.js";
import { drawAxis } from "./overview_axis.js";
import { cellColors } from "./overview_cells.js";
import { asColumns, columnOf, merge, onBins, onLayers } from "./overview_data.js";
import { drawLegend } from "./overview_legend.js";
import { decorate } from "./overview_marks.js";
import { drawChips, drawLabels } from "./overview_rows.js";
import { drawSummary } from "./overview_summary.js";

const CHIP_W = 168;
const CHIP_MAX_W = 300; // a longer verdict is cut, its whole text in the chip's title
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
      // The flags depend on the whole run (a layer's baseline is its first steps): the rules are always asked for
      // over it, each step's flags only for the grid's steps, and none when the grid is binned (the matrix's bins
      // carry them; docs/HTTP_API.md). They, and where the run broke (`summary.origin`), are of the gradients,
      // whichever values colour the cells.
      const values = this._of(state) === "activation" ? valuesOf({ of: "activation" }) : { target: state.target, source: state.source };
      const flagSteps = window_.points ? { points: window_.points, ...(state.zoom ? { flags_start: state.zoom[0], flags_end: state.zoom[1] } : {}) } : {};
      let [bodies, an] = await Promise.all([
        Promise.all(stats.map((stat) => api.matrix({ run: state.run, ...values, stat, ...window_ }, { signal: abort.signal }))),
        api.anomalies({ run: state.run, target: state.target, source: state.source, ...flagSteps }, { signal: abort.signal }),
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

    // Colour scale: log10 of the positive finite values; a non-finite cell is red.
    const { lo, hi, cell, bin, pick } = cellColors(values, nonfinite, stat !== "nonfinite");

    // Layout: labels | heatmap | chips.
    const prefix = commonPrefix(d.layers);
    const names = d.layers.map((l) => l.slice(prefix.length));
    const labelW = Math.max(90, Math.min(280, 24 + 7.2 * Math.max(...names.map((n) => n.length))));
    const avail = this.el.clientWidth || 900;
    const anyChip = an.layers.some((l) => (l.verdict && stateChip(l.verdict.state)) || l.dominated);
    // Wide enough for the longest verdict in words (a verdict carrying its other findings), within bounds.
    const longest = Math.max(0, ...an.layers.map((l) => (l.verdict && stateChip(l.verdict.state) ? l.verdict.text.length : 0)));
    const chipW = anyChip ? Math.min(CHIP_MAX_W, Math.max(CHIP_W, 24 + Math.ceil(6 * longest))) : 12;
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
      decorate: (ctx, g) => decorate(ctx, g, an, showMarks, (step) => columnOf(d, step)),
    });
    drawLabels(this.labels, { layers: d.layers, names, an, rowH, open: (i) => this._open(i, null) });
    drawChips(this.chips, { layers: d.layers, an, route: d.an, rowH, openStep: (layer, step) => this._openStep(layer, step) });
    drawAxis(this.axis, d, width, first);
    drawLegend(this.legend, { stat, lo, hi, showMarks, info: an.info, activation: this._of(state) === "activation" });
    drawSummary(this.summary, { d, an, state, prefix, activation: this._of(state) === "activation", openStep: (layer, step) => this._openStep(layer, step) });
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
