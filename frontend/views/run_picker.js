// The runs compared, for a sweep of a hundred: a scrolling list with a checkbox per run (its colour beside
// it), a regular-expression filter as TensorBoard's run selector has (case-insensitive; an invalid expression
// says so), and "all" / "none" for the runs the filter shows. Names are text. The choice itself lives in the
// URL (`runs`), so other views share it; the filter is this list's own.

import { h, replace } from "../dom.js";

/**
 * A compiled filter, or the reason it is not one.
 * @returns {{test: (name: string) => boolean, error: string|null}}
 */
export function runFilter(text) {
  if (!text) return { test: () => true, error: null };
  try {
    const re = new RegExp(text, "i");
    return { test: (name) => re.test(name), error: null };
  } catch (e) {
    return { test: () => false, error: `not a regular expression: ${e.message}` };
  }
}

export class RunPicker {
  /**
   * @param {(runs: string[]) => void} onChange the new choice, in the order runs were picked.
   * @param {(run: string|null) => void} onHover the run whose row is under the pointer (null: none).
   */
  constructor(onChange, onHover) {
    this.onChange = onChange;
    this.onHover = onHover;
    this.all = [];
    this.chosen = [];
    this.colorOf = () => "";
    this.listed = null; // the runs the rows are for (JSON)
    this.rows = new Map();
    this.filter = h("input", {
      type: "search",
      class: "lg-run-filter",
      placeholder: "filter runs (regular expression)",
      "aria-label": "filter runs by regular expression",
      spellcheck: "false",
      on: { input: () => this._render() },
    });
    this.error = h("span", { class: "lg-run-filter-error", role: "alert" });
    this.allBtn = h("button", { type: "button", class: "lg-button lg-small", text: "All", on: { click: () => this._setShown(true) } });
    this.noneBtn = h("button", { type: "button", class: "lg-button lg-small", text: "None", on: { click: () => this._setShown(false) } });
    this.count = h("span", { class: "lg-run-count lg-muted", "aria-live": "polite" });
    this.list = h("div", { class: "lg-run-list", role: "group", "aria-label": "runs to compare" });
    this.el = h(
      "div",
      { class: "lg-run-picker" },
      h("div", { class: "lg-run-picker-head" }, this.filter, this.allBtn, this.noneBtn, this.count, this.error),
      this.list,
    );
  }

  /** Show `all` runs, `chosen` ticked, each with its colour (`colorOf`). */
  update(all, chosen, colorOf) {
    this.all = all;
    this.chosen = chosen;
    this.colorOf = colorOf;
    this._render();
  }

  /** The runs the filter shows. */
  shown() {
    const f = runFilter(this.filter.value);
    return this.all.filter((r) => f.test(r));
  }

  _render() {
    const f = runFilter(this.filter.value);
    this.error.textContent = f.error || "";
    this.filter.setAttribute("aria-invalid", f.error ? "true" : "false");
    const shown = this.all.filter((r) => f.test(r));
    const on = new Set(this.chosen);
    if (JSON.stringify(shown) !== this.listed || !shown.length) {
      // Other runs listed: new rows. The same runs: the rows are updated in place, so that a ticked box keeps
      // the keyboard focus and the list its scroll position.
      this.listed = JSON.stringify(shown);
      this.rows = new Map(shown.map((name) => [name, this._row(name)]));
      replace(this.list, [...this.rows.values()].map((r) => r.el));
      if (!shown.length) this.list.appendChild(h("div", { class: "lg-note", text: f.error ? "fix the expression to see runs" : "no run matches the filter" }));
    }
    for (const [name, row] of this.rows) {
      row.on = on.has(name);
      row.el.classList.toggle("lg-on", row.on);
      row.box.checked = row.on;
      row.swatch.style.background = row.on ? this.colorOf(name) : "transparent";
    }
    const picked = shown.filter((r) => on.has(r)).length;
    this.allBtn.disabled = picked === shown.length;
    this.noneBtn.disabled = picked === 0;
    this.allBtn.title = `compare the ${shown.length} runs listed`;
    this.noneBtn.title = `compare none of the ${shown.length} runs listed`;
    const filtered = shown.length < this.all.length ? ` · ${shown.length} listed` : "";
    this.count.textContent = `${this.chosen.length} of ${this.all.length} runs compared${filtered}`;
  }

  /** A run's row: {el, box, swatch, on}; `_render` ticks it and colours it. */
  _row(name) {
    const row = { on: false };
    row.box = h("input", { type: "checkbox", on: { change: () => this._toggle(name, row.box.checked) } });
    row.swatch = h("span", { class: "lg-swatch" });
    row.el = h(
      "label",
      {
        class: "lg-run-item",
        dataset: { run: name },
        title: name,
        on: { mouseenter: () => this.onHover(row.on ? name : null), mouseleave: () => this.onHover(null) },
      },
      row.box,
      row.swatch,
      h("span", { class: "lg-run-item-name", text: name }),
    );
    return row;
  }

  _toggle(name, on) {
    this.onChange(on ? [...this.chosen.filter((r) => r !== name), name] : this.chosen.filter((r) => r !== name));
  }

  /** Tick (or untick) every run the filter shows; the others stay as they are. */
  _setShown(on) {
    const shown = this.shown();
    if (on) this.onChange([...this.chosen, ...shown.filter((r) => !this.chosen.includes(r))]);
    else {
      const off = new Set(shown);
      this.onChange(this.chosen.filter((r) => !off.has(r)));
    }
  }
}
