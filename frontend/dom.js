// DOM helpers. Every string goes in through textContent or setAttribute: names of
// runs and layers come from user code and directory names and are never parsed as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "text") el.textContent = String(value);
    else if (key === "on") for (const [type, fn] of Object.entries(value)) el.addEventListener(type, fn);
    else if (key === "style") for (const [name, v] of Object.entries(value)) el.style.setProperty(name, String(v));
    else if (key === "dataset") for (const [name, v] of Object.entries(value)) el.dataset[name] = String(v);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
}

/** An HTML element: h("div", {class: "x", text: name}, child, ...). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  apply(el, props);
  append(el, children);
  return el;
}

/** An SVG element, same calling convention as h(). */
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, props);
  append(el, children);
  return el;
}

/** Remove every child of `el`. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Replace the children of `el`. */
export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** A <select> whose options are [value, label] pairs (labels as text). */
export function select(options, value, onChange, props = {}) {
  const el = h("select", props);
  setOptions(el, options, value);
  el.addEventListener("change", () => onChange(el.value));
  return el;
}

export function setOptions(el, options, value) {
  const key = JSON.stringify(options);
  if (el._optionsKey !== key) {
    clear(el);
    for (const [v, label] of options) el.appendChild(new Option(label, v));
    el._optionsKey = key;
  }
  if (value !== undefined && value !== null) el.value = value;
}

/** Trigger a download of `text` as a file (a Blob URL; no server round trip). */
export function downloadText(text, filename, type = "text/csv;charset=utf-8") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: filename, style: { display: "none" } });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** A floating tooltip made of text rows (label, value) — no markup from data. */
export class Tooltip {
  constructor(parent = document.body) {
    this.el = h("div", { class: "lg-tooltip", role: "tooltip", hidden: true });
    parent.appendChild(this.el);
  }

  show(x, y, title, rows = [], note = "") {
    const body = [h("div", { class: "lg-tooltip-title", text: title })];
    if (rows.length) {
      const table = h("table");
      for (const [label, value, cls] of rows) {
        table.appendChild(h("tr", { class: cls || null }, h("th", { text: label }), h("td", { text: value })));
      }
      body.push(table);
    }
    if (note) body.push(h("div", { class: "lg-tooltip-note", text: note }));
    replace(this.el, body);
    this.el.hidden = false;
    const pad = 14;
    const { innerWidth: W, innerHeight: H } = window;
    const r = this.el.getBoundingClientRect();
    let left = x + pad;
    let top = y + pad;
    if (left + r.width > W - 4) left = Math.max(4, x - pad - r.width);
    if (top + r.height > H - 4) top = Math.max(4, y - pad - r.height);
    this.el.style.left = `${left + window.scrollX}px`;
    this.el.style.top = `${top + window.scrollY}px`;
  }

  hide() {
    this.el.hidden = true;
  }
}
