// The smoothing slider (0 … 0.999, like TensorBoard's): every instance shows and sets the one shared weight.

import { h } from "../dom.js";
import { onSmoothing, setSmoothing, smoothing } from "../smoothing.js";

export class SmoothingControl {
  /** `cls`: a class for the range input (tests and styles find a view's own slider by it). */
  constructor(cls = "") {
    this.input = h("input", {
      type: "range", min: "0", max: "0.999", step: "0.001", value: String(smoothing()), class: cls,
      "aria-label": "smoothing",
      title: "smoothing of the charts over steps (TensorBoard's: an exponential moving average); the raw values stay drawn, faint",
      on: { input: () => setSmoothing(this.input.value) },
    });
    this.value = h("span", { class: `${cls ? `${cls}-value ` : ""}lg-smoothing-value`, text: smoothing().toFixed(3) });
    this.el = h("label", { class: "lg-field lg-smoothing-field" }, h("span", { class: "lg-field-label", text: "Smoothing" }),
      h("span", { class: "lg-smoothing" }, this.input, this.value));
    onSmoothing((w) => this._show(w));
  }

  _show(w) {
    if (Number(this.input.value) !== w) this.input.value = String(w);
    this.value.textContent = w.toFixed(3);
  }
}
