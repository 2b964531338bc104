// The overview's step axis under the heatmap: 4 to 6 round steps where they fall (inside a bin, or between two
// logged steps), the first non-finite step in red under its mark, and what a column holds.

import { s, clear } from "../dom.js";
import { COLORS } from "../charts/colors.js";
import { indexAtOrBefore, niceTicks } from "../charts/scale.js";
import { fmtNum } from "../format.js";

/**
 * @param {SVGElement} svg the axis
 * @param {object} d the overview's data (`steps`, `bins`)
 * @param {number} width the heatmap's width in CSS pixels
 * @param {{step: number, col: number|null}|null} first the first non-finite step (anomalies.js `firstNonfinite`)
 */
export function drawAxis(svg, d, width, first) {
  clear(svg);
  const H = 30;
  svg.setAttribute("width", width);
  svg.setAttribute("height", H);
  const cols = d.steps.length;
  if (!cols) return;
  const colW = width / cols;
  // Round steps (4 to 6 of them) where they fall: inside a bin's steps, or between two logged steps.
  const last = d.bins ? d.bins.last_steps : d.steps;
  const ticks = niceTicks(d.steps[0], last[cols - 1], { integer: true, max: Math.min(6, Math.max(2, Math.floor(width / 70))) });
  // The first non-finite step is labelled too (in red, under its mark); round ticks too close to it give way.
  const firstX = first && first.col !== null ? (first.col + 0.5) * colW : null;
  if (firstX !== null) svg.appendChild(s("text", { x: firstX, y: 15, "text-anchor": "middle", class: "lg-tick lg-tick-nonfinite", text: fmtNum(first.step) }));
  for (const step of ticks) {
    const j = indexAtOrBefore(d.steps, step);
    if (j < 0) continue;
    const next = j + 1 < cols ? d.steps[j + 1] : d.steps[j] + 1;
    const frac = d.bins ? (step - d.steps[j] + 0.5) / (last[j] - d.steps[j] + 1) : 0.5 + (step - d.steps[j]) / (next - d.steps[j]);
    const x = (j + frac) * colW;
    if (firstX !== null && Math.abs(x - firstX) < 30) continue;
    const anchor = x < 20 ? "start" : x > width - 20 ? "end" : "middle";
    svg.appendChild(s("line", { x1: x, x2: x, y1: 0, y2: 4, class: "lg-tickmark" }));
    svg.appendChild(s("text", { x, y: 15, "text-anchor": anchor, class: "lg-tick lg-xtick", text: fmtNum(step) }));
  }
  const what = d.bins ? `${cols} bins` : `${cols} logged`;
  svg.appendChild(s("text", { x: width, y: H - 2, "text-anchor": "end", class: "lg-axis-label", text: `step (${what}${cols > width ? `; a pixel column shows the largest value of ${(cols / width).toFixed(1)} steps` : ""})` }));
  if (first && first.col !== null) {
    const x = (first.col + 0.5) * colW;
    const m = s("path", { d: `M${x},0 l5,8 l-10,0 z`, fill: COLORS.nonfinite, class: "lg-xmark" });
    m.appendChild(s("title", { text: `first non-finite gradient: step ${first.step}` }));
    svg.appendChild(m);
  }
}
