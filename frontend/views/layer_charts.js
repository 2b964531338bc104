// The layer view's charts over steps: one chart per statistic (every series of the layer, one colour
// each), min · mean · max of the chosen series, the zoom bar and the smoothing slider. A drag across any
// chart zooms the whole view (and the overview) to those steps.

import { zoomBar } from "../bins.js";
import { paletteColor } from "../charts/colors.js";
import { LineChart } from "../charts/lines.js";
import { h, replace } from "../dom.js";
import { statLabel } from "../format.js";
import { smoothing } from "../smoothing.js";
import { SmoothingControl } from "./smoothing_control.js";

// Magnitudes on the log/linear axis of the view's toggle; fractions always on 0…1. Counts and fractions of
// non-finite values are not smoothed: a lone NaN step must stay a spike.
const CHARTS = [
  { stat: "norm", log: true },
  { stat: "mean_abs", log: true },
  { stat: "std", log: true },
  { stat: "zero_frac", fraction: true },
  { stat: "nonfinite_frac", fraction: true, smooth: false },
];
const HEIGHT = 230;
// A statistic over a tensor's finite elements has no value where it has none (all NaN/±Inf).
const GAP_WHY = "no finite element there (▲ on the step axis: NaN/Inf)";

export class LayerCharts {
  /** `onStep(step)`: a click on a chart; `onZoom([first, last] | null)`: a drag across one, or "Reset zoom". */
  constructor(onStep, onZoom) {
    this.onZoom = onZoom;
    const onSelect = (a, b) => onZoom([Math.max(0, Math.ceil(a)), Math.max(0, Math.floor(b))]);
    this.grid = h("div", { class: "lg-chart-grid" });
    this.charts = CHARTS.map((c) => ({ ...c, chart: new LineChart(this.grid, { title: statLabel(c.stat), height: HEIGHT, legend: false, onPick: onStep, onSelect }) }));
    this.mmm = new LineChart(this.grid, { title: "min · mean · max", height: HEIGHT, onPick: onStep, alwaysLegend: true, onSelect });
    this.zoomBox = h("div", { class: "lg-zoom" });
    this.legend = h("div", { class: "lg-legend" });
    this.smoothing = new SmoothingControl("lg-layer-smoothing");
    this.el = h(
      "div",
      { class: "lg-panel lg-panel-charts" },
      h("div", { class: "lg-panel-head" }, h("h3", { class: "lg-panel-title", text: "Over steps" }), this.legend, this.smoothing.el),
      this.zoomBox,
      this.grid,
    );
  }

  /** The width one chart has (the route is asked for one bin per pixel of it). */
  chartWidth() {
    const w = this.grid.clientWidth || 1100;
    return w >= 2 * 520 ? w / 2 - 18 : w;
  }

  /** Draw every chart. `loaded`: {series, stats}; `primary`: the series of min · mean · max. */
  draw(state, loaded, primary, step, xMarks) {
    const L = loaded;
    const pb = L.stats[primary.key];
    const binned = L.series.some((x) => L.stats[x.key].binned);
    const total = pb.binned ? pb.counts.reduce((a, b) => a + b, 0) : pb.steps.length;
    const info = binned ? `${pb.steps.length} bins of ${total} steps: each line is a bin's largest value, the dotted one its smallest` : "";
    replace(this.zoomBox, zoomBar(state.zoom, info, () => this.onZoom(null)));
    replace(
      this.legend,
      L.series.map((x, k) =>
        h("span", { class: "lg-legend-item", dataset: { series: x.key } },
          h("span", { class: "lg-swatch", style: { background: paletteColor(k) } }),
          h("span", { class: "lg-legend-name", text: x.label }))),
    );
    const w = smoothing();
    for (const c of this.charts) {
      const log = Boolean(c.log && state.log);
      c.chart.setTitle(`${statLabel(c.stat)}${log ? " (log)" : ""}${c.fraction ? " (0…1)" : ""}`);
      c.chart.update({
        series: L.series.flatMap((x, k) => lines(L.stats[x.key], c.stat, x.label, paletteColor(k))),
        log,
        yDomain: c.fraction ? [0, 1] : null,
        smoothing: c.smooth === false ? 0 : w,
        marker: step,
        xMarks,
        xLabel: "step",
        gapWhy: GAP_WHY,
      });
    }
    // The chosen series' colour, told apart by the dash: max dashed, mean solid, min dotted.
    const color = paletteColor(Math.max(0, L.series.indexOf(primary)));
    const src = (part) => (pb.binned ? pb[part === "mean" ? "max" : part] : pb.stats)[part];
    this.mmm.setTitle(`min · mean · max — ${primary.label}`);
    this.mmm.update({
      series: [
        { name: "max", color, xs: pb.steps, ys: src("max"), dash: "6 3", width: 1.3 },
        { name: pb.binned ? "mean (bin's largest)" : "mean", color, xs: pb.steps, ys: pb.binned ? pb.max.mean : pb.stats.mean, width: 1.8 },
        { name: "min", color, xs: pb.steps, ys: src("min"), dash: "1.5 2.5", width: 1.3 },
      ],
      log: false,
      smoothing: w,
      marker: step,
      xMarks,
      xLabel: "step",
      gapWhy: GAP_WHY,
    });
  }

  /** Move the step marker of every chart (no redraw). */
  mark(step) {
    for (const c of this.charts) c.chart.setMarker(step);
    this.mmm.setMarker(step);
  }
}

/** A series' line(s) of one statistic: its values, or for bins the largest (solid) and smallest (dotted). */
function lines(body, stat, name, color) {
  if (!body.binned) return [{ name, color, xs: body.steps, ys: body.stats[stat] }];
  return [
    { name, color, xs: body.steps, ys: body.max[stat] },
    { name: `${name} (bin min)`, color, xs: body.steps, ys: body.min[stat], dash: "2 2", width: 1 },
  ];
}
