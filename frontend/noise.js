// The gradient noise scale as the tab draws it: the ratio of two exponential moving
// averages, of the trace tr(Σ) and of the signal |G|², each as TensorBoard's Scalars dashboard
// smooths (a debiased EMA, so that the first steps are not pulled towards 0). Why not the EMA of the
// raw ratio: each estimate is unbiased but noisy, the signal's often <= 0 at a step (no raw ratio
// there), and the ratio of two noisy numbers is biased; the two averages are good estimates first.
// Pure functions, no DOM.

import { ema } from "./smoothing.js";

export { ema };

/** EMA(trace) / EMA(signal) per step; null while the averaged signal is <= 0 or either is missing. */
export function smoothedNoiseScale(trace, signal, w) {
  const t = ema(trace, w);
  const g = ema(signal, w);
  return t.map((v, k) => (v !== null && g[k] !== null && g[k] > 0 ? v / g[k] : null));
}

/** [first, last] step ranges where the estimate is not defined (`ys` null) though the run has a record. */
export function undefinedRanges(xs, ys) {
  const out = [];
  let start = null;
  for (let k = 0; k < xs.length; k++) {
    if (ys[k] === null) {
      if (start === null) start = k;
    } else if (start !== null) {
      out.push([xs[start], xs[k - 1]]);
      start = null;
    }
  }
  if (start !== null) out.push([xs[start], xs[xs.length - 1]]);
  return out;
}
