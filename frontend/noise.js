// The gradient noise scale as the tab draws it: the ratio of two exponential moving
// averages, of the trace tr(Σ) and of the signal |G|², each as TensorBoard's Scalars dashboard
// smooths (a debiased EMA, so that the first steps are not pulled towards 0). Why not the EMA of the
// raw ratio: each estimate is unbiased but noisy, the signal's often <= 0 at a step (no raw ratio
// there), and the ratio of two noisy numbers is biased; the two averages are good estimates first.
// Pure functions, no DOM.

/** TensorBoard's smoothing of `ys` with weight `w` in [0, 1): null and non-finite values are skipped. */
export function ema(ys, w) {
  const out = new Array(ys.length).fill(null);
  let last = 0;
  let n = 0;
  for (let k = 0; k < ys.length; k++) {
    const v = ys[k];
    if (typeof v !== "number" || !Number.isFinite(v)) continue;
    last = last * w + (1 - w) * v;
    n += 1;
    const debias = w === 1 ? 1 : 1 - Math.pow(w, n);
    out[k] = last / debias;
  }
  return out;
}

/** EMA(trace) / EMA(signal) per step; null while the averaged signal is <= 0 or either is missing. */
export function smoothedNoiseScale(trace, signal, w) {
  const t = ema(trace, w);
  const g = ema(signal, w);
  return t.map((v, k) => (v !== null && g[k] !== null && g[k] > 0 ? v / g[k] : null));
}
