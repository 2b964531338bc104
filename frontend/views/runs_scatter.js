// "Which hyperparameter explains it": one point per run, a hyperparameter on x (linear, log, or categories for
// strings), a health measure of the `sweep` answer on y, coloured by a second hyperparameter with a legend.

import { paletteColor, PALETTE, VIRIDIS, lutIndex } from "../charts/colors.js";
import { ScatterChart } from "../charts/scatter.js";
import { h, replace, select, setOptions } from "../dom.js";
import { fmtNum } from "../format.js";
import { distinctValues, hparamOf, isEmpty, xAxisOf } from "../sweep.js";
import { cellText, measureValue } from "./runs_table.js";
import { field, Toggle } from "./common.js";

const NO_VALUE = "#9aa0a6";
const LEGEND_CHARS = 40;

function shown(v) {
  const t = cellText(v);
  return t.length > LEGEND_CHARS ? `${t.slice(0, LEGEND_CHARS)}…` : t;
}

/** Colours of hyperparameter `name`'s values: a palette for a few, viridis for many numbers. */
export function colouring(rows, name) {
  if (!name) return { color: () => PALETTE[0], legend: [] };
  const values = distinctValues(rows, name).filter((v) => !isEmpty(v));
  const missing = rows.some((r) => isEmpty(hparamOf(r, name)));
  const none = missing ? [{ label: "(no value)", color: NO_VALUE, title: `runs without a value of '${name}'` }] : [];
  const numeric = values.length > PALETTE.length && values.every((v) => typeof v === "number");
  if (numeric) {
    const [lo, hi] = [values[0], values[values.length - 1]];
    const css = (v) => VIRIDIS.css[lutIndex((v - lo) / (hi - lo || 1))];
    return {
      color: (v) => (isEmpty(v) ? NO_VALUE : css(v)),
      legend: [{ label: fmtNum(lo), color: css(lo), title: String(lo) }, { label: fmtNum(hi), color: css(hi), title: String(hi) }, ...none],
    };
  }
  const index = new Map(values.map((v, i) => [JSON.stringify(v), i]));
  return {
    color: (v) => (isEmpty(v) ? NO_VALUE : paletteColor(index.get(JSON.stringify(v)))),
    legend: [...values.map((v, i) => ({ label: shown(v), color: paletteColor(i), title: cellText(v) })), ...none],
  };
}

/** The x a sweep is read by first: a number that varies (a learning rate), else a hyperparameter that varies. */
function defaultX(answer, names) {
  const varies = names.filter((n) => distinctValues(answer.runs, n).filter((v) => !isEmpty(v)).length > 1);
  return varies.find((n) => !xAxisOf(answer, n).categorical) || varies[0] || names[0];
}

/** The first measure that at least two runs have (a NaN step is often nobody's). */
function defaultY(answer, measures) {
  const m = measures.find((x) => answer.runs.filter((r) => typeof measureValue(r, x.key) === "number").length > 1);
  return (m || measures[0]).key;
}

/** Whether a positive hyperparameter spans two decades or more: read on a log axis unless the person says not. */
function spansDecades(answer, name) {
  const values = distinctValues(answer.runs, name).filter((v) => typeof v === "number" && v > 0);
  return values.length > 1 && values[values.length - 1] / values[0] >= 100;
}

export class ScatterPanel {
  /** @param {{app: object, onOpen: (run: string) => void}} opts */
  constructor({ app, onOpen }) {
    this.app = app;
    this.xSelect = select([], null, (v) => app.setState({ sx: v }), { "aria-label": "hyperparameter on x" });
    this.ySelect = select([], null, (v) => app.setState({ sy: v }), { "aria-label": "health measure on y" });
    this.cSelect = select([], null, (v) => app.setState({ sc: v }), { "aria-label": "colour by" });
    this.logToggle = new Toggle([["0", "linear"], ["1", "log"]], "0", (v) => app.setState({ xlog: v === "1" }), "x scale");
    this.legend = h("div", { class: "lg-legend lg-scatter-legend" });
    this.chart = new ScatterChart(h("div"), { height: 320, onPick: (p) => onOpen(p.key) });
    this.el = h(
      "div",
      { class: "lg-panel lg-panel-scatter" },
      h("div", { class: "lg-panel-head" },
        h("h3", { class: "lg-panel-title", text: "Which hyperparameter explains it" }),
        field("X", this.xSelect, "lg-field-wide"),
        field("X scale", this.logToggle.el),
        field("Y", this.ySelect, "lg-field-wide"),
        field("Colour by", this.cSelect)),
      this.chart.root,
      this.legend,
    );
  }

  /** Draw `rows` (the runs the view shows) of `answer` with the state's choices (defaults: the first ones). */
  show(answer, rows, state) {
    const names = (answer.hparams || []).map((x) => x.name);
    const measures = answer.measures || [];
    this.el.hidden = !names.length || !measures.length;
    if (this.el.hidden) return;
    const xName = names.includes(state.sx) ? state.sx : defaultX(answer, names);
    const yKey = measures.some((m) => m.key === state.sy) ? state.sy : defaultY(answer, measures);
    const cName = state.sc === "" ? "" : names.includes(state.sc) ? state.sc : names.find((n) => n !== xName) || "";
    setOptions(this.xSelect, names.map((n) => [n, n]), xName);
    setOptions(this.ySelect, measures.map((m) => [m.key, m.label]), yKey);
    setOptions(this.cSelect, [["", "(one colour)"], ...names.map((n) => [n, n])], cName);
    const axis = xAxisOf(answer, xName);
    this.logToggle.disable("1", axis.logReason);
    const log = !axis.logReason && (state.xlog ?? spansDecades(answer, xName));
    this.logToggle.set(log ? "1" : "0");
    const yLabel = measures.find((m) => m.key === yKey).label;
    const plotted = rows.filter((r) => {
      const xv = hparamOf(r, xName);
      const yv = measureValue(r, yKey);
      return !isEmpty(xv) && typeof yv === "number" && !isEmpty(yv) && (axis.categorical || typeof xv === "number");
    });
    const left = rows.length - plotted.length;
    const colours = colouring(plotted, cName); // the legend names the colours of the points drawn
    const points = [];
    for (const r of plotted) {
      const xv = hparamOf(r, xName);
      const yv = measureValue(r, yKey);
      const cv = cName ? hparamOf(r, cName) : undefined;
      const rows_ = [[xName, cellText(xv)], [yLabel, fmtNum(yv)]];
      if (cName) rows_.push([cName, cellText(cv)]);
      points.push({ key: r.run, x: xv, y: yv, color: colours.color(cv), title: r.run, rows: rows_ });
    }
    this.chart.update({
      points,
      x: { label: xName, log, categories: axis.categorical ? axis.categories : null, format: cellText },
      y: { label: yLabel },
      empty: `no run shown has both a value of '${xName}' and of ${yLabel}`,
      note: left ? `${left} run${left > 1 ? "s" : ""} without a value of '${xName}' or of ${yLabel}: not shown` : "",
    });
    replace(
      this.legend,
      cName ? h("span", { class: "lg-legend-title", text: cName, title: cName }) : null,
      colours.legend.map((x) => h("span", { class: "lg-legend-item", title: x.title }, h("span", { class: "lg-swatch", style: { background: x.color } }), h("span", { class: "lg-legend-name", text: x.label }))),
    );
    this.el.dataset.x = xName;
    this.el.dataset.y = yKey;
  }
}
