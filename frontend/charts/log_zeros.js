// Values a log axis cannot draw (0 and below): found per series and marked under the plot, so that a
// run whose norm is 0 is seen as such instead of drawing nothing.

import { s } from "../dom.js";

/** [{name, color, zeros: x[], negatives: x[]}] of the series that hold finite values <= 0. */
export function nonPositive(series) {
  const out = [];
  for (const q of series) {
    const zeros = [];
    const negatives = [];
    q.ys.forEach((v, n) => {
      if (v === 0) zeros.push(q.xs[n]);
      else if (typeof v === "number" && v < 0 && Number.isFinite(v)) negatives.push(q.xs[n]);
    });
    if (zeros.length || negatives.length) out.push({ name: q.name, color: q.color, zeros, negatives });
  }
  return out;
}

/** A small ▾ of the series' colour under the plot at each such step (its tooltip says what it is). */
export function nonPositiveMarks(bad, x, bottom) {
  const g = s("g", { class: "lg-nonpos-marks" });
  for (const b of bad) {
    for (const [xs, what] of [[b.zeros, "0"], [b.negatives, "below 0"]]) {
      for (const xv of xs) {
        const px = x(xv);
        const mark = s("path", { d: `M${(px - 3).toFixed(1)},${bottom + 1}l3,4l3,-4z`, fill: b.color, class: "lg-nonpos", dataset: { series: b.name, x: xv } });
        mark.appendChild(s("title", { text: `${b.name}: ${what} at ${xv} (not drawn on a log scale)` }));
        g.appendChild(mark);
      }
    }
  }
  return g;
}

/** "run_b: 0 (not drawn on a log scale) at 3 steps · …" */
export function noteText(bad, why, unit) {
  const steps = (n) => `${n} ${unit}${n === 1 ? "" : "s"}`;
  const bits = bad.map((b) => {
    const parts = [];
    if (b.zeros.length) parts.push(`0 (not drawn on a log scale) at ${steps(b.zeros.length)}`);
    if (b.negatives.length) parts.push(`below 0 (not drawn on a log scale) at ${steps(b.negatives.length)}`);
    return `${b.name}: ${parts.join(", ")}`;
  });
  return `▾ under the plot: ${bits.join(" · ")}${why ? ` — ${why}` : ""}`;
}
