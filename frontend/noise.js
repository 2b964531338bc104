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

/**
 * The step ranges the smoothed line does not cover (`ys` null at some recorded step): each from the last
 * defined step before to the first defined step after (the run's ends where there is none), so that a
 * band drawn over them spans the whole gap in the line.
 */
export function undefinedRanges(xs, ys) {
  const out = [];
  let start = null;
  for (let k = 0; k < xs.length; k++) {
    if (ys[k] === null) {
      if (start === null) start = k;
    } else if (start !== null) {
      out.push([xs[Math.max(0, start - 1)], xs[k]]);
      start = null;
    }
  }
  if (start !== null) out.push([xs[Math.max(0, start - 1)], xs[xs.length - 1]]);
  return out;
}
