// The smoothing weight of every time chart of the tab (TensorBoard's Scalars slider): one value, so that
// the noise-scale chart and the charts over steps are smoothed alike, whichever view's slider moved it.
// `ema` is the one implementation of the smoothing of a drawn line (charts/lines.js); the noise scale's
// averages are the plugin's (reader/noise_scale.py), asked for with this weight.

/** TensorBoard's Scalars dashboard's default. */
export const DEFAULT_SMOOTHING = 0.6;

let weight = DEFAULT_SMOOTHING;
const listeners = new Set();

/** The current weight, in [0, 1). */
export function smoothing() {
  return weight;
}

/** Set the weight and tell every listener (each view redraws its time charts). */
export function setSmoothing(w) {
  const v = Math.max(0, Math.min(0.999, Number(w)));
  if (!Number.isFinite(v) || v === weight) return;
  weight = v;
  for (const f of listeners) f(v);
}

/** Call `f(weight)` on every change. */
export function onSmoothing(f) {
  listeners.add(f);
  return () => listeners.delete(f);
}

/** TensorBoard's smoothing of `ys` with weight `w` in [0, 1): a debiased EMA; null and non-finite values skipped. */
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
