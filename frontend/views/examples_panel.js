// The layer view's per-example panel (issue #28): the spread of each example's own gradient norm over
// steps (a band min..max, the median, the max on top) and, at the chosen step, the batch positions that
// carried the largest norms. Hidden for a layer without per-example records: nothing changes for them.

import { api, isAbort } from "../api.js";
import { COLORS } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, clear, replace } from "../dom.js";
import { fmtExact, fmtNum } from "../format.js";
import { examplesSeries } from "../model.js";
import { errorBox, note } from "./common.js";

const BAND = "#1f77b4";
const WHY_NO_NUMBERS = {
  1: "no exact per-example rule for this layer's weights: no numbers",
  2: "the examples are coupled (e.g. BatchNormalization in training): per-example gradients are not defined",
};

export class ExamplesPanel {
  constructor(app) {
    this.app = app;
    this.info = h("div", { class: "lg-muted" });
    this.msg = h("div");
    this.top = h("div", { class: "lg-example-top" });
    this.el = h(
      "div",
      { class: "lg-panel lg-panel-examples", hidden: true, dataset: { panel: "examples" } },
      h("h3", { class: "lg-panel-title", text: "Per-example gradient norms" }),
      this.info,
      this.msg,
    );
    this.chart = new LineChart(this.el, { height: 200, alwaysLegend: true, onPick: (x) => app.setState({ step: x }) });
    this.el.appendChild(this.top);
    this.loaded = null; // {series, body, at: Map(step -> `at` | {error})}
  }

  /** Fetch the layer's spread over the view's range; `window_`: {start, end, points} as the stats ask. */
  async load(state, run, signal, window_) {
    const x = examplesSeries(run, state.layer, state.target);
    this.el.hidden = !x;
    this.loaded = null;
    clear(this.top);
    if (!x) return;
    try {
      const body = await api.examples({ run: state.run, layer: state.layer, target: x.target, source: x.source, ...window_ }, { signal });
      this.loaded = { run: state.run, layer: state.layer, series: x, body, at: new Map() };
      if (body.at) this.loaded.at.set(body.at.step, body.at);
      clear(this.msg);
    } catch (e) {
      if (isAbort(e)) throw e;
      replace(this.msg, errorBox(e, "the per-example norms"));
    }
  }

  /** Draw the spread, mark `step`, and name the largest examples there (fetched once per step). */
  draw(state, step) {
    const L = this.loaded;
    if (!L) return;
    const b = L.body;
    const median = b.binned ? b.median_max : b.median;
    const n = b.binned ? b.counts.reduce((a, c) => a + c, 0) : b.steps.length;
    const last = b.examples.filter((v) => v !== null).slice(-1)[0];
    this.info.textContent = `${L.series.target} · ${L.series.source}: the L2 norm of each example's own gradient, over the ${last ?? "?"} examples of a batch` +
      (b.binned ? ` — ${b.steps.length} bins of ${n} steps (each bin's smallest min and largest max)` : "");
    this.chart.update({
      log: state.log,
      marker: step,
      xLabel: "step",
      bands: [{ name: "min–max", color: BAND, xs: b.steps, lo: b.min, hi: b.max }],
      series: [
        { name: "max", color: COLORS.nonfinite, xs: b.steps, ys: b.max, width: 1.8 },
        { name: b.binned ? "median (bin's largest)" : "median", color: BAND, xs: b.steps, ys: median, width: 1.6, dash: "4 3" },
        { name: "min", color: "#7f7f7f", xs: b.steps, ys: b.min, width: 1 },
      ],
      empty: "no per-example numbers (see below)",
    });
    this._top(step);
  }

  _top(step) {
    const L = this.loaded;
    if (step === null || step === undefined) {
      clear(this.top);
      return;
    }
    const at = L.at.get(step);
    if (at === undefined) {
      L.at.set(step, null); // asked
      const x = L.series;
      api.examples({ run: L.run, layer: L.layer, target: x.target, source: x.source, step }).then(
        (body) => L.at.set(step, body.at),
        (e) => L.at.set(step, { error: e }),
      ).then(() => {
        if (this.loaded === L && this.step === step) this._top(step);
      });
    }
    this.step = step;
    if (!at) {
      replace(this.top, note(`step ${step}: …`));
      return;
    }
    if (at.error) {
      replace(this.top, at.error.status === 404 ? note(`No per-example record at step ${step}.`) : errorBox(at.error, `the largest examples at step ${step}`));
      return;
    }
    if (at.status !== 0) {
      replace(this.top, note(`Step ${step}: ${WHY_NO_NUMBERS[at.status] || `status ${at.status}`}.`));
      return;
    }
    const table = h("table", { class: "lg-stats-table lg-example-table", dataset: { step } });
    table.appendChild(h("thead", null, h("tr", null, h("th", { text: "rank" }), h("th", { text: "batch position" }), h("th", { text: "norm ‖g_i‖" }), h("th", { text: "share of Σ‖g_i‖²" }))));
    const tbody = h("tbody");
    at.top.forEach((t, k) => {
      const share = at.sum_sq && t.norm !== null ? (t.norm * t.norm) / at.sum_sq : null;
      tbody.appendChild(h("tr", { dataset: { position: t.position, rank: k + 1 } },
        h("td", { text: String(k + 1) }),
        h("td", { class: "lg-example-position", text: String(t.position) }),
        h("td", { title: t.norm === null ? "" : fmtExact(t.norm), text: fmtNum(t.norm) }),
        h("td", { text: share === null ? "—" : `${(100 * share).toFixed(1)}%` })));
    });
    table.appendChild(tbody);
    const share = at.top_share === null ? "—" : `${(100 * at.top_share).toFixed(1)}%`;
    const head = h("div", { class: "lg-example-head", text: `Step ${step}: the largest of ${at.examples} examples carries ${share} of the layer's per-example gradient energy; median norm ${fmtNum(at.median)}.` });
    replace(this.top, head, table);
  }
}
