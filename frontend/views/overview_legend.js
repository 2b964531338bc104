// The overview's legend: the colour bar of the statistic (log10, round values that fit apart), and what the other
// colours and marks mean, each with its rule in a tooltip.

import { COLORS, VIRIDIS, lutIndex } from "../charts/colors.js";
import { logTicks } from "../charts/scale.js";
import { h, replace } from "../dom.js";
import { fmtNum, statLabel } from "../format.js";

/**
 * @param {HTMLElement} el the legend's row
 * @param {{stat: string, lo: number, hi: number, showMarks: boolean, info: object[], activation: boolean}} o the
 *   statistic, its log10 range, whether flags are marked, the flags' rules (anomalies.js `flagInfo`), and
 *   whether the cells are activations
 */
export function drawLegend(el, { stat, lo, hi, showMarks, info, activation }) {
  const W = 220;
  const bar = h("canvas", { width: W, height: 10, class: "lg-colorbar" });
  const ctx = bar.getContext("2d");
  for (let x = 0; x < W; x++) {
    ctx.fillStyle = VIRIDIS.css[lutIndex(x / (W - 1))];
    ctx.fillRect(x, 0, 1, 10);
  }
  const ticks = h("div", { class: "lg-colorbar-ticks", style: { width: `${W}px` } });
  // Round values of the log10 range, as many as fit apart (labels are centred on their value; the bar has
  // room on both sides for half a label, so that none reaches the title or the swatches beside it).
  const at = (l, text) => ticks.appendChild(h("span", { class: "lg-colorbar-tick", style: { left: `${((l - lo) / (hi - lo || 1)) * 100}%` }, text }));
  const px = (v) => ((Math.log10(v) - lo) / (hi - lo || 1)) * W;
  let shown = [];
  for (let max = 5; max >= 2 && !shown.length; max--) {
    const vs = logTicks(Math.pow(10, lo), Math.pow(10, hi), { min: 2, max });
    if (vs.every((v, k) => k === 0 || px(v) - px(vs[k - 1]) >= 48)) shown = vs;
  }
  for (const v of shown) at(Math.log10(v), fmtNum(v));
  if (!shown.length) {
    // A range too narrow for two round values far enough apart: its two ends, each inside the bar.
    ticks.appendChild(h("span", { class: "lg-colorbar-tick lg-colorbar-start", text: fmtNum(Math.pow(10, lo)) }));
    ticks.appendChild(h("span", { class: "lg-colorbar-tick lg-colorbar-end", text: fmtNum(Math.pow(10, hi)) }));
  }
  const swatch = (color, text, title) => h("span", { class: "lg-legend-item", title }, h("span", { class: "lg-swatch", style: { background: color } }), h("span", { text }));
  const glyph = (cls, text, title) => h("span", { class: "lg-legend-item", title }, h("span", { class: `lg-bar ${cls}` }), h("span", { text }));
  replace(
    el,
    h("span", { class: "lg-legend-title", text: `${activation ? "activation " : ""}${statLabel(stat)} (log10 colour)` }),
    h("span", { class: "lg-colorbar-wrap" }, bar, ticks),
    swatch(COLORS.zero, "0", "exactly zero (e.g. no gradient reaches the layer)"),
    swatch(COLORS.missing, "no record", "nothing logged for this layer at this step"),
    stat !== "nonfinite" ? swatch(COLORS.nonfinite, "NaN/Inf", "the gradient holds NaN or ±Inf at this step; a black box marks each layer's first, a red ring the cell where the first NaN/Inf was born") : null,
    showMarks ? glyph("lg-bar-vanishing", "vanishing", info[2].rule) : null,
    showMarks ? glyph("lg-bar-exploding", "exploding", info[1].rule) : null,
    showMarks ? glyph("lg-bar-dead", "dead", info[3].rule) : null,
  );
}
