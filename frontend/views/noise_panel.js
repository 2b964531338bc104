// The gradient noise scale chart of one run (its overview) or several (compare): the
// `noise_scale` route's raw trace and signal, smoothed here, with a smoothing slider like TensorBoard's.
// Hidden when no run asked for has the scalars, so nothing changes for runs without them.

import { api, isAbort } from "../api.js";
import { paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, replace } from "../dom.js";
import { smoothedNoiseScale } from "../noise.js";
import { errorBox } from "./common.js";

const DEFAULT_WEIGHT = 0.6; // TensorBoard's Scalars dashboard's default smoothing

export class NoiseScalePanel {
  constructor() {
    this.weight = DEFAULT_WEIGHT;
    this.body = null;
    this.key = null;
    this.abort = null;
    this.slider = h("input", {
      type: "range", min: "0", max: "0.999", step: "0.001", value: String(DEFAULT_WEIGHT), class: "lg-noise-smoothing",
      "aria-label": "smoothing",
      on: { input: () => this._smoothing(Number(this.slider.value)) },
    });
    this.sliderValue = h("span", { class: "lg-noise-smoothing-value", text: DEFAULT_WEIGHT.toFixed(3) });
    this.info = h("div", { class: "lg-muted" });
    this.msg = h("div");
    const head = h(
      "div",
      { class: "lg-panel-head" },
      h("h3", { class: "lg-panel-title", text: "Gradient noise scale B_simple = tr(Σ) / |G|²" }),
      h("label", { class: "lg-field" }, h("span", { class: "lg-field-label", text: "Smoothing" }), this.slider, this.sliderValue),
    );
    this.el = h("div", { class: "lg-panel lg-panel-noise", hidden: true, dataset: { panel: "noise-scale" } }, head, this.info, this.msg);
    this.chart = new LineChart(this.el, { height: 220, alwaysLegend: true });
  }

  /** Ask for `runs`' scalars (quietly again on a poll); hide the panel when none has them. */
  async show(runs) {
    const key = JSON.stringify(runs);
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    if (key !== this.key) {
      this.body = null;
      this.key = key;
    }
    if (!runs.length) {
      this.el.hidden = true;
      return;
    }
    try {
      this.body = await api.noiseScale({ run: runs }, { signal: abort.signal });
      replace(this.msg);
    } catch (e) {
      if (isAbort(e)) return;
      this.body = null;
      replace(this.msg, errorBox(e, "the gradient noise scale"));
    } finally {
      if (this.abort === abort) this.abort = null;
    }
    this.el.hidden = Boolean(this.body && !this.body.series.length); // none of these runs recorded it
    this.draw();
  }

  _smoothing(w) {
    this.weight = w;
    this.sliderValue.textContent = w.toFixed(3);
    this.el.dataset.smoothing = String(w);
    this.draw();
  }

  draw() {
    const b = this.body;
    if (!b || !b.series.length) return;
    const series = [];
    b.series.forEach((r) => {
      const color = paletteColor(b.runs.indexOf(r.run));
      const label = b.runs.length > 1 ? `${r.run} ` : "";
      if (b.runs.length === 1) series.push({ name: `${label}raw tr(Σ)/|G|²`, color: "#c7c7c7", xs: r.steps, ys: r.noise_scale, width: 1 });
      series.push({ name: `${label}EMA(tr Σ) / EMA(|G|²)`, color, xs: r.steps, ys: smoothedNoiseScale(r.trace, r.signal, this.weight), width: 2 });
    });
    const cover = b.series.map((r) => [r.run, r.coverage.filter((v) => v !== null).slice(-1)[0]]).filter(([, c]) => c !== undefined && c < 1);
    const bits = ["the batch size beyond which larger batches stop paying (McCandlish et al. 2018)"];
    if (b.missing.length) bits.push(`not recorded in ${b.missing.join(", ")}`);
    for (const [run, c] of cover) bits.push(`${b.runs.length > 1 ? `${run}: ` : ""}covers ${(100 * c).toFixed(0)}% of the trainable parameters`);
    this.info.textContent = bits.join(" · ");
    this.chart.update({ series, log: true, xLabel: "step", empty: "no step with a positive averaged signal" });
  }
}
