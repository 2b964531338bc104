// The tab's controller: state (in the URL), the `runs` answer, the three views,
// polling. Views own their DOM and their fetches; the app tells them what to show.

import { api, isAbort } from "./api.js";
import { tooltip } from "./charts/tooltip.js";
import { h, replace, select, setOptions } from "./dom.js";
import { DEFAULT_TARGET, defaultTarget, findRun, layerKey, layersWith, pickableLayers, signature } from "./model.js";
import { Poller } from "./poll.js";
import { UrlState } from "./state.js";
import { CompareView } from "./views/compare.js";
import { errorBox, field } from "./views/common.js";
import { emptyState } from "./views/empty.js";
import { LayerView } from "./views/layer.js";
import { OverviewView } from "./views/overview.js";
import { RunsView } from "./views/runs.js";

const POLL_MS = 12_000;
const EMPTY_POLL_MS = 4_000;

/** The time between refreshes: the URL's `lg_refresh` (seconds, at least 1) if set, else by whether runs exist. */
function pollMs(state, hasRuns) {
  if (state.refresh) return Math.max(1, state.refresh) * 1000;
  return hasRuns ? POLL_MS : EMPTY_POLL_MS;
}

const VIEWS = [
  ["runs", "Runs"],
  ["overview", "Overview"],
  ["layer", "Layer"],
  ["compare", "Compare runs"],
];

export class App {
  constructor(root) {
    this.root = root;
    this.url = new UrlState();
    this.state = this.url.read();
    this.runs = null;
    this.runsSig = "";
    this.earlySweep = null; // see start()
    this.ownTargets = new Map(); // "run|source" -> the target a run opens on when none is asked (`_ownTarget`)
    this.controls = [];
    this.views = {};
    this.current = null;
    this.retry = () => this.poll(true); // behind the "Retry now" of error messages
    this.tabButtons = VIEWS.map(([v, label]) =>
      h("button", { type: "button", role: "tab", class: "lg-tab", dataset: { view: v }, text: label, on: { click: () => this.setState({ view: v }) } }),
    );
    this.status = h("span", { class: "lg-status", "aria-live": "polite" });
    this.refreshBtn = h("button", { type: "button", class: "lg-icon-btn", title: "refresh now (the tab also refreshes by itself)", "aria-label": "refresh", text: "⟳", on: { click: () => this.poll(true) } });
    this.banner = h("div", { class: "lg-banner" });
    this.main = h("div", { class: "lg-main" });
    this.header = h(
      "header",
      { class: "lg-header" },
      h("nav", { class: "lg-tabs", role: "tablist", "aria-label": "views" }, this.tabButtons),
      h("span", { class: "lg-spacer" }),
      this.status,
      this.refreshBtn,
    );
    root.append(this.header, this.banner, this.main);
    document.addEventListener("keydown", (e) => {
      if (this.current && this.views[this.current] && this.views[this.current].onKey(e)) tooltip().hide();
    });
    this.url.onChange((s) => {
      this.state = s;
      this.show();
    });
    window.addEventListener("error", (e) => this.fail(e.error || e.message));
    window.addEventListener("unhandledrejection", (e) => {
      if (!isAbort(e.reason)) this.fail(e.reason);
    });
  }

  async start() {
    // Where the tab may land on the Runs view (a sweep's landing page), its rows are asked beside the list of
    // runs rather than after it: the two answers then arrive together.
    if ((!this.state.view || this.state.view === "runs") && (!this.state.source || this.state.source === "output")) {
      this.earlySweep = api.sweep({});
      this.earlySweep.catch(() => {}); // a failure is the Runs view's to show, if it is shown
    }
    await this.loadRuns();
    this.show();
    this.poller = new Poller(() => this.poll(false), pollMs(this.state, Boolean(this.runs && this.runs.runs.length)));
  }

  /** The rows asked at start (`start`) for the Runs view's default query, once; null after, or for another query. */
  takeEarlySweep(params) {
    const early = this.earlySweep;
    this.earlySweep = null;
    return early && !Object.keys(params).length ? early : null;
  }

  /** A visible message for an unexpected failure: never a blank tab. */
  fail(err) {
    replace(this.banner, errorBox(err instanceof Error ? err : new Error(String(err))));
  }

  busy(on) {
    this.root.classList.toggle("lg-loading", Boolean(on));
  }

  async loadRuns() {
    try {
      this.runs = await api.runs();
      this.runsSig = signature(this.runs);
      replace(this.banner, ...(this.runs.warnings || []).map((w) => h("div", { class: "lg-warning", text: w })));
      this._stamp();
      return true;
    } catch (e) {
      replace(this.banner, errorBox(e, "the list of runs", { retry: this.retry }));
      this.status.textContent = "";
      return false;
    }
  }

  _stamp() {
    const t = new Date();
    this.status.textContent = `updated ${t.toLocaleTimeString()} · auto-refresh`;
  }

  async poll(force) {
    const hadRuns = Boolean(this.runs && this.runs.runs.length);
    const before = this.runsSig;
    if (!(await this.loadRuns())) return;
    const hasRuns = this.runs.runs.length > 0;
    if (this.poller) this.poller.setInterval(pollMs(this.state, hasRuns));
    if (hasRuns !== hadRuns) {
      this.show();
      return;
    }
    if (!hasRuns) return;
    this.syncControls();
    // A view asks again when something changed, and after a failure that may have passed (retryOnPoll).
    const view = this.current && this.views[this.current];
    if (view && (force || this.runsSig !== before || view.retryOnPoll)) {
      try {
        await view.refresh();
      } catch (e) {
        if (!isAbort(e)) this.fail(e);
      }
    }
  }

  /** Run / target / source pickers; views place them in their toolbars, the app keeps them current. */
  runControls({ run = true, targetSource = true } = {}) {
    const c = {};
    const parts = [];
    if (run) {
      c.run = select([], null, (v) => this.setState({ run: v }), { "aria-label": "run", class: "lg-run-select" });
      parts.push(field("Run", c.run, "lg-field-wide"));
    }
    if (targetSource) {
      c.target = select([], null, (v) => this.setState({ target: v, step: null }), { "aria-label": "target" });
      c.source = select([], null, (v) => this.setState({ source: v, step: null }), { "aria-label": "source" });
      c.targetField = field("Target", c.target);
      c.sourceField = field("Gradient of", c.source);
      parts.push(c.targetField, c.sourceField);
    }
    this.controls.push(c);
    return h("span", { class: "lg-run-controls" }, parts);
  }

  syncControls() {
    const s = this.resolved();
    const runs = this.runs ? this.runs.runs : [];
    const run = findRun(this.runs, s.run);
    const runOptions = runs.map((r) => [r.run, r.run]);
    if (s.run && !run) runOptions.push([s.run, `${s.run} (not found)`]);
    const targets = run ? run.targets : [s.target];
    const targetOptions = targets.map((t) => [t, t]);
    if (!targets.includes(s.target)) targetOptions.push([s.target, `${s.target} (not in run)`]);
    const sources = run ? run.sources : [s.source];
    const sourceOptions = ["output", "weight"].filter((x) => sources.includes(x) || x === s.source).map((x) => [x, x === "output" ? "layer outputs" : "weights"]);
    for (const c of this.controls) {
      if (c.run) setOptions(c.run, runOptions, s.run);
      if (c.target) {
        setOptions(c.target, targetOptions, s.target);
        c.targetField.hidden = targetOptions.length < 2;
      }
      if (c.source) {
        setOptions(c.source, sourceOptions, s.source);
        c.sourceField.hidden = sourceOptions.length < 2;
      }
    }
  }

  /** The state with defaults filled in from the data (not written to the URL). */
  resolved() {
    const s = { ...this.state, runs: [...this.state.runs] };
    const runs = this.runs ? this.runs.runs : [];
    // No view named: a sweep opens on its runs; one run, or a link naming a run, on that run's overview.
    if (s.view === null) s.view = runs.length > 1 && !s.run ? "runs" : "overview";
    if (!s.run && runs.length) {
      const withStats = runs.find((r) => layersWith(r, s.target ?? defaultTarget(r), s.source).length);
      s.run = (withStats || runs[0]).run;
    }
    // A target the URL names is kept; else the run's own: `loss`, or the one of its targets in the worst state.
    if (s.target === null) s.target = this.ownTargets.get(`${s.run}|${s.source}`) ?? defaultTarget(findRun(this.runs, s.run));
    if (s.view === "layer" && !s.layer) {
      const run = findRun(this.runs, s.run);
      const layers = run ? layersWith(run, s.target, s.source) : [];
      const first = layers[0] || pickableLayers(run)[0];
      if (first) s.layer = first.layer;
    }
    return s;
  }

  /**
   * Whether the run shown needs its own target asked first: a run without `loss` and with several targets (a
   * GAN's `discriminator` and `generator`) opens on the one in the worst state, the `sweep` route's row for it
   * (the Runs view's choice, the report's worst), asked once per run and source; then `show` again.
   */
  _ownTarget() {
    const s = this.state;
    const run = findRun(this.runs, s.run ?? this.resolved().run);
    if (s.target !== null || !run || run.targets.includes(DEFAULT_TARGET) || run.targets.length < 2) return false;
    const key = `${run.run}|${s.source}`;
    if (this.ownTargets.has(key)) return false;
    this.ownTargets.set(key, defaultTarget(run)); // asked once; the first target until the answer says
    const source = s.source && s.source !== "output" ? { source: s.source } : {};
    api.sweep({ run: run.run, ...source })
      .then((b) => {
        const row = b.runs.find((r) => r.run === run.run);
        if (row && row.target && run.targets.includes(row.target)) this.ownTargets.set(key, row.target);
      })
      .catch(() => {})
      .finally(() => this.show());
    return true;
  }

  setState(patch) {
    const prev = this.state;
    const next = { ...prev, ...patch };
    if (patch.run !== undefined && patch.run !== prev.run) {
      // Another run: keep what still makes sense there.
      const run = findRun(this.runs, patch.run);
      if (run) {
        if (next.target !== null && !run.targets.includes(next.target)) next.target = null; // the run's own
        if (!run.sources.includes(next.source)) next.source = run.sources[0];
        if (next.layer && !run.layers.some((l) => l.layer === next.layer)) {
          const same = run.layers.find((l) => layerKey(l.layer) === layerKey(next.layer));
          next.layer = same ? same.layer : null;
        }
      }
      next.step = null;
      next.series = null;
      next.zoom = null;
    }
    this.state = next;
    this.url.write(next);
    this.show();
  }

  show() {
    tooltip().hide();
    const hasRuns = Boolean(this.runs && this.runs.runs.length);
    const name = this.resolved().view;
    for (const b of this.tabButtons) {
      const on = b.dataset.view === name;
      b.classList.toggle("lg-on", on);
      b.setAttribute("aria-selected", on ? "true" : "false");
      b.disabled = !hasRuns;
    }
    if (!this.runs) return; // the banner says why
    if (!hasRuns) {
      this.current = null;
      replace(this.main, emptyState());
      return;
    }
    if ((name === "overview" || name === "layer") && this._ownTarget()) return; // shown again once the run's own target is known
    if (!this.views[name]) this.views[name] = new { runs: RunsView, overview: OverviewView, layer: LayerView, compare: CompareView }[name](this);
    const view = this.views[name];
    if (this.current !== name || view.el.parentNode !== this.main) replace(this.main, view.el);
    this.current = name;
    this.syncControls();
    view.show(this.resolved()).catch((e) => {
      if (!isAbort(e)) this.fail(e);
    });
  }
}
