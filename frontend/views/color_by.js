// "Colour by" for compared runs: per run (the default) or by a hyperparameter the runs logged with
// TensorBoard's HParams API (the `hparams` route), with a legend that shows the scale — a colour bar for
// numbers (saying whether it is log), a swatch per value for anything else — and names the runs without one.

import { api, isAbort } from "../api.js";
import { colorByHparam, colorByRun, NO_VALUE, sequentialColor } from "../charts/run_colors.js";
import { h, replace, select, setOptions } from "../dom.js";
import { fmtNum } from "../format.js";
import { errorBox, field } from "./common.js";

const BAR_STOPS = 9;

export class ColorBy {
  /** @param {(name: string|null) => void} onChange the hyperparameter chosen (null: per run). */
  constructor(onChange) {
    this.hp = null; // {sig, names, values: Map(run -> {name: value})}
    this.select = select([["", "run"]], "", (v) => onChange(v || null), { "aria-label": "colour by" });
    this.field = field("Colour by", this.select);
    this.field.hidden = true;
    this.legend = h("div", { class: "lg-color-legend", "aria-live": "polite" });
  }

  /** The runs' hyperparameters, asked again when the runs changed (`sig`); quietly none on a failure. */
  async load(sig, signal) {
    if (this.hp && this.hp.sig === sig) return;
    try {
      const b = await api.hparams({}, { signal });
      this.hp = { sig, names: b.names, values: new Map(b.runs.map((r) => [r.run, r.hparams])), error: null };
    } catch (e) {
      if (isAbort(e)) throw e;
      this.hp = { sig, names: [], values: new Map(), error: e };
    }
  }

  /** The colouring of `runs` for hyperparameter `name` (null, or one no run has: per run); draws the legend. */
  coloring(runs, name) {
    const names = this.hp ? this.hp.names : [];
    const options = [["", "run"], ...names.map((n) => [n, n])];
    if (name && !names.includes(name)) options.push([name, `${name} (no run has it)`]);
    setOptions(this.select, options, name || "");
    this.field.hidden = !names.length && !name;
    if (this.hp && this.hp.error) replace(this.legend, errorBox(this.hp.error, "the runs' hyperparameters"));
    if (!name || !names.includes(name)) {
      if (!(this.hp && this.hp.error)) replace(this.legend);
      this.legend.dataset.kind = "run";
      return colorByRun(runs);
    }
    const c = colorByHparam(name, runs, this.hp.values);
    this.legend.dataset.kind = c.kind;
    replace(this.legend, h("span", { class: "lg-legend-title", text: name }), c.kind === "sequential" ? bar(c) : categories(c), absent(c, runs));
    return c;
  }
}

/** A colour bar from the lowest to the highest value, the middle value under its middle. */
function bar(c) {
  const stops = Array.from({ length: BAR_STOPS }, (_, k) => sequentialColor(k / (BAR_STOPS - 1)));
  const mid = c.log ? Math.sqrt(c.lo * c.hi) : (c.lo + c.hi) / 2;
  return h(
    "span",
    { class: "lg-color-bar-wrap", dataset: { lo: c.lo, hi: c.hi, log: c.log ? "1" : "0" } },
    h("span", { class: "lg-color-bar", style: { background: `linear-gradient(to right, ${stops.join(", ")})` } }),
    h(
      "span",
      { class: "lg-color-bar-ticks" },
      h("span", { text: fmtNum(c.lo) }),
      h("span", { text: c.lo === c.hi ? "" : fmtNum(mid) }),
      h("span", { text: c.lo === c.hi ? "" : fmtNum(c.hi) }),
    ),
    h("span", { class: "lg-muted", text: c.lo === c.hi ? "one value" : c.log ? "log scale" : "linear scale" }),
  );
}

function categories(c) {
  return [
    ...c.categories.map((x) =>
      h("span", { class: "lg-legend-item", dataset: { value: x.label } }, h("span", { class: "lg-swatch", style: { background: x.color } }), h("span", { class: "lg-legend-name", text: x.label })),
    ),
    c.repeats ? h("span", { class: "lg-muted", text: "(colours repeat: more values than colours)" }) : null,
  ];
}

function absent(c, runs) {
  if (!c.missing.length) return null;
  const what = c.missing.length === runs.length ? "none of these runs has it" : `${c.missing.length} of ${runs.length} runs without it`;
  return h(
    "span",
    { class: "lg-legend-item lg-legend-missing", title: c.missing.join("\n") },
    h("span", { class: "lg-swatch", style: { background: NO_VALUE } }),
    h("span", { class: "lg-legend-name", text: `grey: ${what}` }),
  );
}
