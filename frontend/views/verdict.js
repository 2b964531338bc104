// A layer's verdict as a chip: the `anomalies` route's `layers[].verdict`, decided once by
// tb_layergrad/reader/anomalies.py. The overview's rows and the layer view show the same state, text and
// reason, as `tb-layergrad report`'s `verdict` column does; nothing is decided here.

import { flagInfo, stateChip } from "../anomalies.js";
import { COLORS } from "../charts/colors.js";
import { h } from "../dom.js";

/**
 * Why a layer has its verdict, in words (a chip's title).
 * @param {{state: string, now: boolean, step: number|null}} v the route's verdict
 * @param {{counts: object, recorded: number, thresholds: object, originLine: string}} ctx the route's counts of
 *   the layer, its recorded steps, the answer's `thresholds` and `summary.origin.line`
 */
export function verdictWhy(v, { counts = {}, recorded = 0, thresholds = {}, originLine = "" } = {}) {
  const n = Math.max(1, recorded);
  if (v.state === "nan_origin") return `the run's first NaN/Inf was born in this layer at step ${v.step}: ${originLine || ""}`;
  if (v.state === "nonfinite") return `non-finite gradient at ${counts.nonfinite ?? "?"} of ${n} steps, first at step ${v.step} (reached from where it was born)`;
  if (v.state === "vanishing_over_steps") {
    const T = thresholds;
    return `the gradient fell at least 10^${T.STEP_DECAY_DECADES} times from its first ${T.EDGE_STEPS} logged steps to its last ${T.EDGE_STEPS} while the target's value fell by less than ${Math.round(100 * T.TARGET_FALL)}% (not convergence); first 10^${T.STEP_DECAY_DECADES} below at step ${v.step}`;
  }
  if (v.state === "vanishing_through_time") return `the gradient reaching the first timestep is at least 10^${thresholds.TIME_DECAY_DECADES} times smaller than at the last`;
  if (v.state === "dominated") return `one example carried most of the layer's gradient at some steps, the worst at step ${v.step} (docs/ANOMALIES.md, "One example dominates")`;
  if (v.state === "ok") return "none of the rules holds (docs/ANOMALIES.md)";
  const info = flagInfo(thresholds).find((x) => x.key === v.state);
  return `${v.state} at ${counts[v.state] ?? "?"} of ${n} steps${v.now ? ", including the latest" : ""}: ${info ? info.rule : ""}`;
}

// A verdict state in words: the chip texts of tb_layergrad/reader/anomalies.py's LABELS, without a step.
const STATE_WORDS = {
  nan_origin: "NaN/Inf born here",
  nonfinite: "NaN/Inf",
  vanishing_over_steps: "vanishing over steps",
  vanishing_through_time: "vanishing through time",
  dominated: "one example dominates",
};

/** A verdict state ("nan_origin", "dead", ...) in a chip's words, for a verdict the route names by state only. */
export function verdictWords(state) {
  return STATE_WORDS[state] || state;
}

/** Where the first NaN/Inf was born, not merely reached: the non-finite chip's colours inverted. */
export function markOrigin(chip) {
  Object.assign(chip.style, { background: "#fff", color: COLORS.nonfinite, border: `2px solid ${COLORS.nonfinite}`, fontWeight: "700" });
  return chip;
}

/**
 * The layer view's verdict line: per series of the layer (its outputs and weights, per target), a chip with
 * the series' label and the verdict's text (e.g. "loss · output: NaN/Inf born here @17"); "ok" uncoloured.
 * A chip opens the step its verdict names; a layer a NaN reached gets a link to where it was born.
 * @param {{series: object, verdict: object, why: string, origin: object|null}[]} items
 * @param {(step: number, layer?: string) => void} open
 * @param {(layer: string) => boolean} inRun whether the run lists `layer` (the origin may be the loss)
 */
export function verdictLine(items, open, inRun) {
  const out = [];
  for (const { series, verdict: v, why, origin } of items) {
    const kind = stateChip(v.state);
    const go = v.step !== null && v.step !== undefined && kind;
    const chip = h("span", {
      class: `lg-chip${kind ? ` lg-chip-${kind}` : " lg-chip-ok"}${go ? " lg-chip-link" : ""}`,
      dataset: { state: v.state, series: series.key, step: v.step ?? "" },
      title: go ? `${why} — click: step ${v.step}` : why,
      text: `${series.label}: ${v.text}`,
      on: go ? { click: () => open(v.step) } : null,
    });
    out.push(v.state === "nan_origin" ? markOrigin(chip) : chip);
    if (v.state === "nonfinite" && origin && origin.origin !== series.layer && inRun(origin.origin) && origin.step !== null) {
      out.push(h("button", {
        type: "button",
        class: "lg-link lg-origin-link",
        dataset: { origin: origin.origin, step: origin.step, pass: origin.pass ?? "" },
        title: origin.line,
        text: `born in ${origin.origin} at step ${origin.step} →`,
        on: { click: () => open(origin.step, origin.origin) },
      }));
    }
  }
  return out;
}
