// The overview's summary above the heatmap: the run and its size, one line per finding of the `anomalies`
// route (tb_layergrad/reader/anomalies.py: the same lines as `tb-layergrad report`; a click opens the layer and
// step it names), and how many layers are flagged at the latest step.

import { dominatedRule, findingsOf } from "../anomalies.js";
import { h, replace } from "../dom.js";
import { capitalize } from "../format.js";

/**
 * @param {HTMLElement} el the summary's box
 * @param {{d: object, an: object, state: object, prefix: string, activation: boolean,
 *   openStep: (layer: string, step: number) => void}} o the overview's data, the anomalies on its grid, the
 *   state, the layers' common prefix (the model's name), whether the cells are activations
 */
export function drawSummary(el, { d, an, state, prefix, activation, openStep }) {
  const cols = d.steps.length;
  const parts = [];
  // The rows are weights (a layer's kernel and bias are two) when the gradients are the weights'.
  const rows = `${d.layers.length} ${state.source === "weight" ? (d.layers.length === 1 ? "weight" : "weights") : d.layers.length === 1 ? "layer" : "layers"}`;
  const head = h(
    "div",
    { class: "lg-summary-head" },
    h("span", { class: "lg-run-name", text: state.run }),
    h("span", { class: "lg-muted", text: ` · ${rows} × ${d.bins ? `${d.bins.counts.reduce((a, b) => a + b, 0)} steps in ${cols} bins` : `${cols} steps`}` + (cols ? ` (${d.steps[0]}–${(d.bins ? d.bins.last_steps : d.steps)[cols - 1]})` : "") + (prefix ? ` · model ${prefix.slice(0, -1)}` : "") }),
  );
  parts.push(head);
  // The route's findings (tb_layergrad/reader/anomalies.py): one line each however many layers it spans, the
  // same lines as `tb-layergrad report`; inserted as text (names come from user code). A click opens the
  // layer and step it names.
  const origin = d.an && d.an.summary ? d.an.summary.origin : null;
  for (const f of findingsOf(d.an)) {
    const cls = f.kind === "dominated" ? "lg-alert-dominated" : f.kind === "nonfinite" ? `lg-alert-nonfinite${origin && origin.pass ? " lg-origin" : ""}` : `lg-alert-${f.kind}`;
    const dataset = { kind: f.kind, layer: f.layer ?? "", step: f.step ?? "", layers: String(f.layers.length) };
    if (f.kind === "nonfinite" && origin && origin.pass) Object.assign(dataset, { pass: origin.pass, origin: origin.origin ?? "" });
    const open = f.layer && d.layers.includes(f.layer);
    const link = h("button", {
      type: "button",
      class: `lg-alert ${cls}`,
      title: f.kind === "dominated" ? `${dominatedRule(d.an)}\nopen ${f.layer} at step ${f.step}` : open ? `open ${f.layer} at step ${f.step}` : "",
      dataset,
      on: { click: () => (open ? openStep(f.layer, f.step) : null) },
    });
    link.textContent = `${capitalize(f.line)}${open ? " →" : ""}`;
    parts.push(link);
  }
  const last = cols - 1;
  const lastStep = d.an && d.an.summary && d.an.summary.last_step !== null ? d.an.summary.last_step : (d.bins ? d.bins.last_steps : d.steps)[last];
  // How many layers are flagged at the run's latest step: the route's `summary.latest`, as the report says it.
  const latest = (d.an && d.an.summary && d.an.summary.latest) || {};
  const counts = { "non-finite": latest.nonfinite || 0, vanishing: latest.vanishing || 0, exploding: latest.exploding || 0, dead: latest.dead || 0, "vanishing over steps": latest.vanishing_over_steps || 0, "vanishing through time": latest.vanishing_through_time || 0 };
  const bits = Object.entries(counts).filter(([, c]) => c).map(([k, c]) => `${c} ${k}`);
  const health = h("span", { class: bits.length ? "lg-health lg-health-bad" : "lg-health lg-health-ok" });
  health.textContent = cols
    ? bits.length
      ? `At the latest step (${lastStep}): ${bits.join(", ")} of ${rows}.`
      : `At the latest step (${lastStep}): no non-finite, vanishing, exploding or dead layer.`
    : "No steps logged yet.";
  health.title = an.info.map((x) => `${x.label}: ${x.rule}`).join("\n");
  if (activation) {
    health.className = "lg-health";
    health.textContent = "Coloured by the layers' outputs (activations); the anomaly flags are the gradients': pick Values: gradients.";
  }
  parts.push(health);
  replace(el, parts);
}
