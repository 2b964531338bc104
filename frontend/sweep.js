// Questions about the `sweep` answer (docs/HTTP_API.md): the Runs view's columns, their values, order and
// filters, and the scatter's axes. Pure functions, no fetching, no DOM. Nothing about health is decided
// here: the route decides each run's severity, verdict and measures; this module only orders and filters.

/** The value of a dotted key of a run row ("latest.dead", "first_nonfinite.step"), undefined when absent. */
export function valueAt(row, key) {
  let v = row;
  for (const part of key.split(".")) {
    if (v === null || v === undefined || typeof v !== "object") return undefined;
    v = v[part];
  }
  return v;
}

/** A hyperparameter's value in a run: undefined when the run has none of that name. */
export function hparamOf(row, name) {
  const hp = row.hparams || {};
  return Object.prototype.hasOwnProperty.call(hp, name) ? hp[name] : undefined;
}

/** True for a cell with nothing to show (no value, or null: a NaN the route sent as null). */
export function isEmpty(v) {
  return v === undefined || v === null || (typeof v === "number" && !Number.isFinite(v));
}

// Mixed columns order numbers, then booleans, then strings.
const TYPE_RANK = { number: 0, boolean: 1, string: 2 };

/** Ascending order of two non-empty cell values of any type (a column may mix numbers and strings). */
export function compareValues(a, b) {
  const ta = TYPE_RANK[typeof a] ?? 3;
  const tb = TYPE_RANK[typeof b] ?? 3;
  if (ta !== tb) return ta - tb;
  if (typeof a === "number" || typeof a === "boolean") return Number(a) - Number(b);
  const x = String(a);
  const y = String(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

function byName(a, b) {
  return a.run < b.run ? -1 : a.run > b.run ? 1 : 0;
}

/**
 * The runs in the order of a column: `get(row)` gives the cell's value; `descending` reverses the values,
 * never the empty cells, which come last either way; ties by run name.
 */
export function sortRows(rows, get, descending = false) {
  const keyed = rows.map((row) => ({ row, v: get(row) }));
  keyed.sort((p, q) => {
    const ep = isEmpty(p.v);
    const eq = isEmpty(q.v);
    if (ep || eq) return ep === eq ? byName(p.row, q.row) : ep ? 1 : -1;
    const c = compareValues(p.v, q.v);
    return (descending ? -c : c) || byName(p.row, q.row);
  });
  return keyed.map((x) => x.row);
}

/**
 * The default order: the most severe findings first (the route's `severity`), then the earliest NaN/Inf,
 * then by name.
 */
export function severityOrder(rows) {
  const first = (r) => valueAt(r, "first_nonfinite.step");
  return [...rows].sort((a, b) => {
    const s = (b.severity ?? -1) - (a.severity ?? -1);
    if (s) return s;
    const fa = first(a);
    const fb = first(b);
    if (!isEmpty(fa) || !isEmpty(fb)) {
      if (isEmpty(fa)) return 1;
      if (isEmpty(fb)) return -1;
      if (fa !== fb) return fa - fb;
    }
    return byName(a, b);
  });
}

/**
 * A run-name filter as TensorBoard's run selector reads one: a regular expression, matched anywhere, case
 * sensitive. An invalid expression is not thrown: {test: null, error: the browser's message}.
 */
export function runFilter(text) {
  if (!text) return { test: () => true, error: null };
  try {
    const re = new RegExp(text);
    return { test: (name) => re.test(name), error: null };
  } catch (e) {
    return { test: null, error: e && e.message ? e.message : String(e) };
  }
}

/** A value as the key of a filter choice: JSON, so that 1 and "1" of a mixed column stay apart. */
export function valueKey(v) {
  return v === undefined ? "" : JSON.stringify(v);
}

/** The distinct values of hyperparameter `name` over `rows`, ordered as the column sorts them. */
export function distinctValues(rows, name) {
  const seen = new Map();
  for (const r of rows) {
    const v = hparamOf(r, name);
    if (v !== undefined) seen.set(valueKey(v), v);
  }
  return [...seen.values()].sort((a, b) => (isEmpty(a) ? 1 : isEmpty(b) ? -1 : compareValues(a, b)));
}

/** Whether `row` passes every hyperparameter filter ({name: valueKey}; "" for runs without that name). */
export function passesHparams(row, filters) {
  for (const [name, key] of Object.entries(filters || {})) {
    if (valueKey(hparamOf(row, name)) !== key) return false;
  }
  return true;
}

/**
 * How the scatter may place hyperparameter `name` on its x axis: numbers on a linear axis, and on a log axis
 * only when every value is a number > 0 (`logReason` says why not); anything else as categories.
 * @returns {{categorical: boolean, categories: Array, logReason: string|null}}
 */
export function xAxisOf(answer, name) {
  const values = distinctValues(answer.runs, name).filter((v) => !isEmpty(v));
  const numeric = values.length > 0 && values.every((v) => typeof v === "number");
  if (!numeric) {
    const why = values.length ? `'${name}' has values that are not numbers: shown as categories` : `no run has a value of '${name}'`;
    return { categorical: true, categories: values, logReason: why };
  }
  const low = values.find((v) => v <= 0);
  return { categorical: false, categories: [], logReason: low === undefined ? null : `a log scale needs values > 0: '${name}' has ${low}` };
}
