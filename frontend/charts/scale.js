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

/** How many ticks an axis shows: TensorBoard's charts show 4 to 6. */
export const TICKS = { min: 4, max: 6 };

// Tick steps m·10^k, the roundest first: among the steps that give MIN..MAX ticks, the first listed wins.
// Sorted, successive m differ by at most 1.5 times, so some step always gives 4 to 6 ticks.
const MANTISSAS = [1, 2, 5, 2.5, 4, 3, 1.5, 6, 8];

/** The multiples of `step` in [lo, hi]. */
function multiples(lo, hi, step) {
  const out = [];
  const first = Math.ceil(lo / step - 1e-9);
  const last = Math.floor(hi / step + 1e-9);
  for (let n = first; n <= last && out.length < 1000; n++) out.push(n === 0 ? 0 : Number((n * step).toPrecision(12)));
  return out;
}

/** The candidate with min..max ticks that comes first, else the one with the most ticks up to max. */
function pick(candidates, min, max) {
  const ok = candidates.find((c) => c.length >= min && c.length <= max);
  if (ok) return ok;
  const fewer = candidates.filter((c) => c.length <= max && c.length > 0);
  return fewer.length ? fewer.reduce((a, b) => (b.length > a.length ? b : a)) : candidates[candidates.length - 1] || [];
}

/**
 * Round ticks in [lo, hi]: `min` to `max` of them whenever the range allows it (integer axes over
 * fewer steps have fewer), at m·10^k with the roundest m that gives that many.
 */
export function niceTicks(lo, hi, { min = TICKS.min, max = TICKS.max, integer = false } = {}) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (lo === hi) return [lo];
  const k0 = Math.floor(Math.log10((hi - lo) / (max + 1)));
  const byCount = [];
  for (const m of MANTISSAS) {
    for (let k = k0; k <= k0 + 2; k++) {
      const step = m * Math.pow(10, k);
      if (integer && !Number.isInteger(Number(step.toPrecision(12)))) continue;
      byCount.push(multiples(lo, hi, step));
    }
  }
  return pick(byCount, min, max);
}

/**
 * A range that may grow to round ends (a histogram's value axis): [lo', hi', ticks] with `min`..`max` ticks,
 * lo' <= lo and hi' >= hi multiples of the tick step, when niceTicks inside [lo, hi] finds too few.
 */
export function niceDomain(lo, hi, { min = TICKS.min, max = TICKS.max } = {}) {
  const inside = niceTicks(lo, hi, { min, max });
  if (inside.length >= min || !(hi > lo)) return [lo, hi, inside];
  const k0 = Math.floor(Math.log10((hi - lo) / (max + 1)));
  for (let k = k0; k <= k0 + 2; k++) {
    for (const m of [1, 2, 2.5, 5]) {
      const step = m * Math.pow(10, k);
      const a = Math.floor(lo / step + 1e-9) * step;
      const b = Math.ceil(hi / step - 1e-9) * step;
      const ticks = multiples(a, b, step);
      if (ticks.length >= min && ticks.length <= max) return [ticks[0], ticks[ticks.length - 1], ticks];
    }
  }
  return [lo, hi, inside];
}

/**
 * Ticks for a log axis in [lo, hi] (lo > 0): whole decades (every e-th one when there are many), else
 * 1-3, 1-2-5 or 1…9 times the decades, else (under a decade) round linear ticks; `min`..`max` of them when
 * the range allows (niceLogDomain grows a range of several decades that allows none).
 */
export function logTicks(lo, hi, { min = TICKS.min, max = TICKS.max } = {}) {
  if (!(lo > 0) || !(hi >= lo)) return [];
  const a = Math.floor(Math.log10(lo));
  const b = Math.ceil(Math.log10(hi));
  const inside = (v) => v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9);
  const withMantissas = (ms) => {
    const out = [];
    for (let k = a; k <= b; k++) for (const m of ms) out.push(Number((m * Math.pow(10, k)).toPrecision(6)));
    return out.filter(inside);
  };
  const candidates = [];
  for (let every = 1; every <= Math.max(1, b - a); every++) {
    candidates.push(withMantissas([1]).filter((v) => Math.round(Math.log10(v)) % every === 0));
  }
  for (const ms of [[1, 3], [1, 2, 5], [1, 2, 3, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) candidates.push(withMantissas(ms));
  const ok = candidates.find((c) => c.length >= min && c.length <= max);
  if (ok) return ok;
  // Under a decade, round linear values read best; over one, never: their spacing would crowd one end.
  if (hi / lo < 10) return niceTicks(lo, hi, { min, max }).filter((v) => v > 0);
  return pick(candidates, min, max);
}

/**
 * A log axis' range and ticks: [lo, hi] itself when logTicks finds `min`..`max` ticks there, else (a range of
 * several decades that 1-3 or 1-2-5 would crowd) grown to whole decades, whose ticks are then every e-th decade.
 */
export function niceLogDomain(lo, hi, { min = TICKS.min, max = TICKS.max } = {}) {
  const inside = logTicks(lo, hi, { min, max });
  if (inside.length >= min && inside.length <= max) return [lo, hi, inside];
  if (hi / lo >= 10) {
    const a = Math.floor(Math.log10(lo) + 1e-9);
    const b = Math.ceil(Math.log10(hi) - 1e-9);
    for (let every = 1; every <= b - a; every++) {
      if ((b - a) % every) continue;
      const ticks = [];
      for (let k = a; k <= b; k += every) ticks.push(Number(Math.pow(10, k).toPrecision(6)));
      if (ticks.length >= min && ticks.length <= max) return [ticks[0], ticks[ticks.length - 1], ticks];
    }
  }
  return [lo, hi, inside];
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
