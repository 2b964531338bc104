// Compare runs: one layer's statistic over steps in several runs (a colour per run, or by a
// hyperparameter), their histograms at one step on common bins, and the depth profile (statistic vs
// layer, model order) of each run at that step. Hovering a run's line, legend entry or row in the
// run list highlights it in every chart and fades the rest.

import { api, isAbort, isTransient } from "../api.js";
import { LineChart } from "../charts/lines.js";
import { downloadText, h, clear, replace, select, setOptions } from "../dom.js";
import { csvText, EXAMPLE_STATS, MAGNITUDE_STATS, safeFilename, statLabel } from "../format.js";
import { anyExamples, findRun, hasActivations, layerKey, layersWith, union, valuesOf } from "../model.js";
import { onSmoothing, smoothing } from "../smoothing.js";
import { ColorBy } from "./color_by.js";
import { AtStepPanels } from "./compare_at_step.js";
import { errorBox, field, note, StepSlider, stepKeys, Toggle } from "./common.js";
import { NoiseScalePanel } from "./noise_panel.js";
import { RunPicker } from "./run_picker.js";
import { SmoothingControl } from "./smoothing_control.js";

/** The most runs compared at once (the `compare` route's limit, docs/HTTP_API.md). */
const MAX_RUNS = 200;

/** The statistic compared: the overview's colour, unless it is a per-example one (those are not compared). */
function compared(state) {
  return EXAMPLE_STATS.includes(state.stat) ? "norm" : state.stat;
}

export class CompareView {
  constructor(app) {
    this.app = app;
    this.abort = null;
    this.data = null;
    this.hovered = null;
    this.emptied = false; // the user unticked every run: compare none (not the first two)
    this.picker = new RunPicker((runs) => this._choose(runs), (run) => this._hover(run));
    this.colorBy = new ColorBy((name) => app.setState({ color: name }));
    this.layerSelect = select([], null, (key) => this._pickLayer(key), { "aria-label": "layer" });
    this.statSelect = select(MAGNITUDE_STATS.map((x) => [x, statLabel(x)]), "norm", (v) => app.setState({ stat: v }), { "aria-label": "statistic" });
    this.logToggle = new Toggle([["1", "log"], ["0", "linear"]], "1", (v) => app.setState({ log: v === "1" }), "y scale");
    this.csvBtn = h("button", { type: "button", class: "lg-button", text: "Download CSV", title: "the values of the charts below", on: { click: () => this._csv() } });
    this.ofToggle = new Toggle([["gradient", "gradients"], ["activation", "activations"]], "gradient", (v) => app.setState({ of: v }), "values");
    this.ofField = field("Values", this.ofToggle.el);
    this.toolbar = h(
      "div",
      { class: "lg-toolbar" },
      field("Layer", this.layerSelect, "lg-field-wide"),
      this.ofField,
      field("Statistic", this.statSelect),
      this.colorBy.field,
      app.runControls({ run: false }),
      field("Y scale", this.logToggle.el),
      new SmoothingControl("lg-compare-smoothing").el,
      h("span", { class: "lg-spacer" }),
      this.csvBtn,
    );
    this.slider = new StepSlider((step) => app.setState({ step }));
    this.message = h("div", { class: "lg-messages" });
    const onHover = (run) => this._hover(run);
    this.overlay = new LineChart(h("div"), { height: 240, onPick: (x) => app.setState({ step: x }), alwaysLegend: true, onHover });
    // The histograms and the depth profiles at the chosen step.
    this.atStep = new AtStepPanels(app, { colorOf: (run) => this._color(run), onHover, onPickLayer: (key) => this._pickLayer(key) });
    // The runs' gradient noise scales side by side, when recorded.
    this.noise = new NoiseScalePanel({ onHover, colorOf: (run) => this._color(run) });
    this.body = h(
      "div",
      { class: "lg-compare-body" },
      h("div", { class: "lg-panel lg-panel-wide" }, this.overlay.root),
      this.atStep.el,
    );
    this.el = h(
      "section",
      { class: "lg-view lg-compare", dataset: { view: "compare" } },
      h("div", { class: "lg-toolbar lg-toolbar-runs" }, h("span", { class: "lg-field-label", text: "Runs" }), this.picker.el),
      this.toolbar,
      this.colorBy.legend,
      this.slider.el,
      this.message,
      this.body,
      this.noise.el,
    );
    onSmoothing(() => {
      if (this.data && this.el.isConnected) this._apply(this.state, true);
    });
  }

  /** The runs that may have the noise-scale scalars (written with per-example records only); the others are
   * named as not recorded only when one of the runs has them. */
  _noiseRuns(runs) {
    return runs.some((r) => anyExamples(findRun(this.app.runs, r))) ? runs : [];
  }

  /** Runs chosen in the URL that exist, else the first two (none once the user unticked them all). */
  _runs(state) {
    const all = this.app.runs.runs.map((r) => r.run);
    const known = new Set(all);
    const chosen = state.runs.filter((r) => known.has(r));
    if (chosen.length || (this.emptied && !state.runs.length)) return chosen;
    const first = all.includes(state.run) ? [state.run] : [];
    for (const r of all) if (first.length < 2 && !first.includes(r)) first.push(r);
    return first;
  }

  /** Per run, colours follow the order in which runs were picked (picking one more keeps the others'), or
   * the chosen hyperparameter's scale (`ColorBy`). */
  _color(run) {
    return this.coloring.colorOf(run);
  }

  _choose(runs) {
    this.emptied = !runs.length;
    this.app.setState({ runs });
  }

  /** Highlight `run` (null: none) in every chart that shows the runs. */
  _hover(run) {
    this.hovered = run;
    for (const chart of [this.overlay, this.atStep, this.noise.chart]) chart.highlight(run);
  }

  /** Layer keys (paths without the model name) of the chosen runs, in model order. */
  _keys(state, runs) {
    const keys = [];
    for (const name of runs) {
      for (const l of layersWith(findRun(this.app.runs, name), valuesOf(state).target, valuesOf(state).source)) {
        const k = layerKey(l.layer);
        if (!keys.includes(k)) keys.push(k);
      }
    }
    return keys;
  }

  /** The path of the layer with `key` in `run` (exact path first), or null. */
  _resolve(state, runName, key, path) {
    const layers = layersWith(findRun(this.app.runs, runName), valuesOf(state).target, valuesOf(state).source);
    if (path && layers.some((l) => l.layer === path)) return path;
    const hit = layers.find((l) => layerKey(l.layer) === key);
    return hit ? hit.layer : null;
  }

  async show(state) {
    this.state = state;
    const runs = this._runs(state);
    setOptions(this.statSelect, MAGNITUDE_STATS.map((x) => [x, statLabel(x)]), compared(state));
    this.logToggle.set(state.log ? "1" : "0");
    this.ofField.hidden = !this.app.runs.runs.some(hasActivations);
    const withActivations = runs.some((r) => hasActivations(findRun(this.app.runs, r)));
    this.ofToggle.disable("activation", withActivations ? null : "Nothing to compare: none of the selected runs recorded activations (forward values)");
    this.ofToggle.set(state.of);
    const keys = this._keys(state, runs);
    const key = state.layer ? layerKey(state.layer) : keys[0];
    const options = keys.map((k) => [k, k]);
    if (key && !keys.includes(key)) options.push([key, `${key} (in none of these runs)`]);
    setOptions(this.layerSelect, options, key);
    await this.colorBy.load(this.app.runsSig); // once per change of the runs
    if (this.state !== state) return; // a newer show() is under way
    this.coloring = this.colorBy.coloring(runs, state.color);
    const colorKey = JSON.stringify([state.color, runs, this.colorBy.hp && this.colorBy.hp.sig]);
    const recolor = colorKey !== this.colorKey;
    this.colorKey = colorKey;
    this.picker.update(this.app.runs.runs.map((r) => r.run), runs, (r) => this._color(r));
    const tooMany = runs.length > MAX_RUNS;
    this.noise.show(tooMany ? [] : this._noiseRuns(runs));
    if (!runs.length || !key || tooMany) {
      const why = !runs.length
        ? "No run chosen: tick runs in the list above (or All)."
        : tooMany
          ? `${runs.length} runs ticked: at most ${MAX_RUNS} can be compared at once. Untick some (the filter and None help).`
          : state.of === "activation"
          ? "Nothing to compare: none of these runs recorded activations."
          : "Nothing to compare: no run has statistics for this target and source.";
      replace(this.message, note(why));
      this.body.hidden = true;
      return;
    }
    const fetchKey = JSON.stringify([runs, key, state.layer, compared(state), state.target, state.source, state.of]);
    if (!this.data || this.data.fetchKey !== fetchKey) await this._load(state, runs, key, fetchKey, false);
    else this._apply(state, recolor);
  }

  async refresh() {
    if (this.abort) return; // a load is under way: it brings the new data too
    this.state = this.app.resolved();
    if (!this.data) return this.show(this.state); // after a failure
    await this.colorBy.load(this.app.runsSig); // new runs may bring hyperparameters
    this.coloring = this.colorBy.coloring(this.data.runs, this.state.color);
    this.picker.update(this.app.runs.runs.map((r) => r.run), this.data.runs, (r) => this._color(r));
    this.noise.show(this._noiseRuns(this.data.runs));
    await this._load(this.state, this.data.runs, this.data.key, this.data.fetchKey, true);
  }

  async _load(state, runs, key, fetchKey, quiet) {
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    const signal = abort.signal;
    if (!quiet) this.app.busy(true);
    try {
      const paths = runs.map((r) => this._resolve(state, r, key, state.layer));
      const present = runs.filter((_, k) => paths[k]);
      const common = { stat: compared(state), ...valuesOf(state) };
      let steps;
      let values;
      let gaps = runs.map(() => []); // per run: indices into `steps` recorded without a value
      const same = present.length && present.every((r) => paths[runs.indexOf(r)] === paths[runs.indexOf(present[0])]);
      const early = this.atStep.early(state, runs, compared(state), signal); // beside the overlay's request
      if (!present.length) {
        // Let the route say why (404 for a layer no run has).
        await api.compare({ run: runs, layer: state.layer || key, ...common }, { signal });
        steps = [];
        values = runs.map(() => []);
      } else if (same) {
        const b = await api.compare({ run: present, layer: paths[runs.indexOf(present[0])], ...common }, { signal });
        steps = b.steps;
        values = runs.map((r) => (b.runs.includes(r) ? b.values[b.runs.indexOf(r)] : steps.map(() => null)));
        gaps = runs.map((r) => (b.runs.includes(r) && b.gaps ? b.gaps[b.runs.indexOf(r)] : []));
      } else {
        // Layer paths differ between runs (models with other names): one stats call per run.
        const bodies = await Promise.all(
          present.map((r) => api.stats({ run: r, layer: paths[runs.indexOf(r)], ...valuesOf(state) }, { signal })),
        );
        steps = union(bodies.map((b) => b.steps));
        values = runs.map((r) => {
          const k = present.indexOf(r);
          if (k < 0) return steps.map(() => null);
          const pos = new Map(bodies[k].steps.map((x, n) => [x, n]));
          return steps.map((x) => (pos.has(x) ? bodies[k].stats[compared(state)][pos.get(x)] : null));
        });
        gaps = values.map((v, k) => {
          const own = present.indexOf(runs[k]) >= 0 ? new Set(bodies[present.indexOf(runs[k])].steps) : new Set();
          return steps.map((x, j) => j).filter((j) => v[j] === null && own.has(steps[j]));
        });
      }
      if (signal.aborted) return;
      this.data = { fetchKey, runs, key, paths, steps, values, gaps, atStep: new Map(), early };
      this.retryOnPoll = false;
      clear(this.message);
      const missing = runs.filter((_, k) => !paths[k]);
      if (missing.length) this.message.appendChild(note(`No layer '${key}' in: ${missing.join(", ")}.`));
      this.body.hidden = false;
      this._apply(state, true);
    } catch (e) {
      if (isAbort(e)) return;
      this.retryOnPoll = isTransient(e);
      if (!quiet) {
        this.data = null;
        this.body.hidden = true;
      }
      replace(this.message, errorBox(e, `layer '${key}' in runs ${runs.join(", ")}`, { retry: this.app.retry }));
    } finally {
      if (this.abort === abort) this.abort = null;
      if (!quiet) this.app.busy(false);
    }
  }

  _apply(state, full = false) {
    const d = this.data;
    const step = this.slider.set(d.steps, state.step);
    this.step = step;
    if (full || d.drawnLog !== state.log) {
      d.drawnLog = state.log; // the y scale toggle redraws (the data stay)
      this.overlay.setTitle(`${statLabel(compared(state))} of ${d.key} — ${state.of === "activation" ? "activation (forward value)" : `${state.target} / ${state.source}`}`);
      this.overlay.update({
        // Each run's own points joined (a run logged at other steps is null on the common axis); a step it
        // recorded without a value (`gaps`) stays, null, so that its line breaks there.
        series: d.runs.map((r, k) => {
          const gap = new Set(d.gaps[k] || []);
          const keep = d.steps.map((_, j) => j).filter((j) => d.values[k][j] !== null || gap.has(j));
          return { name: r, key: r, color: this._color(r), xs: keep.map((j) => d.steps[j]), ys: keep.map((j) => d.values[k][j]) };
        }),
        log: state.log,
        smoothing: smoothing(),
        marker: step,
        xLabel: "step",
      });
    } else this.overlay.setMarker(step);
    this.atStep.show(state, d, step, compared(state), this.abort ? this.abort.signal : undefined);
  }

  _pickLayer(key) {
    const state = this.state;
    const runs = this._runs(state);
    let path = null;
    for (const r of runs) {
      path = this._resolve(state, r, key, null);
      if (path) break;
    }
    this.app.setState({ layer: path || key });
  }

  onKey(e) {
    return stepKeys(e, this.slider);
  }

  _csv() {
    const d = this.data;
    if (!d) return;
    const state = this.state;
    const rows = [];
    d.runs.forEach((r, k) => {
      d.steps.forEach((step, j) => rows.push(["over_steps", r, d.paths[k] || "", step, compared(state), d.values[k][j]]));
    });
    rows.push(...this.atStep.csvRows(d, this.step, compared(state)));
    downloadText(csvText(["chart", "run", "layer", "step", "stat", "value"], rows), `layergrad-compare-${safeFilename(d.key)}.csv`);
  }
}
