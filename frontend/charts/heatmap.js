// A canvas heatmap: `rows` x `cols` cells, one pixel per cell in an offscreen image
// that is scaled up without smoothing. Columns beyond the pixel width are merged
// into bins by the caller's `bin` function (e.g. "red if any step in the bin is
// non-finite, else the largest value"), so nothing is silently dropped. No DOM
// node per cell: 200 layers x 5,000 steps draw in a few milliseconds.

import { h } from "../dom.js";

export class Heatmap {
  /**
   * @param {HTMLElement} parent
   * @param {{onHover?: Function, onLeave?: Function, onClick?: Function, label?: string}} handlers
   *   onHover({i, j, j0, j1, clientX, clientY}), onClick({i, j, j0, j1})
   */
  constructor(parent, handlers = {}) {
    this.handlers = handlers;
    this.canvas = h("canvas", { class: "lg-heatmap-canvas", role: "img", "aria-label": handlers.label || "heatmap" });
    this.overlay = h("canvas", { class: "lg-heatmap-overlay", "aria-hidden": "true" });
    this.root = h("div", { class: "lg-heatmap" }, this.canvas, this.overlay);
    parent.appendChild(this.root);
    this.spec = null;
    this.hover = null;
    this.canvas.addEventListener("mousemove", (e) => this._move(e));
    this.canvas.addEventListener("mouseleave", () => {
      this.hover = null;
      this._drawOverlay();
      if (this.handlers.onLeave) this.handlers.onLeave();
    });
    this._dragSelect();
    this.canvas.addEventListener("click", (e) => {
      if (this._dragged) {
        this._dragged = false;
        return; // the end of a drag-select, not a click
      }
      const c = this.cellAt(e.clientX, e.clientY);
      if (c && this.handlers.onClick) this.handlers.onClick(c);
    });
  }

  /** With `handlers.onSelect({j0, j1})`: a horizontal drag picks a range of columns (e.g. to zoom in). */
  _dragSelect() {
    if (!this.handlers.onSelect) return;
    this.canvas.addEventListener("mousedown", (e) => {
      const c = this.cellAt(e.clientX, e.clientY);
      this.drag = c ? { x0: e.clientX, x1: e.clientX, c0: c, c1: c } : null;
    });
    window.addEventListener("mouseup", (e) => {
      const d = this.drag;
      this.drag = null;
      if (!d) return;
      this._drawOverlay();
      if (Math.abs(e.clientX - d.x0) < 5) return;
      this._dragged = e.target === this.canvas;
      const [a, b] = d.c0.j0 <= d.c1.j0 ? [d.c0, d.c1] : [d.c1, d.c0];
      this.handlers.onSelect({ j0: a.j0, j1: b.j1 - 1 });
    });
  }

  /**
   * @param {{rows: number, cols: number, width: number, rowHeight: number,
   *          cell: (i: number, j: number) => number, bin?: (i: number, j0: number, j1: number) => number,
   *          decorate?: (ctx: CanvasRenderingContext2D, geom: object) => void, selected?: {i?: number, j?: number}}} spec
   *   cell() returns a packed colour (charts/colors.js pack()), 0 for transparent.
   */
  draw(spec) {
    const t0 = performance.now();
    const dpr = window.devicePixelRatio || 1;
    const rows = Math.max(0, spec.rows | 0);
    const cols = Math.max(0, spec.cols | 0);
    const width = Math.max(1, Math.floor(spec.width));
    const height = Math.max(1, Math.round(rows * spec.rowHeight));
    this.spec = { ...spec, rows, cols, width, height };
    for (const c of [this.canvas, this.overlay]) {
      c.width = Math.round(width * dpr);
      c.height = Math.round(height * dpr);
      c.style.width = `${width}px`;
      c.style.height = `${height}px`;
    }
    this.root.style.width = `${width}px`;
    this.root.style.height = `${height}px`;
    this.canvas.dataset.rows = String(rows);
    this.canvas.dataset.cols = String(cols);
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    if (!rows || !cols) {
      this._drawOverlay();
      return;
    }
    // One image pixel per cell, or per bin of columns when there are more columns than pixels.
    const dataCols = Math.min(cols, this.canvas.width);
    this.spec.dataCols = dataCols;
    const image = new ImageData(dataCols, rows);
    const px = new Uint32Array(image.data.buffer);
    if (dataCols === cols) {
      for (let i = 0; i < rows; i++) {
        const base = i * cols;
        for (let j = 0; j < cols; j++) px[base + j] = spec.cell(i, j);
      }
    } else {
      const bin = spec.bin || ((i, j0) => spec.cell(i, j0));
      for (let k = 0; k < dataCols; k++) {
        const j0 = Math.floor((k * cols) / dataCols);
        const j1 = Math.max(j0 + 1, Math.floor(((k + 1) * cols) / dataCols));
        for (let i = 0; i < rows; i++) px[i * dataCols + k] = bin(i, j0, j1);
      }
    }
    const buffer = document.createElement("canvas");
    buffer.width = dataCols;
    buffer.height = rows;
    buffer.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(buffer, 0, 0, this.canvas.width, this.canvas.height);
    if (spec.decorate) {
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      spec.decorate(ctx, this.geometry());
    }
    this._drawOverlay();
    this.lastDrawMs = performance.now() - t0;
    this.canvas.dataset.drawMs = this.lastDrawMs.toFixed(1);
  }

  /** Cell geometry in CSS pixels (for decorations and tests). */
  geometry() {
    const { rows, cols, width, height, dataCols } = this.spec;
    const colW = width / cols;
    return {
      rows,
      cols,
      width,
      height,
      binned: dataCols < cols,
      colWidth: colW,
      rowHeight: height / rows,
      x: (j) => j * colW,
      y: (i) => (i * height) / rows,
    };
  }

  /** The cell under a mouse position; j0..j1 is the bin of columns it stands for. */
  cellAt(clientX, clientY) {
    if (!this.spec || !this.spec.rows || !this.spec.cols) return null;
    const r = this.canvas.getBoundingClientRect();
    const x = clientX - r.left;
    const y = clientY - r.top;
    if (x < 0 || y < 0 || x >= r.width || y >= r.height) return null;
    const { rows, cols, dataCols } = this.spec;
    const i = Math.min(rows - 1, Math.floor((y / r.height) * rows));
    const k = Math.min(dataCols - 1, Math.floor((x / r.width) * dataCols));
    const j0 = Math.floor((k * cols) / dataCols);
    const j1 = Math.max(j0 + 1, Math.floor(((k + 1) * cols) / dataCols));
    let j = j0;
    if (j1 - j0 > 1 && this.spec.pick) j = this.spec.pick(i, j0, j1);
    return { i, j, j0, j1 };
  }

  setSelected(selected) {
    if (this.spec) this.spec.selected = selected;
    this._drawOverlay();
  }

  _move(e) {
    const c = this.cellAt(e.clientX, e.clientY);
    if (this.drag && c) {
      this.drag.x1 = e.clientX;
      this.drag.c1 = c;
    }
    const key = c ? `${c.i}:${c.j0}` : "";
    const old = this.hover ? `${this.hover.i}:${this.hover.j0}` : "";
    this.hover = c;
    if (key !== old) this._drawOverlay();
    if (c && this.handlers.onHover) this.handlers.onHover({ ...c, clientX: e.clientX, clientY: e.clientY });
    else if (!c && this.handlers.onLeave) this.handlers.onLeave();
  }

  _drawOverlay() {
    const ctx = this.overlay.getContext("2d");
    const dpr = window.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.overlay.width, this.overlay.height);
    if (!this.spec || !this.spec.rows || !this.spec.cols) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const g = this.geometry();
    const colX = (j0, j1) => [g.x(j0), Math.max(1, g.x(j1) - g.x(j0))];
    const sel = this.spec.selected || {};
    ctx.lineWidth = 1.5;
    if (sel.j !== undefined && sel.j !== null && sel.j >= 0) {
      const [x, w] = colX(sel.j, sel.j + 1);
      ctx.strokeStyle = "rgba(0,0,0,0.55)";
      ctx.setLineDash([3, 2]);
      ctx.strokeRect(x + 0.5, 0.5, Math.max(1, w - 1), g.height - 1);
      ctx.setLineDash([]);
    }
    if (sel.i !== undefined && sel.i !== null && sel.i >= 0) {
      ctx.strokeStyle = "rgba(0,0,0,0.35)";
      ctx.strokeRect(0.5, g.y(sel.i) + 0.5, g.width - 1, Math.max(1, g.rowHeight - 1));
    }
    if (this.drag && Math.abs(this.drag.x1 - this.drag.x0) >= 5) {
      const [a, b] = this.drag.c0.j0 <= this.drag.c1.j0 ? [this.drag.c0, this.drag.c1] : [this.drag.c1, this.drag.c0];
      const [x, w] = colX(a.j0, b.j1);
      ctx.fillStyle = "rgba(33,150,243,0.25)";
      ctx.fillRect(x, 0, w, g.height);
    }
    if (this.hover) {
      const [x, w] = colX(this.hover.j0, this.hover.j1);
      const y = g.y(this.hover.i);
      ctx.strokeStyle = "#000";
      ctx.strokeRect(x + 0.75, y + 0.75, Math.max(1.5, w - 1.5), Math.max(1.5, g.rowHeight - 1.5));
      ctx.strokeStyle = "#fff";
      ctx.lineWidth = 1;
      ctx.strokeRect(x - 0.5, y - 0.5, w + 1, g.rowHeight + 1);
    }
  }
}
