// The gradient noise scale chart of one run (its overview) or several (compare): the
// `noise_scale` route's raw trace and signal, smoothed here, with a smoothing slider like TensorBoard's.
// Hidden when no run asked for has the scalars, so nothing changes for runs without them.

import { api, isAbort } from "../api.js";
import { paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, replace } from "../dom.js";
import { fmtPercent } from "../format.js";
import { smoothedNoiseScale, undefinedRanges } from "../noise.js";
import { onSmoothing, smoothing } from "../smoothing.js";
import { errorBox } from "./common.js";
import { SmoothingControl } from "./smoothing_control.js";

const UNDEFINED_WHY = "shaded: the averaged |G|² is ≤ 0 there (the noise outweighs the mean gradient), so B_simple has no positive value";
const RAW_WHY = "there the step's |G|² estimate came out below 0";

export class NoiseScalePanel {
  /**
   * @param {{onHover?: (run: string|null) => void, colorOf?: (run: string, k: number) => string}} opts
   * `colorOf`: each run's colour (compare's); by default the palette by position. `onHover`: as LineChart's.
   */
  constructor({ onHover, colorOf } = {}) {
    this.colorOf = colorOf || ((run, k) => paletteColor(k));
    this.body = null;
    this.key = null;
    this.abort = null;
    this.smoothing = new SmoothingControl("lg-noise-smoothing");
    this.info = h("div", { class: "lg-muted" });
    this.msg = h("div");
    const head = h(
      "div",
      { class: "lg-panel-head" },
      h("h3", { class: "lg-panel-title", text: "Gradient noise scale B_simple = tr(Σ) / |G|²" }),
      this.smoothing.el,
    );
    this.el = h("div", { class: "lg-panel lg-panel-noise", hidden: true, dataset: { panel: "noise-scale", smoothing: String(smoothing()) } }, head, this.info, this.msg);
    this.chart = new LineChart(this.el, { height: 240, alwaysLegend: true, onHover });
    onSmoothing((w) => {
      this.el.dataset.smoothing = String(w);
      if (this.el.isConnected) this.draw();
    });
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

  draw() {
    const b = this.body;
    if (!b || !b.series.length) return;
    const series = [];
    const xBands = [];
    const w = smoothing();
    b.series.forEach((r) => {
      const color = this.colorOf(r.run, b.runs.indexOf(r.run));
      const label = b.runs.length > 1 ? `${r.run} ` : "";
      // The raw ratio where the signal estimate is below 0 too (negative: marked under the log axis, never dropped).
      const raw = r.noise_scale.map((v, k) => (v !== null ? v : r.signal[k] < 0 && typeof r.trace[k] === "number" ? r.trace[k] / r.signal[k] : null));
      if (b.runs.length === 1) series.push({ name: `${label}raw tr(Σ)/|G|²`, color: "#b0b0b0", xs: r.steps, ys: raw, width: 1 });
      const ys = smoothedNoiseScale(r.trace, r.signal, w);
      series.push({ name: `${label}EMA(tr Σ) / EMA(|G|²)`, key: r.run, color, xs: r.steps, ys, width: 2 });
      for (const [x0, x1] of undefinedRanges(r.steps, ys)) xBands.push({ x0, x1, title: `${label}steps ${x0}–${x1}: ${UNDEFINED_WHY}` });
    });
    const cover = b.series.map((r) => [r.run, r.coverage.filter((v) => v !== null).slice(-1)[0]]).filter(([, c]) => c !== undefined && c < 1);
    const bits = ["the batch size beyond which larger batches stop paying (McCandlish et al. 2018)"];
    if (b.missing.length) bits.push(`not recorded in ${b.missing.join(", ")}`);
    for (const [run, c] of cover) bits.push(`${b.runs.length > 1 ? `${run}: ` : ""}covers ${fmtPercent(c)} of the trainable parameters`);
    if (xBands.length) bits.push(UNDEFINED_WHY);
    this.info.textContent = bits.join(" · ");
    this.chart.update({ series, log: true, xBands, nonPositiveWhy: RAW_WHY, xLabel: "step", empty: "no step with a positive averaged signal" });
  }
}
