// Number and label formatting, in one place so every view prints values the same way.

/** Human labels of the statistics of docs/HTTP_API.md. */
export const STAT_LABELS = {
  elements: "elements",
  nan: "NaN count",
  pos_inf: "+Inf count",
  neg_inf: "−Inf count",
  zeros: "zero count",
  min: "min",
  max: "max",
  mean: "mean",
  std: "std",
  norm: "L2 norm",
  mean_abs: "mean |g|",
  no_gradient: "no gradient",
  nonfinite: "non-finite count",
  nonfinite_frac: "non-finite fraction",
  zero_frac: "zero fraction",
  rms: "RMS",
  example_norm_min: "per-example norm: min",
  example_norm_median: "per-example norm: median",
  example_norm_max: "per-example norm: max",
  example_norm_top_share: "largest example's share",
};

/** Colours of the overview read from the per-example records (`matrix?stat=example_norm_*`). */
export const EXAMPLE_STATS = ["example_norm_top_share", "example_norm_max", "example_norm_median", "example_norm_min"];

/** Statistics that are never negative: the ones a log10 colour or log axis can show. */
export const MAGNITUDE_STATS = ["norm", "mean_abs", "std", "rms", "zero_frac", "nonfinite"];

export function statLabel(name) {
  return STAT_LABELS[name] || name;
}

/** Significant digits of every number the tab prints (tables, tooltips, axes, legends). */
export const DIGITS = 4;

/**
 * The tab's one number format: `DIGITS` significant digits, exponent form below 1e-3 and from 1e6 on
 * (TensorBoard's charts do the same), integers under 1e6 (counts, steps) as they are. null/NaN -> "—".
 * Axis ticks are round numbers, so they print short: fmtNum(0.0002) is "2e-4", fmtNum(1e6) "1e6".
 */
export function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  if (!Number.isFinite(v)) return v > 0 ? "+Inf" : "−Inf";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e6) return String(v);
  if (a < 1e-3 || a >= 1e6) return trimExp(v.toExponential(DIGITS - 1));
  return String(Number(v.toPrecision(DIGITS)));
}

/**
 * The format of one axis' ticks: `fmtNum`, unless a tick of the axis needs the exponent form, then every tick
 * in exponent form, so that one axis never reads "100000" beside "1e6". 0 stays "0".
 */
export function axisFormat(ticks) {
  const exp = ticks.some((t) => t !== 0 && Number.isFinite(t) && /e/.test(fmtNum(t)));
  if (!exp) return fmtNum;
  return (v) => (v === 0 || !Number.isFinite(v) ? fmtNum(v) : trimExp(v.toExponential(DIGITS - 1)));
}

/** A fraction as a percentage, with the same significant digits. */
export function fmtPercent(f) {
  if (f === null || f === undefined || Number.isNaN(f)) return "—";
  return `${fmtNum(100 * f)}%`;
}

function trimExp(s) {
  // 1.200e-8 -> 1.2e-8 ; 1.000e-8 -> 1e-8 ; 2.500e+6 -> 2.5e6
  return s.replace(/\.?0+e/, "e").replace("e+", "e");
}

/** The common leading path (whole segments) of layer names, e.g. "mlp/" of mlp/dense_1, mlp/dense_2. */
export function commonPrefix(names) {
  if (names.length < 2) return "";
  const split = names.map((n) => n.split("/"));
  const first = split[0];
  let k = 0;
  while (k < first.length - 1 && split.every((p) => p.length - 1 > k && p[k] === first[k])) k++;
  return k ? first.slice(0, k).join("/") + "/" : "";
}

/** One CSV field (RFC 4180 quoting). */
export function csvField(v) {
  if (v === null || v === undefined) return "";
  const s = typeof v === "number" ? (Number.isNaN(v) ? "nan" : String(v)) : String(v);
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function csvText(header, rows) {
  return [header, ...rows].map((r) => r.map(csvField).join(",")).join("\r\n") + "\r\n";
}

/** A file name made of safe characters only. */
export function safeFilename(s) {
  return String(s).replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^[._]+|[._]+$/g, "") || "layergrad";
}

/** The first letter upper-cased: for the anomalies route's sentences, which start lower-case. */
export function capitalize(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : "";
}
