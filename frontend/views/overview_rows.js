// The overview's two columns beside the heatmap: each row's layer name, and its verdict chip (the `anomalies`
// route's `layers[].verdict`, tb_layergrad/reader/anomalies.py) with a "dominated" chip for per-example records.
// Names come from user code: they go in as text only (dom.js).

import { dominatedRule, isOrigin, stateChip } from "../anomalies.js";
import { h, replace } from "../dom.js";
import { markOrigin, verdictWhy } from "./verdict.js";

/**
 * The row labels, in model order; a label is coloured by its verdict while it holds (or where a NaN was born).
 * @param {HTMLElement} column the labels' column
 * @param {{layers: string[], names: string[], an: object, rowH: number, open: (row: number) => void}} o
 *   the full paths, the names shown (common prefix cut), the anomalies on the grid (`fromRoute`), the row height
 */
export function drawLabels(column, { layers, names, an, rowH, open }) {
  // Rows under 13 px cannot hold text: then labels float over their row, one every `every` rows.
  const dense = rowH < 13;
  const every = dense ? Math.ceil(14 / rowH) : 1;
  column.classList.toggle("lg-dense", dense);
  column.style.height = `${rowH * names.length}px`;
  const items = names.map((name, i) => {
    const full = layers[i];
    const el = h("div", {
      class: "lg-row-label",
      role: "listitem",
      title: `${full} — click for the layer's detail`,
      dataset: { layer: full, row: i },
      style: dense ? { top: `${(i + 0.5) * rowH - 7}px` } : { height: `${rowH}px`, "line-height": `${rowH}px` },
      on: { click: () => open(i) },
    });
    el.textContent = name;
    if (i % every !== 0) el.hidden = true;
    // The route's verdict of the layer (tb_layergrad/reader/anomalies.py), as the chips, banners and report say.
    const v = an.layers[i].verdict;
    const kind = v && (v.now || v.state === "nan_origin") ? stateChip(v.state) : null;
    if (kind) el.classList.add(`lg-flag-${kind}`);
    if (v) el.dataset.state = v.state;
    if (isOrigin(v)) {
      el.style.fontWeight = "700";
      el.title = `${full} — the first NaN/Inf was born here (step ${v.step}) — click for the layer's detail`;
    }
    return el;
  });
  replace(column, items);
}

/**
 * One chip per row for its verdict (none for "ok"), and one for "one example dominates"; in rows too thin for
 * text, a bar in the colour of the row's most serious chip.
 * @param {HTMLElement} column the chips' column
 * @param {{layers: string[], an: object, route: object, rowH: number, openStep: (layer: string, step: number) => void}} o
 *   the full paths, the anomalies on the grid, the route's answer, the row height
 */
export function drawChips(column, { layers, an, route, rowH, openStep }) {
  const dense = rowH < 12;
  column.classList.toggle("lg-dense", dense);
  column.style.height = `${rowH * an.layers.length}px`;
  const items = [];
  an.layers.forEach((f, i) => {
    const chips = [];
    const n = Math.max(1, f.recorded);
    // One chip for the layer's verdict (the route decides it; its text is the report's `verdict` column).
    const v = f.verdict;
    const kind = v ? stateChip(v.state) : null;
    if (kind && v.state !== "dominated") {
      const why = verdictWhy(v, { counts: f.count, recorded: n, thresholds: an.thresholds, originLine: (route.summary.origin || {}).line });
      chips.push([kind, v.text, why, null, v.state]);
    }
    const dom = f.dominated;
    // One example dominating is the verdict itself when nothing else holds: one chip, the verdict's words.
    const domText = v && v.state === "dominated" ? v.text : `1 example ${Math.round(100 * dom?.worst_share)}% @${dom?.worst_step}`;
    if (dom) chips.push(["dominated", domText, `${dom.line}: ${dominatedRule(route)} — click: this layer at step ${dom.worst_step}`, dom, v && v.state === "dominated" ? "dominated" : undefined]);
    if (dense) {
      // One thin bar per flagged row, in the colour of its most serious flag.
      if (chips.length) {
        items.push(h("span", {
          class: `lg-row-bar lg-chip-${chips[0][0]}`,
          title: `${layers[i]}\n${chips.map((c) => c[2]).join("\n")}`,
          dataset: { row: i },
          style: { top: `${i * rowH}px`, height: `${Math.max(2, rowH)}px` },
        }));
      }
      return;
    }
    const row = h("div", { class: "lg-row-chip", style: { height: `${rowH}px` }, dataset: { row: i } });
    // At most two chips; "dominated" (not a flag of the cells) goes last and keeps its place.
    const shown = chips.length > 2 && chips[chips.length - 1][0] === "dominated" ? [chips[0], chips[chips.length - 1]] : chips.slice(0, 2);
    for (const [kind, text, title, dom, state] of shown) {
      const open = dom ? { click: () => openStep(dom.layer, dom.worst_step) } : null;
      const chip = h("span", { class: `lg-chip lg-chip-${kind}${dom ? " lg-chip-link" : ""}`, text, title, dataset: { ...(dom ? { layer: dom.layer, step: dom.worst_step } : {}), ...(state ? { state } : {}) }, on: open });
      if (state === "nan_origin") markOrigin(chip); // born here, not merely reached
      row.appendChild(chip);
    }
    items.push(row);
  });
  replace(column, items);
}
