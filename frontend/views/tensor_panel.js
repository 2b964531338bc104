// The layer view's raw gradient panel: the tensor written at the chosen step (or the last one before it),
// as a red-blue map with NaN and ±Inf in their own colours; hidden for layers without raw tensors.

import { api, isAbort } from "../api.js";
import { COLORS, RDBU, lutIndex, packHex } from "../charts/colors.js";
import { Heatmap } from "../charts/heatmap.js";
import { indexAtOrBefore } from "../charts/scale.js";
import { tooltip } from "../charts/tooltip.js";
import { h, clear, replace, select, setOptions } from "../dom.js";
import { fmtNum } from "../format.js";
import { errorBox } from "./common.js";

const NAN_COLOR = packHex(COLORS.nan);
const INF_COLOR = packHex(COLORS.inf);

export class TensorPanel {
  constructor() {
    this.cache = new Map(); // "series@step" (and "series@latest") -> the route's answer
    this.tensorSelect = select([], null, () => this._loadTensor(), { "aria-label": "tensor series" });
    this.tensorInfo = h("div", { class: "lg-muted" });
    this.tensorMsg = h("div");
    this.tensorPlot = h("div", { class: "lg-tensor-plot" });
    this.tensorMap = new Heatmap(this.tensorPlot, { label: "raw gradient", onHover: (c) => this._hover(c), onLeave: () => tooltip().hide() });
    this.tensorLegend = h("div", { class: "lg-heat-legend" });
    this.el = h(
      "div",
      { class: "lg-panel lg-panel-tensor", hidden: true },
      h("div", { class: "lg-panel-head" }, h("h3", { class: "lg-panel-title", text: "Raw gradient" }), this.tensorSelect),
      this.tensorInfo,
      this.tensorMsg,
      this.tensorLegend,
      this.tensorPlot,
    );
  }

  /** After a reload: everything (another run or layer), or only what "the latest" meant (`quiet`: a poll). */
  forget(quiet) {
    if (!quiet) this.cache.clear();
    else for (const k of [...this.cache.keys()]) if (k.endsWith("@latest")) this.cache.delete(k);
  }

  /** Show the tensor of one of `series` (those with raw tensors) at `step` of `run`, or at the step before. */
  show(run, series, step) {
    this.run = run;
    this.series = series;
    this.step = step;
    const withTensor = series.filter((x) => x.kinds.includes("tensor"));
    this.el.hidden = !withTensor.length;
    if (!withTensor.length) return;
    const current = this.tensorSelect.value;
    setOptions(this.tensorSelect, withTensor.map((x) => [x.key, x.label]), withTensor.some((x) => x.key === current) ? current : withTensor[0].key);
    this.tensorSelect.hidden = withTensor.length < 2;
    clearTimeout(this._timer);
    this._timer = setTimeout(() => this._loadTensor(), 120);
  }

  async _loadTensor() {
    const x = (this.series || []).find((q) => q.key === this.tensorSelect.value);
    if (!x) return;
    const { step, run, series } = this;
    const ck = (s) => `${x.key}@${s}`;
    try {
      // The steps that have a tensor: from a first answer (the latest), cached.
      let latest = this.cache.get(ck("latest"));
      if (!latest) {
        latest = await api.tensor({ run, layer: x.layer, target: x.target, source: x.source });
        this.cache.set(ck("latest"), latest);
        this.cache.set(ck(latest.step), latest);
      }
      const steps = latest.steps;
      let k = step === null ? steps.length - 1 : indexAtOrBefore(steps, step);
      const exact = k >= 0 && steps[k] === step;
      if (k < 0) k = 0;
      const want = steps[k];
      let body = this.cache.get(ck(want));
      if (!body) {
        body = await api.tensor({ run, layer: x.layer, target: x.target, source: x.source, step: want });
        this.cache.set(ck(want), body);
      }
      if (this.series !== series || this.step !== step) return;
      clear(this.tensorMsg);
      this._draw(body, exact ? null : `no raw tensor at step ${step}; showing step ${want} (raw tensors at ${steps.length} steps)`);
    } catch (e) {
      if (isAbort(e)) return;
      replace(this.tensorMsg, errorBox(e, "the raw gradient"));
    }
  }

  _draw(body, why) {
    const [rows, cols] = body.shape.length === 2 ? body.shape : [1, body.values.flat().length];
    const bad = new Map(body.nonfinite.map(([r, c, kind]) => [r * cols + c, kind]));
    let m = Math.max(Math.abs(body.min || 0), Math.abs(body.max || 0)) || 1;
    const cell = (i, j) => {
      const kind = bad.get(i * cols + j);
      if (kind) return kind === "nan" ? NAN_COLOR : INF_COLOR;
      const v = body.values[i][j];
      if (v === null || v === undefined) return 0;
      return RDBU.packed[lutIndex(0.5 + v / (2 * m))];
    };
    this.body = body;
    const width = Math.max(160, this.tensorPlot.clientWidth || this.el.clientWidth - 24 || 400);
    const rowH = Math.max(4, Math.min(26, Math.floor(260 / rows)));
    this.tensorMap.draw({ rows, cols, width, rowHeight: rowH, cell });
    this.tensorInfo.textContent = `step ${body.step} · shown as [${rows}, ${cols}] · min ${fmtNum(body.min)} · max ${fmtNum(body.max)}` +
      (body.nonfinite.length ? ` · ${body.nonfinite.length} non-finite` : "") + (why ? ` — ${why}` : "");
    const sw = (color, text) => h("span", { class: "lg-legend-item" }, h("span", { class: "lg-swatch", style: { background: color } }), h("span", { text }));
    replace(
      this.tensorLegend,
      sw(RDBU.css[0], `−${fmtNum(m)}`),
      sw(RDBU.css[128], "0"),
      sw(RDBU.css[255], `+${fmtNum(m)}`),
      body.nonfinite.some((q) => q[2] === "nan") ? sw(COLORS.nan, "NaN") : null,
      body.nonfinite.some((q) => q[2] !== "nan") ? sw(COLORS.inf, "±Inf") : null,
    );
  }

  _hover(c) {
    const b = this.body;
    if (!b) return;
    const kind = b.nonfinite.find((q) => q[0] === c.i && q[1] === c.j);
    const v = kind ? kind[2] : fmtNum(b.values[c.i][c.j]);
    tooltip().show(c.clientX, c.clientY, `[${c.i}, ${c.j}]`, [["value", v], ["step", String(b.step)]]);
  }
}
