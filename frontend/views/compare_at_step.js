// The compare view's charts at the chosen step: the runs' histograms of the layer on common bins, and their
// depth profiles (statistic vs layer, model order). Each chart is drawn as soon as its own data arrive: the
// depth profiles of every run come in one `depth` request, asked beside the view's `compare` request when the
// step is known before its answer (a step in the URL, or the last: the default), so that both charts are drawn
// in one frame; the histograms of every run in one `histograms_at` request, asked once the overlay is drawn
// (never ahead of it), beside the depth profiles.

import { api, isAbort } from "../api.js";
import { HistogramChart } from "../charts/histograms.js";
import { LineChart } from "../charts/lines.js";
import { clear, h, replace } from "../dom.js";
import { statLabel } from "../format.js";
import { findRun, hasKind, layerKey, valuesOf } from "../model.js";
import { errorBox } from "./common.js";

/** More runs than this: their histograms are outlines, and a note says how to bring one forward. */
export const MANY_HISTS = 12;

export class AtStepPanels {
  /**
   * @param {object} app the tab (its `runs`).
   * @param {{colorOf: (run: string) => string, onHover: (run: string|null) => void, onPickLayer: (key: string) => void}} opts
   */
  constructor(app, { colorOf, onHover, onPickLayer }) {
    this.app = app;
    this.colorOf = colorOf;
    this.onPickLayer = onPickLayer;
    this.hist = new HistogramChart(h("div"), { height: 240, onHover });
    this.histNote = h("div", { class: "lg-muted lg-hist-note" });
    this.depth = new LineChart(h("div"), { height: 240, onPick: (i) => this._depthPick(i), alwaysLegend: true, onHover });
    this.depthNote = h("div", { class: "lg-muted" });
    this.el = h(
      "div",
      { class: "lg-layer-row" },
      h("div", { class: "lg-panel" }, h("h3", { class: "lg-panel-title", text: "Histograms at this step (common bins)" }), this.histNote, this.hist.root),
      h("div", { class: "lg-panel" }, h("h3", { class: "lg-panel-title", text: "Depth profile at this step" }), this.depthNote, this.depth.root),
    );
    this.current = null;
  }

  /** Highlight `run` (null: none) in both charts. */
  highlight(run) {
    this.hist.highlight(run);
    this.depth.highlight(run);
  }

  /** Ask for the depth profiles of `runs` at `state.step` (null: each run's last) before the step is resolved;
   * `show` takes the answer when it is for the step shown. */
  early(state, runs, stat, signal) {
    const depth = this._fetchDepth(state, runs, state.step, stat, signal);
    depth.catch(() => null); // its failure is reported by `show`, if it is taken at all
    return { step: state.step, depth };
  }

  /** Draw the runs of `d` (the compare view's data) at `step`: from `d.atStep` when asked before, or from
   * `d.early` (`early`) when it was asked for that step. */
  async show(state, d, step, stat, signal) {
    if (step === null) return;
    const last = d.steps[d.steps.length - 1];
    const early = d.early && (d.early.step === step || (d.early.step === null && step === last)) ? d.early.depth : null;
    const at = this._cached(d, step, () => ({ depth: early || this._fetchDepth(state, d.runs, step, stat, signal) }));
    this.current = { d, step };
    const live = () => this.current && this.current.d === d && this.current.step === step;
    // Asked now, after the overlay (drawn before this is called), beside the depth profiles still on their way.
    if (!at.hists) at.hists = this._fetchHists(state, d, step, signal);
    // Each chart drawn as soon as its own answer is in.
    const depth = (async () => {
      try {
        const body = await at.depth;
        at.runs = body.runs; // for the CSV
        if (live()) this._drawDepth(state, d, step, stat, body);
      } catch (e) {
        if (!isAbort(e) && live()) replace(this.depthNote, errorBox(e, `the depth profiles at step ${step}`));
      }
    })();
    const hists = (async () => {
      try {
        const body = await at.hists;
        if (live()) this._drawHists(d, step, body);
      } catch (e) {
        if (!isAbort(e) && live()) replace(this.histNote, errorBox(e, `the histograms at step ${step}`));
      }
    })();
    await Promise.all([depth, hists]);
  }

  /** The step's entry of `d.atStep`; a failed fetch is dropped from it, to be asked again. */
  _cached(d, step, make) {
    const key = `${step}`;
    let at = d.atStep.get(key);
    if (!at) {
      at = make();
      d.atStep.set(key, at);
      at.depth.catch(() => d.atStep.get(key) === at && d.atStep.delete(key));
    }
    return at;
  }

  /** Every run's profile in one request: {runs: [{step, layers, byKey}], keys: layer keys in model order}. */
  async _fetchDepth(state, runNames, step, stat, signal) {
    const b = await api.depth({ run: runNames, step, stat, ...valuesOf(state) }, { signal });
    const runs = b.profiles.map((p) => ({ step: p.step, layers: p.layers, byKey: new Map(p.layers.map((l, i) => [layerKey(l), p.values[i]])) }));
    const keys = [];
    const seen = new Set();
    for (const p of runs) {
      for (const l of p.layers) {
        const k = layerKey(l);
        if (seen.has(k)) continue;
        seen.add(k);
        keys.push(k);
      }
    }
    return { runs, keys, missing: b.missing };
  }

  /** Every run's histogram at `step` (or its latest before) in one request: [{step, buckets} | null] per run. */
  async _fetchHists(state, d, step, signal) {
    const { target, source } = valuesOf(state);
    // A run without histograms for the layer (stats only) is not asked: `missing` would name it anyway.
    const asked = d.runs.map((r, k) => (d.paths[k] && hasKind(findRun(this.app.runs, r), d.paths[k], target, source, "histogram") ? k : -1)).filter((k) => k >= 0);
    const out = d.runs.map(() => null);
    if (!asked.length) return out;
    const layers = asked.map((k) => d.paths[k]);
    const layer = layers.every((l) => l === layers[0]) ? layers[0] : layers; // once when the runs share it
    const b = await api.histogramsAt({ run: asked.map((k) => d.runs[k]), layer, step, ...valuesOf(state) }, { signal });
    b.histograms.forEach((x, i) => {
      if (x.step !== null && x.buckets.length) out[asked[i]] = { step: x.step, buckets: x.buckets };
    });
    return out;
  }

  _drawDepth(state, d, step, stat, depth) {
    clear(this.depthNote);
    const { runs, keys, missing } = depth;
    const idx = keys.indexOf(d.key);
    this.depthKeys = keys;
    if (missing.length) this.depthNote.textContent = `No statistics for these values in: ${missing.join(", ")}.`;
    this.depth.setTitle(`${statLabel(stat)} by layer (model order) at step ${step}`);
    this.depth.update({
      series: d.runs.map((r, k) => ({
        name: runs[k].step !== step && runs[k].step !== null ? `${r} (step ${runs[k].step})` : r,
        key: r,
        color: this.colorOf(r),
        xs: keys.map((_, i) => i),
        ys: keys.map((key) => runs[k].byKey.get(key) ?? null),
      })),
      log: state.log,
      marker: idx >= 0 ? idx : null,
      xLabel: "layer",
      xFormat: (i) => shorten(keys[i] ?? ""),
      xFormatHover: (i) => keys[i] ?? "",
      empty: "no values at this step",
    });
  }

  _drawHists(d, step, hists) {
    const items = d.runs.map((r, k) => ({
      key: r,
      label: r,
      color: this.colorOf(r),
      buckets: hists[k] ? hists[k].buckets : [],
      note: hists[k] && hists[k].step !== step ? ` (step ${hists[k].step})` : "",
    }));
    const drawn = items.filter((it) => it.buckets.length).length;
    const none = d.runs.length - drawn;
    const parts = [];
    if (drawn > MANY_HISTS) parts.push(`${drawn} runs: each an outline; hover one (here, in a legend or the run list) to bring it forward and fade the rest.`);
    if (none && drawn) parts.push(`${none} of ${d.runs.length} runs have no histogram of this layer.`);
    this.histNote.textContent = parts.join(" ");
    this.hist.update({ items, mode: "aligned", bins: 40, empty: `no histogram at or before step ${step}` });
  }

  _depthPick(i) {
    const key = this.depthKeys && this.depthKeys[i];
    if (key) this.onPickLayer(key);
  }

  /** CSV rows of the depth profiles at `step`, as drawn: [chart, run, layer, step, stat, value]. */
  csvRows(d, step, stat) {
    const at = d.atStep.get(`${step}`);
    const runs = at && at.runs;
    if (!runs) return [];
    const rows = [];
    d.runs.forEach((r, k) => {
      for (const l of runs[k].layers) rows.push(["depth_profile", r, l, runs[k].step, stat, runs[k].byKey.get(layerKey(l))]);
    });
    return rows;
  }
}

function shorten(s) {
  return s.length > 14 ? `…${s.slice(-13)}` : s;
}
