// The filled areas of a line chart (a spread between two series, e.g. over examples).

/** The closed outlines of a band: one per run of steps where both `lo` and `hi` can be drawn. */
export function bandPaths(b, x, y, log) {
  const out = [];
  let run = [];
  const flush = () => {
    if (run.length) {
      const top = run.map((n) => `${x(b.xs[n]).toFixed(1)},${y(b.hi[n]).toFixed(1)}`);
      const bottom = run.slice().reverse().map((n) => `${x(b.xs[n]).toFixed(1)},${y(b.lo[n]).toFixed(1)}`);
      // A lone step: widen it a little so that it shows.
      if (run.length === 1) top.push(`${(x(b.xs[run[0]]) + 2).toFixed(1)},${y(b.hi[run[0]]).toFixed(1)}`);
      out.push(`M${top.join("L")}L${bottom.join("L")}Z`);
    }
    run = [];
  };
  for (let n = 0; n < b.xs.length; n++) {
    if (isOk(b.lo[n], log) && isOk(b.hi[n], log)) run.push(n);
    else flush();
  }
  flush();
  return out;
}

/** A value the axis can draw (finite; above 0 on a log axis). */
export function isOk(v, log) {
  return typeof v === "number" && Number.isFinite(v) && (!log || v > 0);
}
