// The Runs view's table: one row per run of the `sweep` answer, its hyperparameters and its gradient health
// as columns. Rows are built once per answer and then only reordered (sort) or hidden (filters), so that a
// sweep of hundreds of runs stays quick. Every name and value goes in as text, cut short with the whole of
// it in the cell's title.

import { stateChip } from "../anomalies.js";
import { h, replace } from "../dom.js";
import { fmtNum } from "../format.js";
import { hparamOf, severityOrder, sortRows, valueAt } from "../sweep.js";
import { markOrigin, verdictWords } from "./verdict.js";

/** Characters of a value a cell shows; the title holds the rest. */
export const CELL_CHARS = 120;

/** A measure's value: the number of a dotted key, or the `step` of an object (`first_nonfinite`). */
export function measureValue(row, key) {
  const v = valueAt(row, key);
  return v !== null && typeof v === "object" && "step" in v ? v.step : v;
}

/** What a cell shows for `v`: numbers with the tab's digits, NaN (null) as "—", a missing value as nothing. */
export function cellText(v) {
  if (v === undefined) return "";
  if (v === null || typeof v === "number") return fmtNum(v);
  return String(v);
}

function short(text) {
  return text.length > CELL_CHARS ? `${text.slice(0, CELL_CHARS)}…` : text;
}

/** The group of the measure columns, folded into one summary column by default. */
export const MEASURES = "health measures";

/**
 * The columns of an answer: the run, its verdict and worst finding (beside the name: seen without scrolling
 * sideways), its hyperparameters, then the route's measures (group MEASURES, `fold`: hidden while folded),
 * with the pass and origin layer of the first NaN/Inf beside its step, and the summary column shown
 * instead of them while folded. Each: {id, label, group, get(row), cell(row) -> td, fold?, summary?}.
 */
export function columnsOf(answer) {
  const text = (id, label, group, get, title = "") => ({ id, label, group, title, get, cell: (r) => textCell(id, get(r)) });
  const cols = [text("run", "run", "", (r) => r.run)];
  cols.push({ id: "verdict", label: "verdict", group: "gradient health", title: "the run's worst layer verdict (sorts by severity)", get: (r) => r.severity, cell: verdictCell });
  cols.push({ id: "finding", label: "worst finding", group: "gradient health", title: "the finding behind the verdict", get: (r) => r.line ?? null, cell: findingCell });
  for (const hp of answer.hparams || []) {
    const col = text(`hp:${hp.name}`, hp.name, "hyperparameters", (r) => hparamOf(r, hp.name), `hyperparameter '${hp.name}' (${hp.kind})`);
    cols.push(col);
  }
  const measures = [];
  const origin = [
    text("pass", "pass", MEASURES, (r) => valueAt(r, "first_nonfinite.pass"), "the pass where the first NaN/Inf was born"),
    text("origin", "origin layer", MEASURES, (r) => valueAt(r, "first_nonfinite.origin"), "the layer where the first NaN/Inf was born"),
  ];
  let placed = false;
  for (const m of answer.measures || []) {
    if (m.key === "severity") continue; // the verdict column, which sorts by it
    measures.push(text(`m:${m.key}`, m.label, MEASURES, (r) => measureValue(r, m.key), m.label));
    if (!placed && m.key.startsWith("first_nonfinite")) {
      measures.push(...origin);
      placed = true;
    }
  }
  if (!placed) measures.unshift(...origin);
  const summary = { id: "summary", label: "in short", group: MEASURES, summary: true, title: "the measures that are not 0, in short (unfold the group for every column)", get: () => null, cell: (r) => summaryCell(r, answer.measures || []) };
  return [...cols, summary, ...measures.map((c) => ({ ...c, fold: true }))];
}

/** "first NaN/Inf step 17 (backward, m/dense) · NaN/Inf layers at the last step 1": the counts not 0, in short. */
export function summaryText(row, measures) {
  const bits = [];
  for (const m of measures) {
    const v = measureValue(row, m.key);
    if (m.key === "first_nonfinite.step" && typeof v === "number") {
      const where = [valueAt(row, "first_nonfinite.pass"), valueAt(row, "first_nonfinite.origin")].filter((x) => x !== null && x !== undefined);
      bits.push(`${m.label} ${fmtNum(v)}${where.length ? ` (${where.join(", ")})` : ""}`);
    } else if (m.kind === "count" && m.key !== "layers" && typeof v === "number" && v > 0) bits.push(`${m.label} ${fmtNum(v)}`);
  }
  return bits.join(" · ");
}

function summaryCell(row, measures) {
  const full = summaryText(row, measures);
  return h("td", { class: "lg-runs-summary", dataset: { col: "summary" }, text: full, title: full });
}

function findingCell(r) {
  const full = r.line ?? "";
  return h("td", { class: "lg-runs-finding", dataset: { col: "finding" }, text: short(full), title: full });
}

function textCell(id, v) {
  const full = cellText(v);
  const td = h("td", { dataset: { col: id }, text: short(full) });
  if (full.length > CELL_CHARS || id === "run") td.title = full;
  if (typeof v === "number" || v === null) td.classList.add("lg-num");
  return td;
}

function verdictCell(r) {
  const td = h("td", { dataset: { col: "verdict", state: r.verdict ?? "" } });
  const kind = r.verdict ? stateChip(r.verdict) : null;
  if (r.verdict) {
    const chip = h("span", { class: `lg-chip ${kind ? `lg-chip-${kind}` : "lg-chip-ok"}`, dataset: { state: r.verdict }, text: r.verdict_text || verdictWords(r.verdict), title: r.line || "" });
    td.appendChild(r.verdict === "nan_origin" ? markOrigin(chip) : chip);
  }
  return td;
}

export class RunsTable {
  /**
   * @param {{onOpen: (run: string) => void, onSelect: (runs: string[], on: boolean) => void, onSort: (id: string) => void}} handlers
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.head = h("thead");
    this.body = h("tbody");
    this.el = h("table", { class: "lg-runs-table" }, this.head, this.body);
    this.rows = new Map(); // run -> {row, tr, box}
    this.columns = [];
    this.order = [];
    this.folded = true; // a 1,280-px window shows every run's verdict and finding without scrolling sideways
  }

  /** Build the header and one row per run (once per answer). */
  build(answer) {
    this.columns = columnsOf(answer);
    this.allBox = h("input", { type: "checkbox", "aria-label": "select every run shown", on: { change: () => this._selectShown(this.allBox.checked) } });
    const groups = [];
    for (const c of this.columns) {
      const last = groups[groups.length - 1];
      if (last && last.group === c.group) last.cols.push(c);
      else groups.push({ group: c.group, cols: [c] });
    }
    this.headCells = new Map();
    this.foldBtn = h("button", { type: "button", class: "lg-link lg-runs-fold", on: { click: () => this.setFolded(!this.folded) } });
    this.foldTh = null;
    const groupTh = (g) => {
      if (g.group !== MEASURES) return h("th", { colspan: g.cols.length, class: g.group ? null : "lg-runs-sticky", text: g.group });
      this.foldTh = h("th", { class: "lg-runs-fold-head", dataset: { spans: g.cols.filter((c) => c.fold).length } }, h("span", { text: `${g.group} ` }), this.foldBtn);
      return this.foldTh;
    };
    replace(
      this.head,
      h("tr", { class: "lg-runs-groups" }, h("th", { class: "lg-runs-check" }), groups.map(groupTh)),
      h("tr", null, h("th", { class: "lg-runs-check" }, this.allBox), this.columns.map((c) => {
        const btn = c.summary
          ? h("span", { class: "lg-sort-none", title: c.title, text: c.label })
          : h("button", { type: "button", class: "lg-sort", title: `${c.title ? `${c.title} — ` : ""}click: sort; again: descending`, text: c.label, on: { click: () => this.handlers.onSort(c.id) } });
        const th = h("th", { dataset: { col: c.id, ...(c.fold ? { fold: "1" } : {}), ...(c.summary ? { summary: "1" } : {}) }, "aria-sort": "none", class: c.id === "run" ? "lg-runs-sticky" : null }, btn);
        if (!c.summary) this.headCells.set(c.id, th);
        return th;
      })),
    );
    this.rows = new Map();
    for (const row of answer.runs) {
      const box = h("input", { type: "checkbox", "aria-label": `select ${row.run}`, on: { change: () => this.handlers.onSelect([row.run], box.checked) } });
      const cells = this.columns.map((c) => {
        const td = c.cell(row);
        if (c.fold) td.dataset.fold = "1";
        if (c.summary) td.dataset.summary = "1";
        return td;
      });
      const nameCell = cells[0];
      nameCell.classList.add("lg-runs-sticky");
      const name = nameCell.textContent;
      nameCell.textContent = "";
      nameCell.appendChild(h("button", { type: "button", class: "lg-link lg-runs-open", text: name, title: `open the overview of ${row.run}`, on: { click: () => this.handlers.onOpen(row.run) } }));
      // A damaged event file: TensorBoard read the run up to the damage only (each file's sentence in the title).
      if (row.damage && row.damage.length) nameCell.appendChild(h("span", { class: "lg-chip lg-chip-damage", text: "damaged", title: row.damage.map((d) => d.line).join("\n") }));
      const tr = h("tr", { dataset: { run: row.run } }, h("td", { class: "lg-runs-check" }, box), cells);
      this.rows.set(row.run, { row, tr, box });
    }
    this.answer = answer;
    this.setFolded(this.folded);
  }

  /** Fold the measure columns into their summary (true), or show each of them. */
  setFolded(folded) {
    this.folded = folded;
    this.el.classList.toggle("lg-folded", folded);
    if (!this.foldTh) return;
    const n = Number(this.foldTh.dataset.spans);
    this.foldTh.colSpan = folded ? 1 : n;
    this.foldBtn.textContent = folded ? `▸ show its ${n} columns` : "◂ fold";
    this.foldBtn.setAttribute("aria-expanded", folded ? "false" : "true");
  }

  /** Put the rows in the order of column `sort` ("-id": descending; null: the most severe first). */
  sort(sort) {
    const desc = Boolean(sort) && sort.startsWith("-");
    const id = sort ? sort.replace(/^-/, "") : null;
    const col = this.columns.find((c) => c.id === id);
    const rows = [...this.rows.values()].map((x) => x.row);
    const ordered = col ? sortRows(rows, col.get, desc) : severityOrder(rows);
    this.order = ordered.map((r) => r.run);
    this.body.append(...this.order.map((run) => this.rows.get(run).tr)); // moves the rows built once
    for (const [cid, th] of this.headCells) th.setAttribute("aria-sort", cid === (col && col.id) ? (desc ? "descending" : "ascending") : "none");
  }

  /** Show only the runs `keep(row)` accepts; returns how many are shown. */
  filter(keep) {
    let shown = 0;
    for (const { row, tr } of this.rows.values()) {
      const on = keep(row);
      tr.hidden = !on;
      if (on) shown += 1;
    }
    this._syncAll();
    return shown;
  }

  /** Tick the runs of `selected`. */
  select(selected) {
    const set = new Set(selected);
    for (const [run, { box, tr }] of this.rows) {
      box.checked = set.has(run);
      tr.classList.toggle("lg-selected", box.checked);
    }
    this._syncAll();
  }

  shownRuns() {
    return this.order.filter((run) => !this.rows.get(run).tr.hidden);
  }

  _syncAll() {
    if (!this.allBox) return;
    const shown = [...this.rows.values()].filter((x) => !x.tr.hidden);
    const on = shown.filter((x) => x.box.checked).length;
    this.allBox.checked = shown.length > 0 && on === shown.length;
    this.allBox.indeterminate = on > 0 && on < shown.length;
  }

  _selectShown(on) {
    this.handlers.onSelect(this.shownRuns(), on);
  }
}
