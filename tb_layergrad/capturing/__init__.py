"""Capturing: d(target)/d(layer output), layer outputs and weight gradients from one backward pass.

Hooks on each chosen layer's `call` record its outputs while the model runs; the gradients come from
the one `tape.gradient` call the user (or Keras' own train step) makes anyway, so nothing the model
computes changes. This `__init__` imports nothing: TensorFlow loads only when capturing is used.

Modules, one job each:
  layer_tree       -- which layers a model has, by path (`outer/inner/dense`), and the user's selection
  layer_hooks      -- the `call` wrapper installed on a layer instance, and its removal
  layer_capture    -- `capture(model, ...)`: the context manager and `Capture.gradients()`
  gradient_map     -- `GradientMap`, what `Capture.gradients()` returns (per-layer entries)
  records          -- one recorded layer output (its key, sub-outputs, element count) and the weight entries
  targets          -- extra scalar targets (`{name: fn(y_pred)}`), validated once
  rnn_probe        -- per-timestep dL/dh_t of recurrent layers (an additive probe on the cell)
  preactivation    -- a layer's pre-activation, seen in the forward pass that runs anyway (per-example norms)
  per_example      -- each example's own gradient norm, per supported layer kind
  per_example_pass -- what one forward pass keeps for per-example norms, turned into their map
  per_example_map  -- path -> per-example norms (built only where written), and why a path has none
  ghost_norm       -- per-example norms of outer-product weight gradients without forming each example's
"""
