// The Runs view, the landing page of a sweep: one row per run with its hyperparameters and its gradient health
// (the `sweep` route), sorted and filtered here; the runs ticked are the ones Compare shows (the state's `runs`);
// a run's name opens its overview. Below, the scatter of one hyperparameter against one health measure.

import { api, isAbort, isTransient } from "../api.js";
import { h, replace, clear } from "../dom.js";
import { distinctValues, passesHparams, runFilter, valueKey } from "../sweep.js";
import { errorBox, field, note } from "./common.js";
import { RunsTable, cellText } from "./runs_table.js";
import { ScatterPanel } from "./runs_scatter.js";

/** The state's hyperparameter filters ({name: value key}), {} when absent or malformed. */
function hparamFilters(state) {
  try {
    const v = state.hpf ? JSON.parse(state.hpf) : {};
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

const nextFrame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));

export class RunsView {
  constructor(app) {
    this.app = app;
    this.abort = null;
    this.answer = null;
    this.text = "";
    this.filterInput = h("input", {
      type: "text",
      class: "lg-runs-filter",
      placeholder: "filter runs (regex)",
      "aria-label": "filter runs by a regular expression",
      spellcheck: "false",
      on: { input: () => app.setState({ filter: this.filterInput.value }) },
    });
    this.filterError = h("span", { class: "lg-filter-error", role: "status" });
    this.hpFilters = h("span", { class: "lg-run-controls" });
    this.count = h("span", { class: "lg-muted lg-runs-count", "aria-live": "polite" });
    this.compareBtn = h("button", { type: "button", class: "lg-button lg-runs-compare", on: { click: () => app.setState({ view: "compare" }) } });
    this.clearBtn = h("button", { type: "button", class: "lg-link", text: "clear selection", on: { click: () => app.setState({ runs: [] }) } });
    this.toolbar = h(
      "div",
      { class: "lg-toolbar" },
      field("Runs", h("span", { class: "lg-filter-box" }, this.filterInput, this.filterError), "lg-field-wide"),
      this.hpFilters,
      h("span", { class: "lg-spacer" }),
      this.count,
      this.clearBtn,
      this.compareBtn,
    );
    this.message = h("div", { class: "lg-messages" });
    this.table = new RunsTable({
      onOpen: (run) => this._open(run),
      onSort: (id) => this._sort(id),
      onSelect: (runs, on) => this._select(runs, on),
    });
    this.scatter = new ScatterPanel({ app, onOpen: (run) => this._open(run) });
    this.body = h("div", { class: "lg-runs-body" }, h("div", { class: "lg-panel lg-panel-table lg-runs-panel" }, this.table.el), this.scatter.el);
    this.el = h("section", { class: "lg-view lg-runs", dataset: { view: "runs" } }, this.toolbar, this.message, this.body);
  }

  /** The run's overview on the target its row is about (a GAN's row: the one of its targets in the worst state). */
  _open(run) {
    const row = this.answer && this.answer.runs.find((r) => r.run === run);
    this.app.setState({ view: "overview", run, target: row && row.target ? row.target : null });
  }

  _params(state) {
    return state.source && state.source !== "output" ? { source: state.source } : {};
  }

  async show(state) {
    this.state = state;
    const key = JSON.stringify(this._params(state));
    if (!this.answer || this.key !== key) await this._load(state, key, false);
    else this._apply(state);
  }

  async refresh() {
    if (this.abort) return;
    this.state = this.app.resolved();
    await this._load(this.state, JSON.stringify(this._params(this.state)), Boolean(this.answer));
  }

  async _load(state, key, quiet) {
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    if (!quiet) this.app.busy(true);
    try {
      const params = this._params(state);
      const answer = await (this.app.takeEarlySweep(params) || api.sweep(params, { signal: abort.signal }));
      if (abort.signal.aborted) return;
      const t0 = performance.now();
      const text = JSON.stringify(answer);
      this.retryOnPoll = false;
      clear(this.message);
      this.key = key;
      if (text !== this.text) {
        // A new answer: build the rows once; sorting and filtering only move or hide them after.
        this.answer = answer;
        this.text = text;
        this.table.build(answer);
        this._drawnFilters = null;
      }
      this.body.hidden = false;
      this._apply(this.app.resolved());
      await nextFrame();
      this.el.dataset.drawMs = String(Math.round(performance.now() - t0));
      this.el.dataset.rows = String(this.answer.runs.length);
    } catch (e) {
      if (isAbort(e)) return;
      this.retryOnPoll = isTransient(e);
      if (!quiet) {
        this.answer = null;
        this.text = "";
        this.body.hidden = true;
      }
      replace(this.message, errorBox(e, "the runs of this logdir", { retry: this.app.retry }));
    } finally {
      if (this.abort === abort) this.abort = null;
      if (!quiet) this.app.busy(false);
    }
  }

  /** Sort, filter, tick and plot after a change of the state (the rows stay as built). */
  _apply(state) {
    this.state = state;
    const a = this.answer;
    if (!a) return;
    if (this.filterInput.value !== state.filter && document.activeElement !== this.filterInput) this.filterInput.value = state.filter;
    const byName = runFilter(state.filter);
    this.filterInput.classList.toggle("lg-invalid", Boolean(byName.error));
    this.filterInput.setAttribute("aria-invalid", byName.error ? "true" : "false");
    this.filterError.textContent = byName.error ? `invalid regular expression (${byName.error}): no run is filtered out` : "";
    const filters = hparamFilters(state);
    this._hparamControls(a, filters);
    const byNameOk = byName.test || (() => true);
    const keep = (row) => byNameOk(row.run) && passesHparams(row, filters);
    this.table.sort(state.sort);
    const shown = this.table.filter(keep);
    const selected = state.runs.filter((r) => this.table.rows.has(r));
    this.table.select(selected);
    this.count.textContent = shown === a.runs.length ? `${a.runs.length} runs` : `${shown} of ${a.runs.length} runs shown`;
    this.compareBtn.textContent = `Compare ${selected.length} selected`;
    this.compareBtn.disabled = !selected.length;
    this.compareBtn.title = selected.length ? "open Compare with the runs ticked" : "tick runs to compare them";
    this.clearBtn.hidden = !selected.length;
    if (!a.runs.length) replace(this.message, note("No run with layer gradients for this source yet."));
    const rows = this.table.shownRuns().map((r) => this.table.rows.get(r).row);
    this.scatter.show(a, rows, state);
  }

  /** One select per hyperparameter: any value, one of its values, or "(none)" for runs without it. */
  _hparamControls(a, filters) {
    const sig = JSON.stringify(filters); // reset by a new answer (`_load`)
    if (this._drawnFilters === sig) return;
    this._drawnFilters = sig;
    const controls = (a.hparams || []).map(({ name }) => {
      const values = distinctValues(a.runs, name);
      const missing = a.runs.some((r) => !Object.prototype.hasOwnProperty.call(r.hparams || {}, name));
      const mixed = new Set(values.map((v) => typeof v)).size > 1;
      const options = [["*", "any"], ...values.map((v) => [valueKey(v), `${cellText(v).slice(0, 60)}${mixed && typeof v === "string" ? " (text)" : ""}`])];
      if (missing) options.push(["", "(none)"]);
      const el = h("select", { "aria-label": `filter by ${name}`, dataset: { hparam: name } });
      for (const [v, label] of options) el.appendChild(new Option(label, v));
      el.value = name in filters && options.some(([v]) => v === filters[name]) ? filters[name] : "*";
      el.addEventListener("change", () => {
        const next = { ...hparamFilters(this.app.state) };
        if (el.value === "*") delete next[name];
        else next[name] = el.value;
        this.app.setState({ hpf: Object.keys(next).length ? JSON.stringify(next) : null });
      });
      const f = field(name.length > 30 ? `${name.slice(0, 30)}…` : name, el);
      f.title = name;
      return f;
    });
    replace(this.hpFilters, controls);
  }

  _sort(id) {
    const cur = this.state.sort;
    this.app.setState({ sort: cur === id ? `-${id}` : id });
  }

  _select(runs, on) {
    const cur = this.state.runs.filter((r) => this.table.rows.has(r));
    const next = on ? [...cur, ...runs.filter((r) => !cur.includes(r))] : cur.filter((r) => !runs.includes(r));
    this.app.setState({ runs: next });
  }

  onKey() {
    return false;
  }
}
