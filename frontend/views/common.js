// Pieces shared by the views: labelled fields, error boxes, the step slider.

import { isTransient } from "../api.js";
import { h } from "../dom.js";
import { indexAtOrBefore } from "../charts/scale.js";

export function field(label, control, cls = "") {
  return h("label", { class: `lg-field ${cls}` }, h("span", { class: "lg-field-label", text: label }), control);
}

/**
 * A message box for a failed route (the server's text, as text). `retry`: for a failure that may
 * pass by itself (no connection, a 5xx), the box says that the tab keeps trying and offers a
 * "Retry now" button that calls it.
 */
export function errorBox(err, what, { retry = null } = {}) {
  const status = err && err.status ? ` (HTTP ${err.status}${err.route ? ` from '${err.route}'` : ""})` : "";
  return h(
    "div",
    { class: "lg-error", role: "alert" },
    h("strong", { text: what ? `Could not load ${what}` : "Something went wrong" }),
    h("span", { class: "lg-error-text", text: `: ${err && err.message ? err.message : String(err)}${status}` }),
    ...(retry && isTransient(err)
      ? [h("span", { class: "lg-error-retry", text: " — the tab tries again by itself. " }), h("button", { type: "button", class: "lg-link lg-retry", text: "Retry now", on: { click: retry } })]
      : []),
  );
}

export function note(text, cls = "") {
  return h("div", { class: `lg-note ${cls}`, text });
}

/** A toggle button group: [[value, label], ...]. */
export class Toggle {
  constructor(options, value, onChange, label = "") {
    this.buttons = options.map(([v, text]) =>
      h("button", { type: "button", class: "lg-toggle-btn", dataset: { value: v }, text, on: { click: () => onChange(v) } }),
    );
    this.el = h("span", { class: "lg-toggle", role: "group", "aria-label": label }, this.buttons);
    this.set(value);
  }

  /** Disable the button of `value` with `reason` as its tooltip (a choice that can show nothing); null enables it. */
  disable(value, reason) {
    const b = this.buttons.find((x) => x.dataset.value === String(value));
    if (!b) return;
    b.disabled = Boolean(reason);
    if (reason) b.title = reason;
    else b.removeAttribute("title");
  }

  set(value) {
    for (const b of this.buttons) {
      const on = b.dataset.value === String(value);
      b.classList.toggle("lg-on", on);
      b.setAttribute("aria-pressed", on ? "true" : "false");
    }
  }
}

/**
 * A step slider over the recorded steps (the slider moves by index, so irregular
 * step numbers are fine), with previous/next buttons and the step shown as text.
 * Arrow keys: the view forwards them (stepKeys), with the focus on the slider too.
 */
export class StepSlider {
  constructor(onChange) {
    this.onChange = onChange;
    this.steps = [];
    this.index = -1;
    this.input = h("input", { type: "range", min: "0", max: "0", value: "0", step: "1", class: "lg-slider", "aria-label": "step" });
    this.input.addEventListener("input", () => this._pick(Number(this.input.value)));
    this.label = h("span", { class: "lg-step-value", "aria-live": "polite" });
    this.range = h("span", { class: "lg-step-range" });
    this.prev = h("button", { type: "button", class: "lg-icon-btn", title: "previous step (←)", "aria-label": "previous step", text: "‹", on: { click: () => this.move(-1) } });
    this.next = h("button", { type: "button", class: "lg-icon-btn", title: "next step (→)", "aria-label": "next step", text: "›", on: { click: () => this.move(1) } });
    this.el = h("div", { class: "lg-stepper" }, h("span", { class: "lg-field-label", text: "Step" }), this.prev, this.input, this.next, this.label, this.range);
  }

  /** Set the available steps and the chosen one (null: the last). Returns the step in use. */
  set(steps, step) {
    this.steps = steps;
    this.input.max = String(Math.max(0, steps.length - 1));
    this.input.disabled = steps.length < 2;
    this.el.hidden = !steps.length;
    if (!steps.length) {
      this.index = -1;
      this.label.textContent = "—";
      this.range.textContent = "";
      return null;
    }
    let i = step === null || step === undefined ? steps.length - 1 : steps.indexOf(step);
    if (i < 0) i = Math.max(0, indexAtOrBefore(steps, step));
    this.index = i;
    this.input.value = String(i);
    this.label.textContent = String(steps[i]);
    this.label.dataset.step = String(steps[i]);
    this.range.textContent = `of ${steps[0]}–${steps[steps.length - 1]} (${steps.length} logged)`;
    return steps[i];
  }

  move(delta) {
    if (!this.steps.length) return;
    this._pick(Math.max(0, Math.min(this.steps.length - 1, this.index + delta)));
  }

  jump(toEnd) {
    if (this.steps.length) this._pick(toEnd ? this.steps.length - 1 : 0);
  }

  _pick(i) {
    if (i === this.index || i < 0 || i >= this.steps.length) return;
    this.index = i;
    this.input.value = String(i);
    this.label.textContent = String(this.steps[i]);
    this.label.dataset.step = String(this.steps[i]);
    this.onChange(this.steps[i]);
  }
}

/**
 * Handle ←/→ (±1 logged step), Shift (±10), Home/End for a StepSlider, the same wherever the focus is
 * (the page, a chart, a button, the slider itself: its own arrow keys would ignore Shift), except in
 * another form control, whose arrow keys are its own.
 */
export function stepKeys(e, slider) {
  const t = e.target;
  const own = t === slider.input;
  if (t && !own && (["INPUT", "SELECT", "TEXTAREA"].includes(t.tagName) || t.isContentEditable)) return false;
  if (e.altKey || e.ctrlKey || e.metaKey) return false;
  const big = e.shiftKey ? 10 : 1;
  if (e.key === "ArrowLeft") slider.move(-big);
  else if (e.key === "ArrowRight") slider.move(big);
  else if (e.key === "Home") slider.jump(false);
  else if (e.key === "End") slider.jump(true);
  else return false;
  e.preventDefault();
  return true;
}

export function busy(el, on) {
  el.classList.toggle("lg-busy", Boolean(on));
}
