// Anomaly rules of the gradient-flow overview: the ONLY place they are coded in the
// tab. docs/ANOMALIES.md states the same rules in prose (with the thresholds) so that
// other readers (e.g. a terminal report) can apply exactly the same ones.
//
// Input: for one run, target and source, the matrices (layers x steps, as the
// `matrix` route returns them, null for "no record or not finite") of
//   rms        = norm / sqrt(number of finite elements)   (per-element size; compares layers of any size;
//                null when there is no finite element or no gradient)
//   norm       = L2 norm of the finite elements (0 for "no gradient" records)
//   nonfinite  = NaN + Inf + -Inf count
//   zero_frac  = exact zeros / elements
// Output: one flag set per cell, a summary per layer and for the run.

export const THRESHOLDS = Object.freeze({
  // vanishing: rms < VANISH_REL x (largest rms of any layer at that step)
  VANISH_REL: 1e-3,
  // exploding: rms > EXPLODE_ABS ...
  EXPLODE_ABS: 1e3,
  // ... or rms > EXPLODE_GROWTH x (the layer's baseline: median of its first BASELINE_STEPS finite, > 0 rms values),
  // for steps after that baseline
  EXPLODE_GROWTH: 1e2,
  BASELINE_STEPS: 5,
  // dead: norm == 0 (no gradient at all, or all zero) or zero_frac >= DEAD_ZERO_FRAC
  DEAD_ZERO_FRAC: 0.99,
});

export const FLAG = Object.freeze({ NONFINITE: 1, VANISHING: 2, EXPLODING: 4, DEAD: 8 });

export const FLAG_INFO = [
  { flag: FLAG.NONFINITE, key: "nonfinite", label: "non-finite", rule: "NaN or ±Inf in the gradient" },
  {
    flag: FLAG.EXPLODING,
    key: "exploding",
    label: "exploding",
    rule: `RMS > ${THRESHOLDS.EXPLODE_ABS}, or > ${THRESHOLDS.EXPLODE_GROWTH}× the layer's first ${THRESHOLDS.BASELINE_STEPS} logged steps`,
  },
  {
    flag: FLAG.VANISHING,
    key: "vanishing",
    label: "vanishing",
    rule: `RMS < ${THRESHOLDS.VANISH_REL}× the largest layer RMS at that step`,
  },
  {
    flag: FLAG.DEAD,
    key: "dead",
    label: "dead",
    rule: `gradient all zero (or none), or ≥ ${100 * THRESHOLDS.DEAD_ZERO_FRAC}% exact zeros`,
  },
];

/** The statistics the rules need (the `matrix` route's `stat` names). */
export const REQUIRED_STATS = ["norm", "rms", "nonfinite", "zero_frac"];

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

function median(values) {
  const a = [...values].sort((x, y) => x - y);
  const m = a.length >> 1;
  return a.length % 2 ? a[m] : (a[m - 1] + a[m]) / 2;
}

/**
 * @param {{rms: (number|null)[][], norm: (number|null)[][], nonfinite: (number|null)[][], zero_frac: (number|null)[][]}} m
 * @param {number} rows  number of layers
 * @param {number} cols  number of steps
 * @returns {{flags: Uint8Array, layers: object[], maxRms: Float64Array}}
 *   flags[i * cols + j] for layer i at step j (bit set of FLAG).
 */
export function detect(m, rows, cols) {
  const T = THRESHOLDS;
  const flags = new Uint8Array(rows * cols);
  const rms = m.rms || [];
  const norm = m.norm || [];
  const nonfinite = m.nonfinite || [];
  const zeroFrac = m.zero_frac || [];

  // Largest positive rms per step, over layers (needs two layers to compare).
  const maxRms = new Float64Array(cols).fill(NaN);
  const counted = new Uint16Array(cols);
  for (let i = 0; i < rows; i++) {
    const row = rms[i] || [];
    for (let j = 0; j < cols; j++) {
      const r = row[j];
      if (isNum(r) && r > 0) {
        counted[j] = Math.min(65535, counted[j] + 1);
        if (!(maxRms[j] >= r)) maxRms[j] = r;
      }
    }
  }

  const layers = [];
  for (let i = 0; i < rows; i++) {
    const r = rms[i] || [];
    const nm = norm[i] || [];
    const nf = nonfinite[i] || [];
    const zf = zeroFrac[i] || [];
    // Baseline for growth: median of the first BASELINE_STEPS finite positive rms values.
    const firstValues = [];
    let baselineEnd = -1;
    for (let j = 0; j < cols && firstValues.length < T.BASELINE_STEPS; j++) {
      if (isNum(r[j]) && r[j] > 0) {
        firstValues.push(r[j]);
        baselineEnd = j;
      }
    }
    const baseline = firstValues.length === T.BASELINE_STEPS ? median(firstValues) : NaN;
    const summary = { firstNonfinite: null, count: { nonfinite: 0, vanishing: 0, exploding: 0, dead: 0 }, latest: 0, latestStep: null, recorded: 0 };
    for (let j = 0; j < cols; j++) {
      const v = r[j];
      const n = nf[j];
      const z = zf[j];
      const recorded = isNum(v) || isNum(nm[j]) || isNum(n) || isNum(z);
      if (!recorded) continue;
      let f = 0;
      if (isNum(n) && n > 0) f |= FLAG.NONFINITE;
      if (!f && (nm[j] === 0 || (isNum(z) && z >= T.DEAD_ZERO_FRAC))) f |= FLAG.DEAD;
      if (!f && isNum(v) && v > 0) {
        if (counted[j] >= 2 && v < T.VANISH_REL * maxRms[j]) f |= FLAG.VANISHING;
        if (v > T.EXPLODE_ABS || (j > baselineEnd && v > T.EXPLODE_GROWTH * baseline)) f |= FLAG.EXPLODING;
      }
      flags[i * cols + j] = f;
      summary.recorded++;
      summary.latest = f;
      summary.latestStep = j;
      if (f & FLAG.NONFINITE) {
        summary.count.nonfinite++;
        if (summary.firstNonfinite === null) summary.firstNonfinite = j;
      }
      if (f & FLAG.VANISHING) summary.count.vanishing++;
      if (f & FLAG.EXPLODING) summary.count.exploding++;
      if (f & FLAG.DEAD) summary.count.dead++;
    }
    layers.push(summary);
  }
  return { flags, layers, maxRms };
}

/** The first step (column) with a non-finite gradient in any layer, and those layers. */
export function firstNonfinite(result) {
  let col = null;
  for (const l of result.layers) if (l.firstNonfinite !== null && (col === null || l.firstNonfinite < col)) col = l.firstNonfinite;
  if (col === null) return null;
  const layers = [];
  result.layers.forEach((l, i) => {
    if (l.firstNonfinite === col) layers.push(i);
  });
  return { col, layers };
}

/** Names of the flags set in `f`. */
export function flagNames(f) {
  return FLAG_INFO.filter((x) => f & x.flag).map((x) => x.label);
}
