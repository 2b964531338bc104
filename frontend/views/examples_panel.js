// The layer view's per-example panel: the spread of each example's own gradient norm over
// steps (a band min..max, the median, the max on top) and, at the chosen step, the batch positions that
// carried the largest norms. Hidden for a layer without per-example records: nothing changes for them.
// A layer's output and the weights it owns each have their own records: a selector picks one, as the
// raw-gradient panel does.

import { api, isAbort } from "../api.js";
import { paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, clear, replace, select, setOptions } from "../dom.js";
import { fmtNum } from "../format.js";
import { examplesChoices } from "../model.js";
import { smoothing } from "../smoothing.js";
import { errorBox, note } from "./common.js";

const WHY_NO_NUMBERS = {
  1: "no exact per-example rule for this layer's weights: no numbers",
  2: "the examples are coupled (e.g. BatchNormalization in training): per-example gradients are not defined",
};

export class ExamplesPanel {
  /** `colorOf(series)`: the series' colour in the view (default: the palette's first). */
  constructor(app, colorOf = () => paletteColor(0)) {
    this.app = app;
    this.colorOf = colorOf;
    this.info = h("div", { class: "lg-muted" });
    this.msg = h("div");
    this.top = h("div", { class: "lg-example-top" });
    this.seriesSelect = select([], null, (key) => this._pick(key), { "aria-label": "per-example series" });
    this.el = h(
      "div",
      { class: "lg-panel lg-panel-examples", hidden: true, dataset: { panel: "examples" } },
      h("div", { class: "lg-panel-head" }, h("h3", { class: "lg-panel-title", text: "Per-example gradient norms" }), this.seriesSelect),
      this.info,
      this.msg,
    );
    this.chart = new LineChart(this.el, { height: 200, alwaysLegend: true, onPick: (x) => app.setState({ step: x }) });
    this.el.appendChild(this.top);
    this.loaded = null; // {run, series, body, at: Map(step -> `at` | {error})}
    this.picked = null; // {run, layer, key}: the series picked in the selector, kept while the layer is shown
  }

  /** Fetch the spread over the view's range of the series picked among `choices` (the layer view's series with
   * per-example records: its output's, then its weights'); `window_`: {start, end, points} as the stats ask. */
  async load(state, signal, window_, choices) {
    this.el.hidden = !choices.length;
    this.loaded = null;
    this.context = { run: state.run, layer: state.layer, window_, choices };
    clear(this.top);
    if (!choices.length) return;
    const kept = this.picked && this.picked.run === state.run && this.picked.layer === state.layer ? choices.find((x) => x.key === this.picked.key) : null;
    const x = kept || choices[0];
    setOptions(this.seriesSelect, choices.map((c) => [c.key, c.label]), x.key);
    this.seriesSelect.hidden = choices.length < 2;
    this.el.dataset.series = x.key;
    await this._fetch(x, signal);
  }

  /** Load series `x` (for the layer shown now: an answer that comes after the view moved on is dropped). */
  async _fetch(x, signal) {
    const C = this.context;
    const { run, window_ } = C;
    try {
      const body = await api.examples({ run, layer: x.layer, target: x.target, source: x.source, ...window_ }, { signal });
      if (this.context !== C) return;
      this.loaded = { run, series: x, body, at: new Map() };
      if (body.at) this.loaded.at.set(body.at.step, body.at);
      clear(this.msg);
    } catch (e) {
      if (isAbort(e)) throw e;
      if (this.context !== C) return;
      this.loaded = null;
      replace(this.msg, errorBox(e, `the per-example norms of ${x.layer}`));
    }
  }

  /** Another series in the selector: its records over the same range, drawn at the same step. */
  async _pick(key) {
    const C = this.context;
    const x = C && C.choices.find((c) => c.key === key);
    if (!x) return;
    this.picked = { run: C.run, layer: C.layer, key };
    this.el.dataset.series = key;
    clear(this.top);
    try {
      await this._fetch(x);
    } catch (e) {
      if (!isAbort(e)) throw e;
    }
    if (this.context === C && this.drawn) this.draw(this.drawn.state, this.drawn.step);
  }

  /** Draw the spread, mark `step`, and name the largest examples there (fetched once per step). */
  draw(state, step) {
    this.drawn = { state, step };
    const L = this.loaded;
    if (!L) return;
    const b = L.body;
    const median = b.binned ? b.median_max : b.median;
    const n = b.binned ? b.counts.reduce((a, c) => a + c, 0) : b.steps.length;
    const last = b.examples.filter((v) => v !== null).slice(-1)[0];
    const what = L.series.source === "weight" ? `${L.series.target} · weight ${L.series.layer}` : `${L.series.target} · ${L.series.source}`;
    this.info.textContent = `${what}: the L2 norm of each example's own gradient, over the ${last ?? "?"} examples of a batch` +
      (b.binned ? ` — ${b.steps.length} bins of ${n} steps (each bin's smallest min and largest max)` : "");
    // The series' own colour (red means NaN in this tab), told apart by the dash: max dashed, min dotted.
    const color = this.colorOf(L.series);
    this.chart.update({
      log: state.log,
      smoothing: smoothing(),
      marker: step,
      xLabel: "step",
      bands: [{ name: "min–max", color, xs: b.steps, lo: b.min, hi: b.max }],
      series: [
        { name: "max", color, xs: b.steps, ys: b.max, width: 1.3, dash: "6 3" },
        { name: b.binned ? "median (bin's largest)" : "median", color, xs: b.steps, ys: median, width: 1.8 },
        { name: "min", color, xs: b.steps, ys: b.min, width: 1.3, dash: "1.5 2.5" },
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
      api.examples({ run: L.run, layer: x.layer, target: x.target, source: x.source, step }).then(
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
    const table = h("table", { class: "lg-stats-table lg-example-table", dataset: { step, series: L.series.key } });
    table.appendChild(h("thead", null, h("tr", null, h("th", { text: "rank" }), h("th", { text: "batch position" }), h("th", { text: "norm ‖g_i‖" }), h("th", { text: "share of Σ‖g_i‖²" }))));
    const tbody = h("tbody");
    at.top.forEach((t, k) => {
      const share = at.sum_sq && t.norm !== null ? (t.norm * t.norm) / at.sum_sq : null;
      tbody.appendChild(h("tr", { dataset: { position: t.position, rank: k + 1 } },
        h("td", { text: String(k + 1) }),
        h("td", { class: "lg-example-position", text: String(t.position) }),
        h("td", { text: fmtNum(t.norm), "data-value": t.norm === null ? null : String(t.norm) }),
        h("td", { text: share === null ? "—" : `${(100 * share).toFixed(1)}%` })));
    });
    table.appendChild(tbody);
    const share = at.top_share === null ? "—" : `${(100 * at.top_share).toFixed(1)}%`;
    const head = h("div", { class: "lg-example-head", text: `Step ${step}: the largest of ${at.examples} examples carries ${share} of the layer's per-example gradient energy; median norm ${fmtNum(at.median)}.` });
    replace(this.top, head, table);
  }
}
