// Binned answers (`points=N`, docs/HTTP_API.md "Binned answers"): a long run arrives as one bin per
// pixel (first/last step, min/max, flags ORed) plus the steps where a flag starts, exactly ("kept").
// Pure functions: which step a bin opens, which steps a pixel range covers, the zoom bar.

import { flagOf, FLAG } from "./anomalies.js";
import { h } from "./dom.js";

/** The pixels a chart of `width` CSS pixels asks for (at least 50, at most the route's 10**5). */
export function pointsFor(width) {
  return Math.max(50, Math.min(100000, Math.round(width || 800)));
}

/** {start, end} of the route parameters for a zoom ([first, last] or null). */
export function rangeOf(zoom) {
  return zoom ? { start: zoom[0], end: zoom[1] } : {};
}

/**
 * The step a click on bin `j` of column (layer or series) `c` opens: the first kept step inside the
 * bin where that column is flagged (non-finite first), else the bin's first step. {step, why}.
 */
export function stepOfBin(body, c, j) {
  const first = body.steps[j];
  const last = body.last_steps[j];
  const kept = body.kept || { steps: [] };
  const flagsOf = (k) => {
    const f = kept.flags;
    return flagOf(typeof f === "string" ? f[k] : f && f[c] ? f[c][k] : ".");
  };
  let best = null;
  for (let k = 0; k < kept.steps.length; k++) {
    const s = kept.steps[k];
    if (s < first || s > last) continue;
    const f = flagsOf(k);
    if (!f) continue;
    if (best === null || (f & FLAG.NONFINITE && !(best.f & FLAG.NONFINITE))) best = { step: s, f };
    if (f & FLAG.NONFINITE) break;
  }
  if (best) return { step: best.step, why: best.f & FLAG.NONFINITE ? "the bin's first non-finite step" : "the bin's first anomalous step" };
  return { step: first, why: "the bin's first step" };
}

/** The [first, last] steps covered by columns j0..j1 (inclusive) of an answer, binned or not. */
export function stepsOfColumns(body, j0, j1) {
  const [a, b] = j0 <= j1 ? [j0, j1] : [j1, j0];
  const last = body.last_steps || body.steps;
  return [body.steps[a], last[b]];
}

/** "Steps 100–200 (zoomed) · Reset zoom", or nothing when not zoomed. */
export function zoomBar(zoom, binnedInfo, onReset) {
  const text = zoom ? `Zoomed to steps ${zoom[0]}–${zoom[1]}` : "";
  const info = binnedInfo ? `${text ? " · " : ""}${binnedInfo}` : "";
  const reset = zoom ? h("button", { type: "button", class: "lg-link lg-zoom-reset", text: "Reset zoom", on: { click: onReset } }) : null;
  return h("div", { class: "lg-zoom-bar", dataset: { zoom: zoom ? `${zoom[0]}-${zoom[1]}` : "" } },
    h("span", { class: "lg-muted", text: text + info + (text || info ? " " : "") }), reset,
    h("span", { class: "lg-muted lg-zoom-hint", text: " drag across the chart to zoom in" }));
}
