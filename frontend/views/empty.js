// What the tab shows when there is nothing to show yet: how to log gradients.

import { h } from "../dom.js";

export const FIT_SNIPPET = 'model.fit(x, y, callbacks=[tb_layergrad.GradientLogger("logs/run1")])';

export const LOOP_SNIPPET = [
  "with tf.GradientTape() as tape, tb_layergrad.capture(model, tape=tape) as cap:",
  "    loss = loss_fn(y, model(x))",
  "with writer.as_default(step=step): tb_layergrad.summary.gradients(cap.gradients(tape, loss))",
].join("\n");

export function emptyState() {
  return h(
    "section",
    { class: "lg-view lg-empty", dataset: { view: "empty" } },
    h("h2", { text: "No layer gradients in this logdir yet" }),
    h("p", { text: "This tab shows the gradient of your loss with respect to each layer's output, written by tb_layergrad. With Keras' fit():" }),
    h("pre", { class: "lg-snippet" }, h("code", { text: FIT_SNIPPET })),
    h("p", { text: "In a custom training loop:" }),
    h("pre", { class: "lg-snippet" }, h("code", { text: LOOP_SNIPPET })),
    h("p", null, "with ", h("code", { text: "writer = tf.summary.create_file_writer(\"logs/run1\")" }), ", then ", h("code", { text: "tensorboard --logdir logs" }), ". Try ", h("code", { text: "tb-layergrad demo" }), " for example runs."),
    h("p", { class: "lg-muted", text: "This page checks for new data every few seconds: it fills in by itself once gradients are written (TensorBoard may also still be loading the logdir)." }),
  );
}
