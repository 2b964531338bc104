// The layer view's histograms: the chosen series' (offset ridges or overlaid lines, thinned to HIST_STEPS
// evenly spread steps of the zoom, plus the chosen step), and beside them the layer's forward values'.
// Each in its series' colour; the chosen step outlined in COLORS.selected.

import { api, isAbort } from "../api.js";
import { rangeOf } from "../bins.js";
import { HistogramChart, rangeSpread } from "../charts/histograms.js";
import { h, clear, replace, select, setOptions } from "../dom.js";
import { fmtNum } from "../format.js";
import { errorBox, field, Toggle } from "./common.js";

// Ridges of the offset histograms: as many as stay apart at the panel's height (TensorBoard's look).
const HIST_STEPS = 20;
// Ridges whose ranges differ more than this many times: each on its own range by default (on one axis the
// narrow ones would be spikes at 0).
const SPREAD_PER_STEP = 100;

export class LayerHistograms {
  /** `colorOf(series)`: the series' colour in the view (its table column's, its lines'). */
  constructor(app, colorOf) {
    this.app = app;
    this.colorOf = colorOf;
    this.L = null;
    this.histSelect = select([], null, (v) => app.setState({ series: v }), { "aria-label": "histogram series" });
    this.histMode = new Toggle([["offset", "offset"], ["overlay", "overlay"]], "offset", (v) => app.setState({ hist: v }), "histogram mode");
    this.histX = new Toggle([["shared", "one axis"], ["step", "axis per step"]], "shared", (v) => app.setState({ hx: v }), "histogram x axis");
    this.histMsg = h("div");
    this.spreadNote = h("div", { class: "lg-muted lg-hist-spread" });
    const head = h("div", { class: "lg-panel-head" }, h("h3", { class: "lg-panel-title", text: "Histograms" }), field("Series", this.histSelect), this.histMode.el, this.histX.el);
    this.panel = h("div", { class: "lg-panel lg-panel-hist" }, head, this.histMsg, this.spreadNote);
    this.hist = new HistogramChart(this.panel, { height: 300, onPick: (step) => app.setState({ step }) });
    this.actMsg = h("div");
    this.actPanel = h("div", { class: "lg-panel lg-panel-act-hist", hidden: true }, h("div", { class: "lg-panel-head" }, h("h3", { class: "lg-panel-title", text: "Activation histograms (forward values)" })), this.actMsg);
    this.actHist = new HistogramChart(this.actPanel, { height: 300, onPick: (step) => app.setState({ step }) });
  }

  setMode(mode) {
    this.histMode.set(mode);
  }

  /** Fetch both (into `L`, the view's loaded data) for `state`'s run, layer and zoom. */
  async load(state, L, primary, signal) {
    this.L = L;
    this.primary = primary;
    await Promise.all([this._loadHist(state, signal), this._loadActHist(state, signal)]);
  }

  /** Draw both at `step` (fetching another series' first when the state asks for it). */
  draw(state, L, primary, step) {
    this.L = L;
    this.primary = primary;
    this.state = state;
    this.step = step;
    const wanted = this._histSeriesFor(state);
    if (L.histSeries && wanted && wanted.key !== L.histSeries.key) {
      this._loadHist(state).then(() => {
        if (this.L === L) this._drawHist(this.state, this.step);
      }, () => {});
    } else {
      this._drawHist(state, step);
      this._histAt(step);
    }
    this._drawActHist(state, step);
  }

  async _loadHist(state, signal) {
    const L = this.L;
    const withHist = L.all.filter((x) => x.kinds.includes("histogram"));
    setOptions(this.histSelect, withHist.map((x) => [x.key, x.label]), null);
    const hs = this._histSeriesFor(state);
    L.histSeries = hs || null;
    if (!hs) {
      L.hist = null;
      return;
    }
    this.histSelect.value = hs.key;
    try {
      const body = await api.histograms({ run: state.run, layer: hs.layer, target: hs.target, source: hs.source, max_steps: HIST_STEPS, ...rangeOf(state.zoom) }, { signal });
      L.hist = { series: hs, steps: body.steps, hists: body.histograms, extra: new Map() };
      clear(this.histMsg);
    } catch (e) {
      if (isAbort(e)) throw e;
      L.hist = null;
      replace(this.histMsg, errorBox(e, "the histograms"));
    }
  }

  /** The activation's histograms, beside the gradient's (unless those already show the activation). */
  async _loadActHist(state, signal) {
    const L = this.L;
    const act = L.all.find((x) => x.activation && x.layer === state.layer && x.kinds.includes("histogram"));
    L.actHist = null;
    L.actSeries = act || null;
    if (!act) return;
    try {
      const body = await api.histograms({ run: state.run, layer: act.layer, target: act.target, source: act.source, max_steps: HIST_STEPS, ...rangeOf(state.zoom) }, { signal });
      L.actHist = { series: act, steps: body.steps, hists: body.histograms };
      clear(this.actMsg);
    } catch (e) {
      if (isAbort(e)) throw e;
      replace(this.actMsg, errorBox(e, "the activation histograms"));
    }
  }

  _drawActHist(state, step) {
    const L = this.L;
    const A = L && L.actHist;
    const sameAsMain = Boolean(A && L.histSeries && L.histSeries.key === A.series.key);
    this.actPanel.hidden = !(L && L.actSeries) || sameAsMain;
    if (!A || sameAsMain) return;
    const items = A.steps.map((x, k) => ({ key: x, label: `step ${x}`, buckets: A.hists[k] }));
    this.actHist.setTitle(histTitle(A, L.stats[A.series.key], step, state.zoom));
    const perStep = state.hist !== "overlay" && (state.hx ? state.hx === "step" : rangeSpread(items.map((it) => it.buckets)) > SPREAD_PER_STEP);
    this.actHist.update({ items, mode: state.hist === "overlay" ? "overlay" : "offset", current: step, color: this.colorOf(A.series), perStep });
  }

  /** Each ridge on its own range: as the state says, else when the ranges differ more than SPREAD_PER_STEP-fold. */
  _perStep(state, items) {
    const spread = rangeSpread(items.map((it) => it.buckets));
    const auto = spread > SPREAD_PER_STEP;
    const perStep = state.hist !== "overlay" && (state.hx ? state.hx === "step" : auto);
    this.histX.set(perStep ? "step" : "shared");
    this.histX.el.hidden = state.hist === "overlay";
    const decades = Math.log10(spread);
    this.spreadNote.textContent =
      decades >= 1
        ? `The ridges' ranges differ ${decades >= 2 ? `${fmtNum(Math.round(decades * 10) / 10)} decades` : `${fmtNum(Math.round(spread))}-fold`}: ${perStep ? "each ridge is drawn on its own range (its label says it)" : "on one axis the narrow ones are spikes at 0; “axis per step” draws each on its own range"}.`
        : "";
    return perStep;
  }

  _histSeriesFor(state) {
    const withHist = this.L.all.filter((x) => x.kinds.includes("histogram"));
    const primary = this.primary;
    return withHist.find((x) => x.key === state.series) || withHist.find((x) => x.key === primary.key) || withHist[0] || null;
  }

  async _histAt(step) {
    // The ridges are thinned to HIST_STEPS; fetch the chosen step's histogram if it is not among them.
    const L = this.L;
    const H = L && L.hist;
    if (!H || step === null || H.steps.includes(step) || H.extra.has(step)) return;
    const hs = H.series;
    try {
      const body = await api.histograms({ run: this.state.run, layer: hs.layer, target: hs.target, source: hs.source, start: step, end: step });
      if (body.steps.length) H.extra.set(step, body.histograms[0]);
      if (this.L === L) this._drawHist(this.state, step);
    } catch (e) {
      if (!isAbort(e)) replace(this.histMsg, errorBox(e, `the histogram at step ${step}`));
    }
  }

  _drawHist(state, step) {
    const L = this.L;
    const H = L && L.hist;
    this.panel.hidden = !(L && L.histSeries);
    if (!H) return;
    const items = H.steps.map((x, k) => ({ key: x, label: `step ${x}`, buckets: H.hists[k] }));
    if (step !== null && !H.steps.includes(step) && H.extra.has(step)) {
      items.push({ key: step, label: `step ${step}`, buckets: H.extra.get(step) });
      items.sort((a, b) => a.key - b.key);
    }
    this.hist.setTitle(histTitle(H, L.stats[H.series.key], step, state.zoom));
    const perStep = this._perStep(state, items);
    this.hist.update({ items, mode: state.hist === "overlay" ? "overlay" : "offset", current: step, color: this.colorOf(H.series), perStep });
  }
}

/** "output — 20 of 300 steps (evenly spread) in the zoom; black: step 12" */
function histTitle(H, stats, step, zoom) {
  const total = stats ? stepCount(stats) : H.steps.length;
  const n = H.steps.length;
  const shown = total > n ? `${n} of ${total} steps (evenly spread)` : `${n} steps`;
  const range = n ? ` ${H.steps[0]}–${H.steps[n - 1]}` : "";
  return `${H.series.label} — ${shown}${range}${zoom ? " (zoomed)" : ""}; outlined in black: step ${step ?? "—"}`;
}

function stepCount(body) {
  return body.binned ? body.counts.reduce((a, b) => a + b, 0) : body.steps.length;
}
