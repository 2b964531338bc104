// The steps the noise-scale line does not cover (B_simple, the `noise_scale` route's `estimate`, is computed by
// the plugin: reader/noise_scale.py). Pure functions, no DOM.

/**
 * The step ranges the line does not cover (`ys` null at some recorded step): each from the last
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
