// Questions about the `runs` answer (docs/HTTP_API.md): which layers, which series,
// which weights belong to which layer. Pure functions, no fetching, no DOM.

export function findRun(runsBody, name) {
  return (runsBody && runsBody.runs.find((r) => r.run === name)) || null;
}

/**
 * The statistics a stats record stores, in record order (`stored_stats` of the `runs` answer, the
 * backend's `metadata.STAT_FIELDS`): the columns of a CSV of stored values.
 */
export function storedStats(runsBody) {
  return runsBody.stored_stats;
}

/** The differentiated scalar every other target is named beside. */
export const DEFAULT_TARGET = "loss";

/**
 * The target a view opens `run` on: "loss" when the run has it, else its first target in the `runs`
 * answer's order (a custom train_step names its targets after what each tape trains, e.g. a GAN's
 * "discriminator" and "generator"). "loss" for an unknown run: what the routes default to.
 */
export function defaultTarget(run) {
  if (!run || !run.targets.length || run.targets.includes(DEFAULT_TARGET)) return DEFAULT_TARGET;
  return run.targets[0];
}

export function findLayer(run, path) {
  return (run && run.layers.find((l) => l.layer === path)) || null;
}

/** Layers of `run` that have a stats series for (target, source), in model order. */
export function layersWith(run, target, source) {
  if (!run) return [];
  return run.layers.filter((l) => l.series.some((x) => x.target === target && x.source === source && x.kinds.includes("stats")));
}

/** Whether the run holds `kind` records (e.g. "histogram") of `layer` for (target, source). */
export function hasKind(run, layer, target, source, kind) {
  const l = run ? run.layers.find((x) => x.layer === layer) : null;
  return Boolean(l && l.series.some((x) => x.target === target && x.source === source && x.kinds.includes(kind)));
}

/**
 * The output layer a weight variable belongs to: the longest output-layer path that is a
 * path prefix of the variable's (its index may differ: an LSTM's weights carry its cell's).
 */
export function ownerOf(run, variable) {
  let best = null;
  for (const l of run.layers) {
    if (l === variable || !l.sources.includes("output")) continue;
    if (!variable.layer.startsWith(`${l.layer}/`)) continue;
    if (!best || l.layer.length > best.layer.length) best = l;
  }
  return best;
}

/**
 * The layer a record-only entry belongs to, e.g. "model/lstm[h_t]" (raw per-timestep
 * gradients, no statistics) belongs to "model/lstm"; null for an ordinary layer.
 */
export function attachedTo(run, l) {
  if (l.stats) return null;
  const k = l.layer.lastIndexOf("[");
  if (k <= 0 || !l.layer.endsWith("]")) return null;
  return findLayer(run, l.layer.slice(0, k));
}

// Forward values (docs/FORMAT.md): source "activation", stored under the target "forward" whatever the
// differentiated target; the routes take `source=activation` and ignore `target` for them.
export const ACTIVATION = "activation";
export const ACTIVATION_TARGET = "forward";

/** {target, source} of the values a view shows: the gradients of the state, or the activations (`of`). */
export function valuesOf(state) {
  return state.of === ACTIVATION ? { target: ACTIVATION_TARGET, source: ACTIVATION } : { target: state.target, source: state.source };
}

/** Whether `run` has forward values recorded (the `runs` answer's `activations`). */
export function hasActivations(run) {
  return Boolean(run && (run.activations || run.sources.includes(ACTIVATION)));
}

export function seriesKey(x) {
  return `${x.target}|${x.source}|${x.layer}`;
}

/**
 * Every series the layer view shows for `path`: the layer's own (one per target and
 * source) and, for an output layer, the weight variables it owns.
 * Each: {key, layer, target, source, kinds, label, weight: bool}.
 */
export function layerSeries(run, path) {
  const entry = findLayer(run, path);
  if (!entry) return [];
  const out = [];
  const multiTarget = new Set(run.layers.flatMap((l) => l.targets)).size > 1;
  for (const x of entry.series) {
    const activation = x.source === ACTIVATION;
    const label = activation ? "activation (forward value)" : x.source === "weight" ? `${x.target} · ${lastSegment(path)} (weight)` : `${x.target} · output`;
    out.push({ key: seriesKey({ ...x, layer: path }), layer: path, target: x.target, source: x.source, kinds: x.kinds, label, weight: x.source === "weight", activation });
  }
  if (entry.sources.includes("output")) {
    for (const v of run.layers) {
      if (v === entry || !v.sources.includes("weight") || v.sources.includes("output")) continue;
      if (ownerOf(run, v) !== entry) continue;
      const name = v.layer.slice(path.length + 1);
      for (const x of v.series) {
        if (x.source !== "weight") continue;
        out.push({ key: seriesKey({ ...x, layer: v.layer }), layer: v.layer, target: x.target, source: "weight", kinds: x.kinds, label: `${x.target} · ${name} (weight)`, weight: true });
      }
    }
  }
  for (const v of run.layers) {
    if (attachedTo(run, v) !== entry) continue;
    for (const x of v.series) {
      out.push({ key: seriesKey({ ...x, layer: v.layer }), layer: v.layer, target: x.target, source: x.source, kinds: x.kinds, label: `${x.target} · ${v.layer.slice(path.length)}`, weight: false });
    }
  }
  // Order: outputs before weights, the default target "loss" first, the layer's activation right after it.
  const rank = (x) => [Number(x.weight), x.activation ? 1 : x.target === DEFAULT_TARGET ? 0 : 2, x.target];
  out.sort((a, b) => {
    const [p, q] = [rank(a), rank(b)];
    return p[0] - q[0] || p[1] - q[1] || (p[2] < q[2] ? -1 : p[2] > q[2] ? 1 : 0);
  });
  if (!multiTarget) for (const x of out) x.label = x.label.replace(/^[^·]+· /, "");
  return out;
}

function lastSegment(path) {
  const k = path.lastIndexOf("/");
  return k >= 0 ? path.slice(k + 1) : path;
}

/** Layer paths a person picks from: output layers first (model order), then variables. */
export function pickableLayers(run) {
  if (!run) return [];
  const outputs = run.layers.filter((l) => l.sources.includes("output") && !attachedTo(run, l));
  const weightsOnly = run.layers.filter((l) => !l.sources.includes("output") && !ownerOf(run, l));
  return [...outputs, ...weightsOnly];
}

/** The path without its first segment (the model's name): matches layers across runs of renamed models. */
export function layerKey(path) {
  const k = path.indexOf("/");
  return k >= 0 ? path.slice(k + 1) : path;
}

/** Sorted union of numbers. */
export function union(lists) {
  return [...new Set(lists.flat())].sort((a, b) => a - b);
}

/** A short signature of the runs answer: changes when a run, layer or step appears. */
export function signature(runsBody, run) {
  if (!runsBody) return "";
  const pick = run ? runsBody.runs.filter((r) => r.run === run) : runsBody.runs;
  return JSON.stringify(pick.map((r) => [r.run, r.max_step, r.layers.length, r.layers.map((l) => l.series.map((x) => x.max_step))]));
}

/** Whether `run` has per-example records (kind `examples`) for (target, source). */
export function hasExamples(run, target, source) {
  return Boolean(run && run.layers.some((l) => l.series.some((x) => x.target === target && x.source === source && x.kinds.includes("examples"))));
}

/**
 * The series of the layer view (`layerSeries`) that have per-example records, in the order that view lists
 * them (the layer's outputs, then the weights it owns), the one of `target` and `source` first.
 */
export function examplesChoices(series, target, source = "output") {
  const withExamples = series.filter((x) => x.kinds.includes("examples"));
  const first = withExamples.find((x) => x.target === target && x.source === source) || withExamples.find((x) => x.source === source) || null;
  return first ? [first, ...withExamples.filter((x) => x !== first)] : withExamples;
}

/** Whether `run` recorded per-example records at all: only such runs have the gradient noise scale scalars. */
export function anyExamples(run) {
  return Boolean(run && run.layers.some((l) => l.series.some((x) => x.kinds.includes("examples"))));
}
