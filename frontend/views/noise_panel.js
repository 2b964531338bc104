// The gradient noise scale chart of one run (its overview) or several (compare): the `noise_scale` route's
// B_simple for the smoothing slider's weight (`estimate`: computed by the plugin only, so that the Runs view's
// "noise scale at the end" is this line's last value), and, for one run, the per-step ratio behind it.
// Hidden when no run asked for has the scalars, so nothing changes for runs without them.

import { api, isAbort } from "../api.js";
import { paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, replace } from "../dom.js";
import { fmtPercent } from "../format.js";
import { undefinedRanges } from "../noise.js";
import { onSmoothing, smoothing } from "../smoothing.js";
import { errorBox } from "./common.js";
import { SmoothingControl } from "./smoothing_control.js";

const UNDEFINED_WHY = "shaded: the averaged |G|² is ≤ 0 there (the noise outweighs the mean gradient), so B_simple has no positive value";
const RAW_WHY = "there the step's |G|² estimate came out below 0";
// Why the line is not the average of the grey points: said on the chart (one run).
const RATIO_WHY =
  "The line is the ratio of the two averages, EMA(tr Σ) / EMA(|G|²), not an average of the grey per-step ratios: " +
  "a step's |G|² estimate is noisy, and the steps where it comes out large give small ratios, so the grey points " +
  "sit below the line where the noise outweighs the signal. The smoothing slider sets the averages' weight.";

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
    this.why = h("div", { class: "lg-muted lg-noise-why" });
    const head = h(
      "div",
      { class: "lg-panel-head" },
      h("h3", { class: "lg-panel-title", text: "Gradient noise scale B_simple = tr(Σ) / |G|²" }),
      this.smoothing.el,
    );
    this.el = h("div", { class: "lg-panel lg-panel-noise", hidden: true, dataset: { panel: "noise-scale", smoothing: String(smoothing()) } }, head, this.info, this.why, this.msg);
    this.chart = new LineChart(this.el, { height: 240, alwaysLegend: true, onHover });
    onSmoothing(() => {
      if (this.el.isConnected && this.runs) this.show(this.runs); // the plugin averages with the new weight
    });
  }
  /** Ask for `runs`' scalars (quietly again on a poll); hide the panel when none has them. */
  async show(runs) {
    this.runs = runs;
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
      const w = smoothing();
      this.body = await api.noiseScale({ run: runs, smoothing: String(Number(w.toFixed(6))) }, { signal: abort.signal });
      this.el.dataset.smoothing = String(this.body.smoothing);
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
    let undefinedSteps = 0;
    let steps = 0;
    b.series.forEach((r) => {
      const color = this.colorOf(r.run, b.runs.indexOf(r.run));
      const label = b.runs.length > 1 ? `${r.run} ` : "";
      // The raw ratio where the signal estimate is below 0 too (negative: marked under the log axis, never dropped).
      const raw = r.noise_scale.map((v, k) => (v !== null ? v : r.signal[k] < 0 && typeof r.trace[k] === "number" ? r.trace[k] / r.signal[k] : null));
      if (b.runs.length === 1) series.push({ name: `${label}raw tr(Σ)/|G|²`, color: "#b0b0b0", xs: r.steps, ys: raw, width: 1 });
      const ys = r.estimate;
      steps += ys.length;
      undefinedSteps += ys.filter((v) => v === null).length;
      series.push({ name: `${label}EMA(tr Σ) / EMA(|G|²)`, key: r.run, color, xs: r.steps, ys, width: 2 });
      for (const [x0, x1] of undefinedRanges(r.steps, ys)) xBands.push({ x0, x1, title: `${label}steps ${x0}–${x1}: ${UNDEFINED_WHY}` });
    });
    const cover = b.series.map((r) => [r.run, r.coverage.filter((v) => v !== null).slice(-1)[0]]).filter(([, c]) => c !== undefined && c < 1);
    const bits = ["the batch size beyond which larger batches stop paying (McCandlish et al. 2018)"];
    if (b.missing.length) bits.push(`not recorded in ${b.missing.join(", ")}`);
    for (const [run, c] of cover) bits.push(`${b.runs.length > 1 ? `${run}: ` : ""}covers ${fmtPercent(c)} of the trainable parameters`);
    if (xBands.length) bits.push(`${UNDEFINED_WHY} (${fmtPercent(undefinedSteps / steps)} of the steps)`);
    this.info.textContent = bits.join(" · ");
    this.why.textContent = b.runs.length === 1 ? RATIO_WHY : "";
    this.chart.update({ series, log: true, xBands, nonPositiveWhy: RAW_WHY, xLabel: "step", empty: "no step with a positive averaged signal" });
  }
}
