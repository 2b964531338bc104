// What the overview draws over its heatmap's cells: a black box on each layer's first non-finite cell, a red
// ring on the cell where the run's first NaN/Inf was born, and a bar under each run of flagged cells (vanishing,
// exploding, dead), the flags being the `anomalies` route's (anomalies.js `fromRoute`).

import { FLAG, isOrigin } from "../anomalies.js";
import { COLORS } from "../charts/colors.js";

/**
 * Draw the marks on the heatmap's canvas (charts/heatmap.js calls it after the cells, with its geometry `g`).
 * @param {object} an the anomalies on the grid (`fromRoute`)
 * @param {boolean} showMarks the flag bars too ("mark anomalies")
 * @param {(step: number) => number|null} columnOf the grid column holding a step
 */
export function decorate(ctx, g, an, showMarks, columnOf) {
  const { rows, cols } = g;
  // Rings around the first non-finite cell of each layer (always, at least 5 px), outside a narrow cell
  // so that a one-pixel column (a bin of a long run) stays red inside it.
  ctx.lineWidth = 2;
  for (let i = 0; i < rows; i++) {
    const j = an.layers[i].firstNonfinite;
    if (j === null) continue;
    const w = g.colWidth < 5 ? g.colWidth + 4 : g.colWidth;
    const hgt = Math.max(5, g.rowHeight);
    const x = g.x(j) + g.colWidth / 2 - w / 2;
    const y = g.y(i) + g.rowHeight / 2 - hgt / 2;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(x + 1, y + 1, w - 2, hgt - 2);
  }
  // The cell where the run's first NaN/Inf was born (the route's verdict `nan_origin`): a thick red ring
  // with a white halo, on its own row even when that row's gradient stayed finite (a backward-pass origin).
  for (let i = 0; i < rows; i++) {
    const v = an.layers[i].verdict;
    const j = isOrigin(v) ? columnOf(v.step) : null;
    if (j === null) continue;
    const w = Math.max(9, g.colWidth + 4);
    const hgt = Math.max(9, g.rowHeight + 2);
    const x = g.x(j) + g.colWidth / 2 - w / 2;
    const y = g.y(i) + g.rowHeight / 2 - hgt / 2;
    ctx.lineWidth = 4;
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(x, y, w, hgt);
    ctx.lineWidth = 2;
    ctx.strokeStyle = COLORS.nonfinite;
    ctx.strokeRect(x, y, w, hgt);
  }
  if (!showMarks || g.rowHeight < 6) return;
  // A bar along the bottom of each run of flagged cells: the row reads "vanishing from here to there".
  const barH = Math.max(2, Math.round(g.rowHeight * 0.2));
  const colorOf = (f) => (f & FLAG.EXPLODING ? COLORS.exploding : f & FLAG.DEAD ? "#263238" : f & FLAG.VANISHING ? COLORS.vanishing : null);
  const px = Math.max(1, Math.round(g.width));
  const perPx = g.binned ? cols / px : 1;
  const n = g.binned ? px : cols;
  for (let i = 0; i < rows; i++) {
    let runStart = 0;
    let runColor = null;
    const y = g.y(i) + g.rowHeight - barH;
    for (let k = 0; k <= n; k++) {
      let color = null;
      if (k < n) {
        let f = 0;
        const j0 = Math.floor(k * perPx);
        const j1 = g.binned ? Math.max(j0 + 1, Math.floor((k + 1) * perPx)) : j0 + 1;
        for (let j = j0; j < j1; j++) f |= an.flags[i * cols + j];
        if (!(f & FLAG.NONFINITE)) color = colorOf(f);
      }
      if (color !== runColor) {
        if (runColor) {
          const x0 = g.binned ? runStart : g.x(runStart);
          const x1 = g.binned ? k : g.x(k);
          ctx.fillStyle = runColor;
          ctx.fillRect(x0, y, x1 - x0, barH);
        }
        runColor = color;
        runStart = k;
      }
    }
  }
}
