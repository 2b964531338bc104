"""Keras: `GradientLogger`, the callback that logs the gradients of the real `model.fit()` step.

Modules:
  gradient_logger   -- the callback (installs the observing step, writes what leaves it)
  train_functions   -- the observing step compiled once and kept; the compiled record writer
  fit_step          -- the observing train step and the plan of what it logs
  step_observation  -- what one run of the model's own step shows (tape, loss, gradient call)
  tape_observer     -- watching `tf.GradientTape` while a step traces, on its thread only
  model_facts       -- what is read off the model and its optimizer (flavor, update count, loss scale)
  replica_payload   -- records carried bit for bit through Keras' cross-replica mean
"""
