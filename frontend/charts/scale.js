// Scales and ticks for the SVG charts.

export function linearScale(d0, d1, r0, r1) {
  if (d0 === d1) {
    d0 -= 0.5;
    d1 += 0.5;
  }
  const k = (r1 - r0) / (d1 - d0);
  const f = (v) => r0 + (v - d0) * k;
  f.invert = (p) => d0 + (p - r0) / k;
  f.domain = [d0, d1];
  f.log = false;
  return f;
}

export function logScale(d0, d1, r0, r1) {
  let l0 = Math.log10(d0);
  let l1 = Math.log10(d1);
  if (l0 === l1) {
    l0 -= 0.5;
    l1 += 0.5;
  }
  const k = (r1 - r0) / (l1 - l0);
  const f = (v) => (v > 0 ? r0 + (Math.log10(v) - l0) * k : NaN);
  f.invert = (p) => Math.pow(10, l0 + (p - r0) / k);
  f.domain = [Math.pow(10, l0), Math.pow(10, l1)];
  f.log = true;
  return f;
}

/** About `count` round ticks in [lo, hi]. */
export function niceTicks(lo, hi, count = 5, integer = false) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (lo === hi) return [lo];
  const span = hi - lo;
  let step = Math.pow(10, Math.floor(Math.log10(span / count)));
  const err = (count * step) / span;
  if (err <= 0.15) step *= 10;
  else if (err <= 0.35) step *= 5;
  else if (err <= 0.75) step *= 2;
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : Number(v.toPrecision(12)));
  return out;
}

/** Decade ticks for a log axis (every k-th decade when there are many). */
export function logTicks(lo, hi, maxTicks = 7) {
  const a = Math.ceil(Math.log10(lo) - 1e-9);
  const b = Math.floor(Math.log10(hi) + 1e-9);
  if (b - a < 2) {
    // Less than two whole decades: 1-2-5 ticks.
    const out = [];
    for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) {
      for (const m of [1, 2, 5]) {
        const v = Number((m * Math.pow(10, k)).toPrecision(6));
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(v);
      }
    }
    if (out.length >= 2) {
      const every = Math.ceil(out.length / maxTicks);
      return out.filter((_, i) => i % every === 0);
    }
    return niceTicks(lo, hi, 4).filter((v) => v > 0);
  }
  const every = Math.max(1, Math.ceil((b - a + 1) / maxTicks));
  const out = [];
  for (let k = a; k <= b; k++) if ((k - a) % every === 0) out.push(Math.pow(10, k));
  return out;
}

/** [min, max] of the finite values (only > 0 ones when `positive`). */
export function extent(arrays, positive = false) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const arr of arrays) {
    for (const v of arr) {
      if (typeof v !== "number" || !Number.isFinite(v) || (positive && v <= 0)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  return lo <= hi ? [lo, hi] : null;
}

/** Index of the value in sorted `xs` nearest to `x`. */
export function nearestIndex(xs, x) {
  if (!xs.length) return -1;
  let lo = 0;
  let hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid;
    else hi = mid;
  }
  return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
}

/** Index of the last value <= x in sorted `xs`, -1 if none. */
export function indexAtOrBefore(xs, x) {
  let lo = 0;
  let hi = xs.length - 1;
  let ans = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) {
      ans = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return ans;
}
