// The overview's data: matrix answers (docs/HTTP_API.md `matrix`) merged into one grid of layers x steps as a
// run grows, and the `anomalies` answer placed on a binned grid. Pure functions, no fetching, no DOM.

import { flagOf } from "../anomalies.js";
import { indexAtOrBefore } from "../charts/scale.js";

/**
 * Put matrix answers (for `stats`, fetched from step `start` on) into `data`.
 * False when they do not line up with what `data` holds (then reload everything).
 */
export function merge(data, stats, bodies, start) {
  const steps = [...new Set(bodies.flatMap((b) => b.steps))].sort((a, b) => a - b);
  // Columns kept from before: those before `start`.
  let keep = data.steps.length;
  if (start !== undefined) {
    keep = data.steps.findIndex((x) => x >= start);
    if (keep < 0) keep = data.steps.length;
  }
  const oldSteps = data.steps.slice(0, keep);
  const rowsN = data.layers.length;
  // Stats held from before and not fetched now must have exactly these steps.
  const others = Object.keys(data.m).filter((name) => !stats.includes(name));
  if (others.length && (start !== undefined || JSON.stringify(data.steps) !== JSON.stringify(steps))) return false;
  stats.forEach((stat, k) => {
    const b = bodies[k];
    const pos = new Map(b.steps.map((x, n) => [x, n]));
    const old = data.m[stat] && start !== undefined ? data.m[stat] : null;
    const rows = new Array(rowsN);
    for (let i = 0; i < rowsN; i++) {
      const src = b.values[i] || [];
      const row = old ? old[i].slice(0, keep) : [];
      for (const x of steps) {
        const n = pos.get(x);
        row.push(n === undefined ? null : src[n]);
      }
      rows[i] = row;
    }
    data.m[stat] = rows;
  });
  data.steps = start !== undefined ? oldSteps.concat(steps) : steps;
  return true;
}

/** A matrix answer with its rows in the order of `layers` (empty for a layer it lacks): a per-example
 * answer lists the layers with such records, which a statistics answer's rows need not all be. */
export function onLayers(body, layers) {
  if (JSON.stringify(body.layers) === JSON.stringify(layers)) return body;
  const at = new Map(body.layers.map((l, i) => [l, i]));
  const rows = (values) => layers.map((l) => (at.has(l) && values ? values[at.get(l)] : []));
  return { ...body, layers, values: rows(body.values), ...(body.binned ? { max: rows(body.max), min: rows(body.min) } : {}) };
}

/** A binned matrix answer in the shape `merge` takes: a column per bin, its largest value. */
export function asColumns(body) {
  return body.binned ? { ...body, values: body.max } : body;
}

/**
 * Put the flags of a binned matrix (each bin's flags ORed, computed by the route on the whole run) on the
 * grid, and find each layer's first non-finite and latest columns among the bins.
 */
export function onBins(an, d, route) {
  const b = d.bins;
  const cols = b.steps.length;
  if (!route) return;
  b.flags.forEach((text, i) => {
    for (let j = 0; j < cols; j++) an.flags[i * cols + j] = flagOf(text[j]);
  });
  const rowOf = new Map(d.layers.map((l, i) => [l, i]));
  for (const entry of route.layers) {
    const i = rowOf.get(entry.layer);
    if (i === undefined) continue;
    const l = an.layers[i];
    if (l.firstNonfiniteStep !== null) {
      const j = indexAtOrBefore(b.steps, l.firstNonfiniteStep);
      l.firstNonfinite = j >= 0 && b.last_steps[j] >= l.firstNonfiniteStep ? j : null;
    }
    if (entry.last_step !== null && entry.last_step !== undefined) {
      const j = indexAtOrBefore(b.steps, entry.last_step);
      l.latestStep = j === cols - 1 && b.last_steps[j] >= entry.last_step ? j : null;
    }
  }
}

/** The grid column holding `step` (its bin when binned; else the first logged step at or after it), or null. */
export function columnOf(d, step) {
  if (step === null || step === undefined) return null;
  if (d.bins) {
    const j = indexAtOrBefore(d.bins.steps, step);
    return j >= 0 && d.bins.last_steps[j] >= step ? j : null;
  }
  const j = d.steps.findIndex((x) => x >= step);
  return j >= 0 ? j : null;
}
