// Anomaly flags of the tab, as the plugin's `anomalies` route computes them (docs/HTTP_API.md).
// The rules themselves are NOT coded here: they live in tb_layergrad/reader/anomalies.py (docs/ANOMALIES.md),
// the one implementation shared by the route, `tb-layergrad report` and notebooks. This module
// only decodes the route's answer onto the overview's grid (layers x steps) and names the flags.

export const FLAG = Object.freeze({ NONFINITE: 1, VANISHING: 2, EXPLODING: 4, DEAD: 8 });

/**
 * Flag descriptions (most serious first after non-finite), with the rule in words.
 * @param {object|null} T the `anomalies` answer's `thresholds` (the server's, the one source); without an
 *   answer yet, the rules are named without their numbers.
 */
export function flagInfo(T) {
  const rule = (words, withNumbers) => (T ? withNumbers() : words);
  return [
    { flag: FLAG.NONFINITE, key: "nonfinite", label: "non-finite", rule: "NaN or ±Inf in the gradient" },
    {
      flag: FLAG.EXPLODING,
      key: "exploding",
      label: "exploding",
      rule: rule("RMS far above a bound, or above the layer's first logged steps", () => `RMS > ${T.EXPLODE_ABS}, or > ${T.EXPLODE_GROWTH}× the layer's first ${T.BASELINE_STEPS} logged steps`),
    },
    { flag: FLAG.VANISHING, key: "vanishing", label: "vanishing", rule: rule("RMS far below the largest RMS of the layers not exploding at that step", () => `RMS < ${T.VANISH_REL}× the largest RMS of the layers not exploding at that step`) },
    { flag: FLAG.DEAD, key: "dead", label: "dead", rule: rule("gradient all zero (or none), or nearly all exact zeros", () => `gradient all zero (or none), or ≥ ${Math.round(100 * T.DEAD_ZERO_FRAC)}% exact zeros`) },
  ];
}

export const FLAG_INFO = flagInfo(null);

// A layer's verdict (the route's `layers[].verdict.state`, decided by tb_layergrad/reader/anomalies.py) -> the chip
// class that colours it. The origin of a NaN keeps the non-finite colour and gets its own mark (`isOrigin`).
const STATE_CHIP = { nan_origin: "nonfinite", nonfinite: "nonfinite", exploding: "exploding", dead: "dead", vanishing: "vanishing", vanishing_over_steps: "vanishing", vanishing_through_time: "vanishing", dominated: "dominated" };

/** The chip class of a verdict state, or null for "ok" (no chip). */
export function stateChip(state) {
  return STATE_CHIP[state] || null;
}

/** True for the verdict of the layer where the run's first NaN/Inf was born. */
export function isOrigin(verdict) {
  return Boolean(verdict) && verdict.state === "nan_origin";
}

/** The route's findings (`summary.findings`): one line each, however many layers it spans. */
export function findingsOf(body) {
  return (body && body.summary && body.summary.findings) || [];
}

/** Names of the flags set in `f`. */
export function flagNames(f) {
  return FLAG_INFO.filter((x) => f & x.flag).map((x) => x.label);
}

/** One character of a route `flags` string -> bits (0 for "." = no record). */
export function flagOf(ch) {
  return ch === "." || ch === undefined ? 0 : parseInt(ch, 16) || 0;
}

/**
 * Place an `anomalies` answer on a grid of `layers` (rows) x `steps` (columns) — the overview's
 * matrix, which may hold a step the answer does not (or the reverse) when a run grows between
 * two requests: such cells get no flag.
 * @returns {{flags: Uint8Array, layers: object[], maxRms: Float64Array, thresholds: object, info: object[]}}
 *   flags[i * cols + j]; layers[i] = {firstNonfinite (column or null), firstNonfiniteStep (step or null),
 *   count: {nonfinite, vanishing, exploding, dead}, latest (bits at the layer's last step),
 *   latestStep (column or null), recorded, dominated (the route's `dominated` entry of the layer, or null),
 *   verdict (the route's `verdict` of the layer: {state, now, step, text}, or null)}.
 */
export function fromRoute(body, layers, steps) {
  const rows = layers.length;
  const cols = steps.length;
  const flags = new Uint8Array(rows * cols);
  const maxRms = new Float64Array(cols).fill(NaN);
  const col = new Map(steps.map((s, j) => [s, j]));
  const rowOf = new Map(layers.map((l, i) => [l, i]));
  const empty = () => ({ firstNonfinite: null, firstNonfiniteStep: null, count: { nonfinite: 0, vanishing: 0, exploding: 0, dead: 0 }, latest: 0, latestStep: null, recorded: 0, dominated: null, verdict: null });
  const out = layers.map(empty);
  const thresholds = (body && body.thresholds) || null;
  if (!body) return { flags, layers: out, maxRms, thresholds, info: flagInfo(thresholds) };
  const at = body.steps.map((s) => (col.has(s) ? col.get(s) : -1));
  body.steps.forEach((s, k) => {
    const j = at[k];
    // What the vanishing rule compares with (the largest RMS of the layers not exploding), else the largest RMS.
    const ref = body.vanish_reference || body.max_rms;
    const v = ref ? ref[k] : null;
    if (j >= 0 && typeof v === "number") maxRms[j] = v;
  });
  for (const entry of body.layers) {
    const i = rowOf.get(entry.layer);
    if (i === undefined) continue;
    const text = entry.flags || "";
    for (let k = 0; k < text.length && k < at.length; k++) {
      const j = at[k];
      if (j >= 0) flags[i * cols + j] = flagOf(text[k]);
    }
    const l = out[i];
    l.count = { ...l.count, ...(entry.counts || {}) };
    l.recorded = entry.recorded || 0;
    l.verdict = entry.verdict || null;
    l.latest = (entry.now || []).reduce((f, name) => f | (FLAG[name.toUpperCase()] || 0), 0);
    l.latestStep = entry.last_step !== null && col.has(entry.last_step) ? col.get(entry.last_step) : null;
    if (entry.first_nonfinite !== null && entry.first_nonfinite !== undefined) {
      l.firstNonfiniteStep = entry.first_nonfinite;
      // The column of that step, or of the first step after it that the grid holds (TensorBoard may
      // have sampled the step itself away; the route still knows it from the `first_nonfinite` records).
      let j = col.get(entry.first_nonfinite);
      if (j === undefined) j = steps.findIndex((s) => s >= entry.first_nonfinite);
      l.firstNonfinite = j >= 0 ? j : null;
    }
  }
  // One example dominating a layer (only for runs with per-example records): not a flag bit, a finding per layer.
  for (const d of body.dominated || []) {
    const i = rowOf.get(d.layer);
    if (i !== undefined) out[i].dominated = d;
  }
  return { flags, layers: out, maxRms, thresholds, info: flagInfo(thresholds) };
}

/** The rule of "one example dominates" in words, with the route's constants (docs/ANOMALIES.md). */
export function dominatedRule(body) {
  const T = body && body.example_thresholds; // the route's, with every `dominated` answer
  if (!T) return "the largest example carries most of the layer's per-example gradient energy";
  return `the largest example carries more than ${Math.round(100 * T.DOMINANT_SHARE)}% of the layer's per-example gradient energy (batches of at least ${T.DOMINANT_MIN_EXAMPLES})`;
}

/** The first step with a non-finite gradient in any layer, and those layers (rows), or null. */
export function firstNonfinite(result) {
  let step = null;
  for (const l of result.layers) if (l.firstNonfiniteStep !== null && (step === null || l.firstNonfiniteStep < step)) step = l.firstNonfiniteStep;
  if (step === null) return null;
  const layers = [];
  result.layers.forEach((l, i) => {
    if (l.firstNonfiniteStep === step) layers.push(i);
  });
  const col = result.layers[layers[0]].firstNonfinite;
  return { step, col, layers };
}
