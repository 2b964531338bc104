// The colours of the overview's heatmap cells: viridis on log10 of the statistic over the run's positive finite
// values, grey for an exact zero, light for no record, red for a step whose gradient held a NaN/Inf.

import { COLORS, VIRIDIS, lutIndex, packHex } from "../charts/colors.js";

const RED = packHex(COLORS.nonfinite);
const ZERO = packHex(COLORS.zero);
const MISSING = packHex(COLORS.missing);

/**
 * The heatmap's painters (charts/heatmap.js): `cell(i, j)`, `bin(i, j0, j1)` (a pixel holding several columns:
 * red if any is non-finite, else the largest value), `pick(i, j0, j1)` (the column such a pixel opens).
 * @param {(number|null)[][]} values the statistic, [layer][column]
 * @param {(number|null)[][]} nonfinite the non-finite counts, [layer][column]
 * @param {boolean} redOverride a non-finite cell is red (not when the statistic is the non-finite count itself)
 * @returns {{lo: number, hi: number, cell: Function, bin: Function, pick: Function}} lo, hi: the log10 range
 */
export function cellColors(values, nonfinite, redOverride) {
  // Colour scale: log10 of the positive finite values.
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of values) for (const v of row) if (v > 0 && Number.isFinite(v)) {
    const l = Math.log10(v);
    if (l < lo) lo = l;
    if (l > hi) hi = l;
  }
  if (!(lo <= hi)) {
    lo = 0;
    hi = 1;
  }
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const span = hi - lo;
  const colorOf = (v) => (v === null || v === undefined ? MISSING : v === 0 ? ZERO : v > 0 ? VIRIDIS.packed[lutIndex((Math.log10(v) - lo) / span)] : MISSING);
  const cell = (i, j) => (redOverride && nonfinite[i][j] > 0 ? RED : colorOf(values[i][j]));
  const bin = (i, j0, j1) => {
    let best = null;
    let any = false;
    for (let j = j0; j < j1; j++) {
      if (redOverride && nonfinite[i][j] > 0) return RED;
      const v = values[i][j];
      if (v === null || v === undefined) continue;
      any = true;
      if (best === null || v > best) best = v;
    }
    return any ? colorOf(best) : MISSING;
  };
  const pick = (i, j0, j1) => {
    let bestJ = j0;
    let best = -Infinity;
    for (let j = j0; j < j1; j++) {
      if (nonfinite[i][j] > 0) return j;
      const v = values[i][j];
      if (v !== null && v > best) {
        best = v;
        bestJ = j;
      }
    }
    return bestJ;
  };
  return { lo, hi, cell, bin, pick };
}
