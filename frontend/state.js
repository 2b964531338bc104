// The tab's state in a URL, so that a copied link reopens the same view.
//
// Where: the PARENT page's hash (TensorBoard's own URL) when the iframe may touch
// it (same origin, which is how TensorBoard embeds plugins). TensorBoard keeps
// dashboard state in its hash as "#<plugin>&key=value&..." (its tf_storage format)
// and keeps keys it does not know when it switches tabs or reloads, so
// "#layergrad&lg_run=train&lg_layer=model%2Fdense&lg_step=5&lg_view=layer"
// survives TensorBoard's router and can be shared. When the parent cannot be
// reached (another origin, the page opened alone) the iframe's own hash is used.
// Writes use history.replaceState: no history entry per slider move, and no
// hashchange event that TensorBoard would have to handle.

const PREFIX = "lg_";

export const DEFAULTS = Object.freeze({
  view: null, // runs | overview | layer | compare; null: the Runs view for a logdir of several runs (no run named), else the overview
  run: null,
  layer: null,
  step: null, // null: the latest step
  stat: "norm",
  target: null, // null: the run's own (model.js defaultTarget: "loss", else the run's first target)
  source: "output",
  runs: [], // compare: the chosen runs
  color: null, // compare: the hyperparameter the runs are coloured by; null: a colour per run
  log: true, // log scale of the line charts
  hist: "offset", // offset | overlay
  hx: null, // layer view's offset histograms: "shared" x axis or one "step" range per ridge; null: per step when the ridges' ranges differ over 100-fold
  series: null, // layer view: "target|source|layer" of the histogram/tensor series
  of: "gradient", // overview and compare: the values shown, "gradient" or "activation" (the forward values)
  zoom: null, // [first, last] step shown by the overview and the layer view's charts; null: the whole run
  sort: null, // runs view: the column sorted by ("-" first: descending); null: the most severe runs first
  filter: "", // runs view: a regular expression on run names
  hpf: null, // runs view: {hyperparameter: the JSON of the value kept} as JSON
  sx: null, // scatter: the hyperparameter on x (null: the first one)
  sy: null, // scatter: the health measure on y (null: the first one)
  sc: null, // scatter: the hyperparameter colouring the points (null: another one than x, if any)
  xlog: null, // scatter: log x axis (null: log for positive values over two decades or more)
  refresh: null, // seconds between the tab's refreshes while it is shown (null: 12 with runs, 4 while waiting for one)
});

const TYPES = {
  view: "str", run: "str", layer: "str", step: "int", stat: "str", target: "str",
  source: "str", runs: "list", color: "str", log: "bool", hist: "str", hx: "str", series: "str", of: "str", zoom: "range",
  sort: "str", filter: "str", hpf: "str", sx: "str", sy: "str", sc: "str", xlog: "bool", refresh: "int",
};

const VIEWS = ["runs", "overview", "layer", "compare"];

function decode(key, raw) {
  switch (TYPES[key]) {
    case "int":
      return /^[0-9]{1,18}$/.test(raw) ? Number(raw) : undefined;
    case "bool":
      return raw === "1" ? true : raw === "0" ? false : undefined;
    case "range": {
      const m = /^([0-9]{1,15})-([0-9]{1,15})$/.exec(raw);
      return m && Number(m[1]) <= Number(m[2]) ? [Number(m[1]), Number(m[2])] : undefined;
    }
    case "list":
      try {
        const v = JSON.parse(raw);
        return Array.isArray(v) ? v.filter((x) => typeof x === "string" && x) : undefined;
      } catch {
        return undefined;
      }
    default:
      return raw;
  }
}

function encode(key, value) {
  switch (TYPES[key]) {
    case "bool":
      return value ? "1" : "0";
    case "range":
      return `${value[0]}-${value[1]}`;
    case "list":
      return JSON.stringify(value);
    default:
      return String(value);
  }
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** "#tab&k=v" -> {head: ["tab"], pairs: [[k, v], ...]} (keys and values decoded). */
export function parseHash(hash) {
  const text = hash.startsWith("#") ? hash.slice(1) : hash;
  const head = [];
  const pairs = [];
  for (const part of text.split("&")) {
    if (!part) continue;
    const eq = part.indexOf("=");
    if (eq < 0) head.push(part);
    else {
      try {
        pairs.push([decodeURIComponent(part.slice(0, eq)), decodeURIComponent(part.slice(eq + 1))]);
      } catch {
        // a malformed escape: leave that pair out
      }
    }
  }
  return { head, pairs };
}

export function formatHash({ head, pairs }) {
  const parts = [...head, ...pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)];
  return parts.join("&");
}

/** The tab's state from a hash (unknown or malformed values fall back to defaults). */
export function stateFromHash(hash) {
  const state = { ...DEFAULTS, runs: [] };
  for (const [k, raw] of parseHash(hash).pairs) {
    if (!k.startsWith(PREFIX)) continue;
    const key = k.slice(PREFIX.length);
    if (!(key in TYPES)) continue;
    const v = decode(key, raw);
    if (v !== undefined) state[key] = v;
  }
  if (!VIEWS.includes(state.view)) state.view = DEFAULTS.view;
  if (!["offset", "overlay"].includes(state.hist)) state.hist = DEFAULTS.hist;
  if (!["shared", "step"].includes(state.hx)) state.hx = DEFAULTS.hx;
  if (!["gradient", "activation"].includes(state.of)) state.of = DEFAULTS.of;
  return state;
}

/** `hash` with the tab's keys replaced by `state` (other keys and their order kept). */
export function hashWithState(hash, state) {
  const { head, pairs } = parseHash(hash);
  const kept = pairs.filter(([k]) => !k.startsWith(PREFIX));
  const mine = [];
  for (const key of Object.keys(TYPES)) {
    const v = state[key];
    if (v === null || v === undefined || same(v, DEFAULTS[key])) continue;
    mine.push([PREFIX + key, encode(key, v)]);
  }
  return formatHash({ head, pairs: [...kept, ...mine] });
}

/** The window whose URL holds the state: TensorBoard's page if reachable, else ours. */
function hostWindow() {
  try {
    const parent = window.parent;
    if (parent && parent !== window) {
      void parent.location.href; // throws across origins
      void parent.history.state;
      return { win: parent, where: "parent" };
    }
  } catch {
    // another origin: fall through
  }
  return { win: window, where: "frame" };
}

export class UrlState {
  constructor() {
    const { win, where } = hostWindow();
    this.win = win;
    this.where = where; // "parent" | "frame"
    this.listeners = [];
    this._onHashChange = () => {
      const next = this.read();
      if (!same(next, this._last)) {
        this._last = next;
        for (const fn of this.listeners) fn(next);
      }
    };
    this._last = this.read();
    win.addEventListener("hashchange", this._onHashChange);
    // The listener lives on TensorBoard's window: remove it when this frame goes away.
    window.addEventListener("pagehide", () => this.dispose(), { once: true });
  }

  read() {
    return stateFromHash(this.win.location.hash);
  }

  /** Store `state` in the URL (no history entry). */
  write(state) {
    this._last = { ...state };
    let loc;
    try {
      loc = this.win.location;
      const { head } = parseHash(loc.hash);
      // Only while TensorBoard shows this tab (named in its hash, or the default tab: no name).
      if (this.where === "parent" && head.length && head[0] !== "layergrad") return;
      const base = this.where === "parent" && !head.length ? `#layergrad${loc.hash.replace(/^#/, "&")}` : loc.hash;
      const hash = hashWithState(base, state);
      if (`#${hash}` === loc.hash || (hash === "" && loc.hash === "")) return;
      this.win.history.replaceState(this.win.history.state, "", `${loc.pathname}${loc.search}#${hash}`);
    } catch {
      // A URL we cannot write is not worth breaking the tab for.
    }
  }

  /** Call `fn(state)` when the user edits the URL's hash (or goes back/forward). */
  onChange(fn) {
    this.listeners.push(fn);
  }

  dispose() {
    try {
      this.win.removeEventListener("hashchange", this._onHashChange);
    } catch {
      // the parent is gone already
    }
  }
}
