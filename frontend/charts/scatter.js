// A scatter chart (SVG): one point per item, x linear, log or categorical, y linear; hover and click per point.

import { h, s, clear } from "../dom.js";
import { fmtNum } from "../format.js";
import { extent, linearScale, logScale, niceDomain, niceLogDomain } from "./scale.js";
import { tooltip } from "./tooltip.js";

const M = { left: 58, right: 16, top: 10, bottom: 40 };
const R = 5;

/** Where the points of one category spread (a fraction of the category's width), so that equal values stay apart. */
const SPREAD = 0.5;

export class ScatterChart {
  /**
   * @param {HTMLElement} parent
   * @param {{height?: number, onPick?: (item: object) => void}} opts
   */
  constructor(parent, opts = {}) {
    this.opts = opts;
    this.svg = s("svg", { class: "lg-scatter", role: "img" });
    this.note = h("div", { class: "lg-chart-note" });
    this.root = h("div", { class: "lg-chart" }, this.svg, this.note);
    parent.appendChild(this.root);
    this.data = null;
    this._resize = new ResizeObserver(() => {
      if (this.data && this.root.clientWidth !== this._width) this.update(this.data);
    });
    this._resize.observe(this.root);
  }

  /**
   * @param {{points: {key: string, x: number|string, y: number, color: string, title: string, rows: string[][]}[],
   *          x: {label: string, log: boolean, categories: Array|null, format: (v) => string}, y: {label: string},
   *          empty: string, note: string}} data
   * `x.categories`: the categories in axis order (x values are among them); null for a numeric axis.
   */
  update(data) {
    this.data = data;
    const width = Math.max(280, this.root.clientWidth || 480);
    this._width = this.root.clientWidth;
    const height = this.opts.height || 300;
    const W = width - M.left - M.right;
    const H = height - M.top - M.bottom;
    clear(this.svg);
    this.svg.setAttribute("width", String(width));
    this.svg.setAttribute("height", String(height));
    this.svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    this.note.textContent = data.note || "";
    const pts = data.points;
    if (!pts.length) {
      this.svg.appendChild(s("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "lg-empty-text", text: data.empty || "nothing to plot" }));
      return;
    }
    const [y0, y1, yTicks] = niceDomain(...(extent([pts.map((p) => p.y)]) || [0, 1]));
    const y = linearScale(y0, y1, M.top + H - R - 2, M.top + R + 2); // a point at an end stays whole
    const grid = s("g", { class: "lg-grid" });
    const axes = s("g");
    for (const t of yTicks) {
      grid.appendChild(s("line", { x1: M.left, x2: M.left + W, y1: y(t), y2: y(t) }));
      axes.appendChild(s("text", { class: "lg-tick", x: M.left - 6, y: y(t) + 3.5, "text-anchor": "end", text: fmtNum(t) }));
    }
    const xOf = this._xScale(data, pts, W, grid, axes, H);
    axes.appendChild(s("rect", { class: "lg-frame", x: M.left, y: M.top, width: W, height: H }));
    axes.appendChild(s("text", { class: "lg-axis-label", x: M.left + W / 2, y: height - 6, "text-anchor": "middle", text: data.x.label + (data.x.log ? " (log)" : "") }));
    axes.appendChild(s("text", { class: "lg-axis-label", x: 12, y: M.top + H / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${M.top + H / 2})`, text: data.y.label }));
    const dots = s("g", { class: "lg-scatter-points" });
    for (const p of pts) {
      const cx = xOf(p);
      const cy = y(p.y);
      const dot = s("circle", { class: "lg-scatter-point", cx: cx.toFixed(2), cy: cy.toFixed(2), r: R, fill: p.color, dataset: { key: p.key, x: String(p.x), y: String(p.y) } });
      dot.addEventListener("mouseenter", (e) => tooltip().show(e.clientX, e.clientY, p.title, p.rows, "click: open this run"));
      dot.addEventListener("mousemove", (e) => tooltip().show(e.clientX, e.clientY, p.title, p.rows, "click: open this run"));
      dot.addEventListener("mouseleave", () => tooltip().hide());
      dot.addEventListener("click", () => {
        tooltip().hide();
        if (this.opts.onPick) this.opts.onPick(p);
      });
      dots.appendChild(dot);
    }
    this.svg.append(grid, axes, dots);
  }

  /** The x position of a point, after drawing the x axis' ticks (numbers, or one tick per category). */
  _xScale(data, pts, W, grid, axes, H) {
    const base = M.top + H;
    const tick = (px, text) => {
      grid.appendChild(s("line", { x1: px, x2: px, y1: M.top, y2: base }));
      axes.appendChild(s("text", { class: "lg-tick", x: px, y: base + 14, "text-anchor": "middle", text }));
    };
    if (data.x.categories) {
      const cats = data.x.categories;
      const band = W / cats.length;
      const index = new Map(cats.map((c, i) => [JSON.stringify(c), i]));
      cats.forEach((c, i) => tick(M.left + (i + 0.5) * band, shorten(data.x.format(c))));
      // The points of one category spread across part of its band, in the order given.
      const within = new Map();
      const slot = new Map();
      for (const p of pts) {
        const k = JSON.stringify(p.x);
        slot.set(p, within.get(k) || 0);
        within.set(k, (within.get(k) || 0) + 1);
      }
      return (p) => {
        const k = JSON.stringify(p.x);
        const n = within.get(k);
        const off = n > 1 ? (slot.get(p) / (n - 1) - 0.5) * SPREAD * band : 0;
        return M.left + (index.get(k) + 0.5) * band + off;
      };
    }
    const xs = pts.map((p) => p.x);
    const [lo, hi] = extent([xs], data.x.log) || [0, 1];
    const [x0, x1, ticks] = data.x.log ? niceLogDomain(lo, hi) : niceDomain(lo, hi);
    const x = (data.x.log ? logScale : linearScale)(x0, x1, M.left + R + 2, M.left + W - R - 2);
    for (const t of ticks) tick(x(t), fmtNum(t));
    return (p) => x(p.x);
  }
}

function shorten(text) {
  return text.length > 16 ? `${text.slice(0, 15)}…` : text;
}
