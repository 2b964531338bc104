// The colours of compared runs: one per run (the palette, by position), or by a hyperparameter's value —
// numbers on a sequential scale (log when all are positive and span more than a decade), anything else as
// categories — with what a legend needs to show the scale. Runs without a value are grey, and named.

import { lutIndex, paletteColor, PALETTE, VIRIDIS } from "./colors.js";

/** The colour of a run without a value for the hyperparameter: no scale or category uses it. */
export const NO_VALUE = "#bdbdbd";
// Viridis' last yellows are too light to read as a line on white: the scale stops short of them.
const SEQ_END = 0.9;

/**
 * Colour per run, by position in `runs` (picking one more run keeps the others' colours).
 * @returns {{kind: "run", colorOf: (run: string) => string}}
 */
export function colorByRun(runs) {
  const at = new Map(runs.map((r, k) => [r, k]));
  return { kind: "run", colorOf: (run) => (at.has(run) ? paletteColor(at.get(run)) : NO_VALUE) };
}

/** The colour at t in [0, 1] of the sequential scale. */
export function sequentialColor(t) {
  return VIRIDIS.css[lutIndex(Math.min(1, Math.max(0, t)) * SEQ_END)];
}

/**
 * Colour by hyperparameter `name` of each run (`values`: run -> {name: value}, as the `hparams` route gives).
 * A value that is null (a NaN) or absent counts as none.
 * @returns {{kind: "sequential"|"categorical", name: string, colorOf: (run: string) => string, missing: string[],
 *            log?: boolean, lo?: number, hi?: number, categories?: {label: string, color: string}[], repeats?: boolean}}
 */
export function colorByHparam(name, runs, values) {
  const own = new Map();
  const missing = [];
  for (const r of runs) {
    const hp = values.get(r);
    const v = hp && Object.prototype.hasOwnProperty.call(hp, name) ? hp[name] : null;
    if (v === null || v === undefined) missing.push(r);
    else own.set(r, v);
  }
  const present = [...own.values()];
  const numeric = present.length > 0 && present.every((v) => typeof v === "number" && Number.isFinite(v));
  const base = { name, missing };
  if (numeric) {
    const lo = Math.min(...present);
    const hi = Math.max(...present);
    const log = lo > 0 && hi / lo > 10;
    const t = (v) => (hi === lo ? 0.5 : log ? Math.log(v / lo) / Math.log(hi / lo) : (v - lo) / (hi - lo));
    return { ...base, kind: "sequential", log, lo, hi, colorOf: (run) => (own.has(run) ? sequentialColor(t(own.get(run))) : NO_VALUE) };
  }
  // Categories sorted by their text (numbers in numeric order); a number and a string that print alike stay two.
  const keyOf = (v) => `${typeof v}:${String(v)}`;
  const distinct = new Map(present.map((v) => [keyOf(v), v]));
  const keys = [...distinct.keys()].sort((a, b) => String(distinct.get(a)).localeCompare(String(distinct.get(b)), undefined, { numeric: true }) || a.localeCompare(b));
  const index = new Map(keys.map((k, i) => [k, i]));
  const categories = keys.map((k, i) => ({ label: String(distinct.get(k)), color: paletteColor(i) }));
  return {
    ...base,
    kind: "categorical",
    categories,
    repeats: categories.length > PALETTE.length,
    colorOf: (run) => (own.has(run) ? categories[index.get(keyOf(own.get(run)))].color : NO_VALUE),
  };
}
