// Layer detail: one layer of one run over steps — statistics table at the chosen
// step, statistics as line charts, histograms (offset / overlay), the raw gradient
// when one was written, per-timestep norms for RNN layers, the layer's weight
// gradients beside its output gradient, one series per target.

import { api, isAbort, isTransient } from "../api.js";
import { pointsFor, rangeOf } from "../bins.js";
import { COLORS, paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { downloadText, h, clear, replace, select, setOptions } from "../dom.js";
import { csvText, fmtNum, safeFilename, statLabel } from "../format.js";
import { examplesChoices, findLayer, findRun, layerSeries, pickableLayers, storedStats } from "../model.js";
import { onSmoothing } from "../smoothing.js";
import { errorBox, field, note, StepSlider, stepKeys, Toggle } from "./common.js";
import { ExamplesPanel } from "./examples_panel.js";
import { LayerCharts } from "./layer_charts.js";
import { LayerHistograms } from "./layer_hists.js";
import { TensorPanel } from "./tensor_panel.js";
import { verdictLine, verdictWhy } from "./verdict.js";

// The statistics of the finite elements only (docs/FORMAT.md): none where every element is NaN/Inf.
const FINITE_STATS = new Set(["min", "max", "mean", "std", "norm", "rms", "mean_abs"]);
const TABLE_STATS = ["elements", "nan", "pos_inf", "neg_inf", "zeros", "zero_frac", "no_gradient", "min", "max", "mean", "std", "norm", "rms", "mean_abs"];

export class LayerView {
  constructor(app) {
    this.app = app;
    this.loaded = null; // {key, series, stats: {key: body}, stored: the stored statistics' names}
    this.abort = null;
    this.layerSelect = select([], null, (v) => app.setState({ layer: v, series: null }), { "aria-label": "layer" });
    this.logToggle = new Toggle([["1", "log"], ["0", "linear"]], "1", (v) => app.setState({ log: v === "1" }), "y scale");
    this.csvBtn = h("button", { type: "button", class: "lg-button", text: "Download CSV", title: "every statistic of every series shown, at every step", on: { click: () => this._csv() } });
    this.toolbar = h(
      "div",
      { class: "lg-toolbar" },
      app.runControls({ targetSource: false }),
      field("Layer", this.layerSelect, "lg-field-wide"),
      field("Y scale", this.logToggle.el),
      h("span", { class: "lg-spacer" }),
      this.csvBtn,
    );
    this.slider = new StepSlider((step) => app.setState({ step }));
    this.header = h("div", { class: "lg-layer-head" });
    this.message = h("div", { class: "lg-messages" });

    // At-step table.
    this.table = h("div", { class: "lg-at-step" });
    const tablePanel = h("div", { class: "lg-panel lg-panel-table" }, h("h3", { class: "lg-panel-title", text: "At this step" }), this.table);

    // Charts over steps. A drag across one zooms the view (histograms too) and the overview: refetched at full resolution.
    this.charts = new LayerCharts((step) => app.setState({ step }), (zoom) => app.setState({ zoom }));
    onSmoothing(() => {
      if (this.loaded && this.el.isConnected) this._apply(this.state, true);
    });

    // Histograms of the chosen series and, when recorded, of the layer's forward values.
    this.hists = new LayerHistograms(app, (series) => this._color(series));
    // Raw tensor.
    this.tensor = new TensorPanel();
    // Timesteps.
    this.tsMsg = h("div");
    this.tsPanel = h("div", { class: "lg-panel lg-panel-ts", hidden: true }, h("h3", { class: "lg-panel-title", text: "Gradient norm per timestep (RNN)" }), this.tsMsg);
    this.tsChart = new LineChart(this.tsPanel, { height: 200, alwaysLegend: true });

    // Each example's own gradient norm (per-example records): hidden without them.
    this.examples = new ExamplesPanel(app, (series) => this._color(series));

    this.body = h(
      "div",
      { class: "lg-layer-body" },
      h("div", { class: "lg-layer-row" }, tablePanel, this.hists.panel),
      h("div", { class: "lg-layer-row" }, this.hists.actPanel),
      h("div", { class: "lg-layer-row" }, this.examples.el),
      this.charts.el,
      h("div", { class: "lg-layer-row" }, this.tensor.el, this.tsPanel),
    );
    // The layer's verdict per series (the anomalies route's, as the overview and the report show it).
    this.verdictBox = h("div", { class: "lg-layer-verdict", "aria-label": "verdict" });
    this.el = h("section", { class: "lg-view lg-layer", dataset: { view: "layer" } }, this.toolbar, this.header, this.slider.el, this.message, this.verdictBox, this.body);
  }

  _key(state) {
    return JSON.stringify([state.run, state.layer, state.zoom]);
  }

  async show(state) {
    this.state = state;
    const run = findRun(this.app.runs, state.run);
    const layers = pickableLayers(run);
    const options = layers.map((l) => [l.layer, l.layer]);
    if (state.layer && !options.some(([v]) => v === state.layer)) options.push([state.layer, findLayer(run, state.layer) ? state.layer : `${state.layer} (not in this run)`]);
    setOptions(this.layerSelect, options, state.layer);
    this.logToggle.set(state.log ? "1" : "0");
    this.hists.setMode(state.hist);
    if (!this.loaded || this.loaded.key !== this._key(state)) await this._load(state, false);
    else this._apply(state);
  }

  async refresh() {
    if (this.abort) return; // a load is under way: it brings the new data too
    this.state = this.app.resolved();
    if (!this.loaded || this.loaded.key !== this._key(this.state)) return this.show(this.state); // after a failure
    await this._load(this.state, true);
  }

  async _load(state, quiet) {
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    const signal = abort.signal;
    const run = findRun(this.app.runs, state.run);
    let series = layerSeries(run, state.layer).filter((x) => x.kinds.includes("stats"));
    if (!series.length) {
      // Unknown to `runs`: ask the route anyway so that its message is what the user sees.
      series = [{ key: "?", layer: state.layer, target: state.target, source: state.source, kinds: ["stats"], label: state.source }];
    }
    if (!quiet) {
      this.app.busy(true);
      this._header(state, null);
      clear(this.verdictBox);
    }
    // One bin per pixel of a chart (docs/HTTP_API.md, "Binned answers"); a zoom narrows the range.
    const window_ = { ...rangeOf(state.zoom), points: pointsFor(this.charts.chartWidth() - 72) };
    try {
      // Each series' verdict over the whole run, from the `anomalies` route (the rules compare the layer
      // with every other layer of its target and source; `points: 1`: its summaries, not each step's flags, which
      // this view does not draw). Without it the view still works.
      const verdictOf = (x) =>
        x.activation ? Promise.resolve(null) : api.anomalies({ run: state.run, target: x.target, source: x.source, layer: x.layer, points: 1 }, { signal }).then(
          (b) => {
            const entry = b.layers.find((l) => l.layer === x.layer);
            if (!entry || !entry.verdict) return null;
            const origin = (b.summary && b.summary.origin) || null;
            const why = verdictWhy(entry.verdict, { counts: entry.counts, recorded: entry.recorded, thresholds: b.thresholds, originLine: origin && origin.line });
            return { series: x, verdict: entry.verdict, why, origin };
          },
          (e) => {
            if (isAbort(e)) throw e;
            return null;
          },
        );
      const [bodies, verdicts] = await Promise.all([
        Promise.all(series.map((x) => api.stats({ run: state.run, layer: x.layer, target: x.target, source: x.source, ...window_ }, { signal }).then(prepare))),
        Promise.all(series.map(verdictOf)),
      ]);
      if (signal.aborted) return;
      const stats = {};
      series.forEach((x, k) => {
        stats[x.key] = bodies[k];
      });
      this._verdicts(verdicts.filter(Boolean), run);
      const all = layerSeries(run, state.layer);
      this.loaded = { key: this._key(state), series, all, stats, hist: null, ts: null, runInfo: run, stored: storedStats(this.app.runs) };
      this.retryOnPoll = false;
      this.tensor.forget(quiet);
      clear(this.message);
      this.body.hidden = false;
      await Promise.all([this.hists.load(state, this.loaded, this._primary(state), signal), this._loadTimesteps(state, signal), this.examples.load(state, signal, window_, examplesChoices(all, state.target))]);
      if (signal.aborted) return;
      this._apply(state, true);
    } catch (e) {
      if (isAbort(e)) return;
      this.retryOnPoll = isTransient(e);
      if (!quiet) {
        this.loaded = null;
        this.body.hidden = true;
        this._header(state, null);
        this.slider.set([], null);
      }
      const msg = errorBox(e, `layer '${state.layer}' of run '${state.run}'`, { retry: this.app.retry });
      const layers = pickableLayers(run);
      replace(this.message, msg, layers.length ? note(`Pick one of the ${layers.length} layers of run '${state.run}' above, or go back to the overview.`) : null);
    } finally {
      if (this.abort === abort) this.abort = null;
      if (!quiet) this.app.busy(false);
    }
  }

  /** The series whose steps drive the slider and whose histograms are shown. */
  _primary(state) {
    const L = this.loaded;
    const byKey = L.series.find((x) => x.key === state.series);
    if (byKey) return byKey;
    return L.series.find((x) => x.target === state.target && x.layer === state.layer && x.source !== "weight" && !x.activation) ||
      L.series.find((x) => x.layer === state.layer && !x.activation) || L.series[0];
  }

  /** The layer's verdict per series, above its numbers; a chip opens the step its verdict names. */
  _verdicts(items, run) {
    const open = (step, layer) => this.app.setState(layer && layer !== this.state.layer ? { step, layer, series: null } : { step });
    replace(this.verdictBox, verdictLine(items, open, (layer) => Boolean(findLayer(run, layer))));
  }

  async _loadTimesteps(state, signal) {
    const L = this.loaded;
    const entry = findLayer(L.runInfo, state.layer);
    const targets = entry ? entry.series.filter((x) => x.kinds.includes("timesteps")).map((x) => x.target) : [];
    this.tsPanel.hidden = !targets.length;
    if (!targets.length) {
      L.ts = null;
      return;
    }
    try {
      const bodies = await Promise.all(targets.map((t) => api.timesteps({ run: state.run, layer: state.layer, target: t }, { signal })));
      L.ts = bodies;
      clear(this.tsMsg);
    } catch (e) {
      if (isAbort(e)) throw e;
      L.ts = null;
      replace(this.tsMsg, errorBox(e, "the per-timestep norms"));
    }
  }

  /** Draw everything for the chosen step (`full`: also the charts over steps). */
  _apply(state, full = false) {
    const L = this.loaded;
    if (!L) return;
    const primary = this._primary(state);
    const steps = sliderSteps(L.stats[primary.key], state.step);
    const step = this.slider.set(steps, state.step);
    this.step = step;
    this._header(state, primary);
    this._table(step);
    const chartsKey = JSON.stringify([L.key, state.log, primary.key, steps.length]);
    if (full || this._chartsKey !== chartsKey) {
      this._chartsKey = chartsKey;
      this.charts.draw(state, L, primary, step, nonfiniteMarks(L.stats[primary.key]));
    } else this.charts.mark(step);
    this.hists.draw(state, L, primary, step);
    this.examples.draw(state, step);
    this._timesteps(state, step);
    this.tensor.show(state.run, L.all, step);
    if (step === null) replace(this.message, note(`Nothing logged yet for ${primary.label}.`));
  }

  _header(state, primary) {
    const entry = findLayer(this.loaded && this.loaded.runInfo, state.layer);
    const bits = [];
    if (entry) {
      bits.push(`model position ${entry.index >= 0 ? entry.index : "unknown"}`);
      const body = primary && this.loaded && this.loaded.stats[primary.key];
      const dtype = (body && body.dtype) || entry.dtype;
      if (dtype) bits.push(dtype);
      const kinds = ["histograms", "stats", "tensors", "timesteps"].filter((k) => entry[k]);
      bits.push(`logged: ${kinds.join(", ")}`);
      if (entry.targets.length > 1) bits.push(`targets: ${entry.targets.join(", ")}`);
    }
    const back = h("button", { type: "button", class: "lg-link", text: "← overview", on: { click: () => this.app.setState({ view: "overview" }) } });
    replace(
      this.header,
      back,
      h("h2", { class: "lg-layer-name", text: state.layer || "" }),
      h("span", { class: "lg-muted", text: `${state.run}${bits.length ? ` · ${bits.join(" · ")}` : ""}` }),
    );
  }

  _valueAt(body, stat, step) {
    if (body.binned) {
      const row = exactRow(body, step);
      if (row === undefined) this._fetchRow(body, step);
      return row ? row[stat] : undefined;
    }
    const j = body.steps.indexOf(step);
    return j < 0 ? undefined : body.stats[stat][j];
  }

  /** A binned answer has exact values at its kept steps only: ask for the one step the table shows. */
  _fetchRow(body, step) {
    if (body.asked.has(step)) return;
    body.asked.add(step);
    const q = body.query;
    api.stats({ run: q.run, layer: q.layer, target: q.target, source: q.source, start: step, end: step }).then(
      (b) => {
        body.exact.set(step, b.steps.length ? Object.fromEntries(Object.entries(b.stats).map(([k, v]) => [k, v[0]])) : null);
        if (this.loaded && this.step === step && Object.values(this.loaded.stats).includes(body)) this._table(step);
      },
      () => body.asked.delete(step),
    );
  }

  _table(step) {
    const L = this.loaded;
    const cols = L.series;
    const table = h("table", { class: "lg-stats-table", dataset: { step: step ?? "", run: this.state.run, layer: this.state.layer } });
    const head = h("tr", null, h("th", { text: "statistic" }), cols.map((x, k) => h("th", { class: "lg-series-head", title: `${x.target} / ${x.source} / ${x.layer}` }, h("span", { class: "lg-swatch", style: { background: paletteColor(k) } }), h("span", { text: x.label }))));
    table.appendChild(h("thead", null, head));
    const tbody = h("tbody");
    for (const stat of TABLE_STATS) {
      const tr = h("tr", { dataset: { stat } }, h("th", { text: statLabel(stat) }));
      for (const x of cols) {
        const v = step === null ? undefined : this._valueAt(L.stats[x.key], stat, step);
        const bad = (["nan", "pos_inf", "neg_inf"].includes(stat) && v > 0) || (stat === "no_gradient" && v === 1);
        // A statistic of the finite elements of a tensor that has none (every element NaN/Inf): no value, said so.
        const none = v === null && FINITE_STATS.has(stat) && this._noFinite(L.stats[x.key], step);
        const title = v === undefined ? "no record at this step" : none ? "every element is NaN or ±Inf at this step: a statistic of its finite elements has no value" : null;
        const text = v === undefined ? "·" : none ? "no finite value" : fmtNum(v);
        tr.appendChild(h("td", { class: bad || none ? "lg-bad" : null, dataset: { series: x.key, stat, ...(none ? { none: "1" } : {}) }, title, text, "data-value": v === undefined ? null : String(v) }));
      }
      tbody.appendChild(tr);
    }
    table.appendChild(tbody);
    replace(this.table, table);
  }

  /** Whether the series' record at `step` has elements and none of them finite (docs/FORMAT.md, read side). */
  _noFinite(body, step) {
    const n = this._valueAt(body, "elements", step);
    const bad = this._valueAt(body, "nonfinite", step);
    const none = this._valueAt(body, "no_gradient", step);
    return typeof n === "number" && n > 0 && typeof bad === "number" && bad >= n && none !== 1;
  }

  /** A series' colour: its column's in the table and its line's in the charts. */
  _color(series) {
    const k = this.loaded.series.findIndex((x) => x.key === series.key);
    return paletteColor(k >= 0 ? k : this.loaded.series.length);
  }

  _timesteps(state, step) {
    const L = this.loaded;
    if (!L.ts || !L.ts.length) return;
    const series = [];
    const t0 = L.ts[0];
    // A few other steps of the first target, faint, for context.
    if (t0.steps.length > 1) {
      const n = Math.min(5, t0.steps.length);
      for (let k = 0; k < n; k++) {
        const j = Math.round((k * (t0.steps.length - 1)) / Math.max(1, n - 1));
        if (t0.steps[j] === step) continue;
        const ys = t0.norms[j];
        series.push({ name: `step ${t0.steps[j]}`, color: "#c5cad3", xs: ys.map((_, t) => t), ys, width: 1 });
      }
    }
    L.ts.forEach((b, k) => {
      const j = step === null ? b.steps.length - 1 : b.steps.indexOf(step);
      if (j < 0) return;
      const ys = b.norms[j];
      series.push({ name: `${b.target} · step ${b.steps[j]}`, color: k ? paletteColor(k + 1) : COLORS.selected, xs: ys.map((_, t) => t), ys, width: 2.2 });
    });
    this.tsChart.update({
      series,
      log: state.log,
      xLabel: "timestep t",
      integerX: true,
      xFormatHover: (t) => `timestep ${t}`,
      empty: step === null ? "no data" : `no per-timestep norms at step ${step}`,
    });
  }

  // -- keys, CSV -------------------------------------------------------------------------------

  onKey(e) {
    return stepKeys(e, this.slider);
  }

  _csv() {
    const L = this.loaded;
    if (!L) return;
    const run = this.state.run;
    if (L.series.some((x) => L.stats[x.key].binned)) {
      // Binned: the CSV route has every step (of the primary series' layer).
      const p = this._primary(this.state);
      window.open(api.csvUrl({ run, layer: p.layer, target: p.target, source: p.source }), "_blank");
      return;
    }
    const rows = [];
    for (const x of L.series) {
      const b = L.stats[x.key];
      b.steps.forEach((step, j) => {
        rows.push([run, x.target, x.source, x.layer, step, b.wall_times[j], ...L.stored.map((st) => b.stats[st][j])]);
      });
    }
    downloadText(csvText(["run", "target", "source", "layer", "step", "wall_time", ...L.stored], rows), `layergrad-${safeFilename(run)}-${safeFilename(this.state.layer)}.csv`);
  }
}

/** Marks what a binned `stats` answer needs: where it came from, and the exact rows fetched since. */
function prepare(body) {
  if (!body.binned) return body;
  return { ...body, query: { run: body.run, layer: body.layer, target: body.target, source: body.source }, exact: new Map(), asked: new Set() };
}

/** The exact statistics of a binned answer at `step` ({stat: value}), null if none, undefined if unknown yet. */
function exactRow(body, step) {
  const k = body.kept.steps.indexOf(step);
  if (k >= 0) return Object.fromEntries(Object.entries(body.kept.stats).map(([name, v]) => [name, v[k]]));
  return body.exact.get(step);
}

/** The slider's steps: every step, or for bins their first steps, the kept ones and the step asked for. */
function sliderSteps(body, step) {
  if (!body.binned) return body.steps;
  const all = new Set([...body.steps, ...body.kept.steps]);
  if (typeof step === "number" && step >= body.steps[0] && step <= body.last_steps[body.last_steps.length - 1]) all.add(step);
  return [...all].sort((a, b) => a - b);
}

/** Red marks at the non-finite steps: exact at kept steps; a bin's first step when none of them is in it. */
function nonfiniteMarks(body) {
  const mark = (x) => ({ x, title: `non-finite values at step ${x}` });
  if (!body.binned) return body.steps.filter((_, j) => body.stats.nonfinite[j] > 0).map(mark);
  const exact = body.kept.steps.filter((_, k) => body.kept.stats.nonfinite[k] > 0);
  const out = exact.map(mark);
  body.steps.forEach((first, j) => {
    if (!(body.max.nonfinite[j] > 0)) return;
    if (exact.some((x) => x >= first && x <= body.last_steps[j])) return;
    out.push({ x: first, title: `non-finite values in steps ${first}–${body.last_steps[j]}` });
  });
  return out;
}
