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

/**
 * The columns of an answer: the run, its hyperparameters, its verdict, then the route's measures, with the pass
 * and origin layer of the first NaN/Inf beside its step. Each: {id, label, group, get(row), cell(row) -> td}.
 */
export function columnsOf(answer) {
  const text = (id, label, group, get, title = "") => ({ id, label, group, title, get, cell: (r) => textCell(id, get(r)) });
  const cols = [text("run", "run", "", (r) => r.run)];
  for (const hp of answer.hparams || []) {
    const col = text(`hp:${hp.name}`, hp.name, "hyperparameters", (r) => hparamOf(r, hp.name), `hyperparameter '${hp.name}' (${hp.kind})`);
    cols.push(col);
  }
  cols.push({ id: "verdict", label: "verdict", group: "gradient health", title: "the run's worst layer verdict (sorts by severity)", get: (r) => r.severity, cell: verdictCell });
  const origin = [
    text("pass", "pass", "gradient health", (r) => valueAt(r, "first_nonfinite.pass"), "the pass where the first NaN/Inf was born"),
    text("origin", "origin layer", "gradient health", (r) => valueAt(r, "first_nonfinite.origin"), "the layer where the first NaN/Inf was born"),
  ];
  let placed = false;
  for (const m of answer.measures || []) {
    if (m.key === "severity") continue; // the verdict column, which sorts by it
    cols.push(text(`m:${m.key}`, m.label, "gradient health", (r) => measureValue(r, m.key), m.label));
    if (!placed && m.key.startsWith("first_nonfinite")) {
      cols.push(...origin);
      placed = true;
    }
  }
  if (!placed) cols.splice(cols.findIndex((c) => c.id === "verdict") + 1, 0, ...origin);
  return cols;
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
  }

  /** Build the header and one row per run (once per answer). */
  build(answer) {
    this.columns = columnsOf(answer);
    this.allBox = h("input", { type: "checkbox", "aria-label": "select every run shown", on: { change: () => this._selectShown(this.allBox.checked) } });
    const groups = [];
    for (const c of this.columns) {
      const last = groups[groups.length - 1];
      if (last && last.group === c.group) last.span += 1;
      else groups.push({ group: c.group, span: 1 });
    }
    this.headCells = new Map();
    replace(
      this.head,
      h("tr", { class: "lg-runs-groups" }, h("th"), groups.map((g) => h("th", { colspan: g.span, text: g.group }))),
      h("tr", null, h("th", { class: "lg-runs-check" }, this.allBox), this.columns.map((c) => {
        const btn = h("button", { type: "button", class: "lg-sort", title: `${c.title ? `${c.title} — ` : ""}click: sort; again: descending`, text: c.label, on: { click: () => this.handlers.onSort(c.id) } });
        const th = h("th", { dataset: { col: c.id }, "aria-sort": "none" }, btn);
        this.headCells.set(c.id, th);
        return th;
      })),
    );
    this.rows = new Map();
    for (const row of answer.runs) {
      const box = h("input", { type: "checkbox", "aria-label": `select ${row.run}`, on: { change: () => this.handlers.onSelect([row.run], box.checked) } });
      const cells = this.columns.map((c) => c.cell(row));
      const nameCell = cells[0];
      const name = nameCell.textContent;
      nameCell.textContent = "";
      nameCell.appendChild(h("button", { type: "button", class: "lg-link lg-runs-open", text: name, title: `open the overview of ${row.run}`, on: { click: () => this.handlers.onOpen(row.run) } }));
      const tr = h("tr", { dataset: { run: row.run } }, h("td", { class: "lg-runs-check" }, box), cells);
      this.rows.set(row.run, { row, tr, box });
    }
    this.answer = answer;
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
