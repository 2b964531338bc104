"""Keras: `GradientLogger`, the callback that logs the gradients of the real `model.fit()` step.

Modules:
  gradient_logger   -- the callback (installs the observing step, writes what leaves it)
  logger_options    -- its arguments and the checks before training; warnings for options without effect
  batch_count       -- the step written at: the count of batches trained, kept by the logger
  run_files         -- the run it writes to (its event file) and the warning for two trainings in one run
  train_functions   -- the observing step compiled once and kept; the compiled record writer
  fit_step          -- the observing train step and the plan of what it logs
  step_observation  -- what one run of the model's own step shows (its tapes, losses, gradient calls: targets)
  step_messages     -- what the logger says about a custom step, in terms true inside fit()
  tape_observer     -- watching `tf.GradientTape`s while a step traces, on its thread only
  model_facts       -- what is read off the model and its optimizer (flavor, update count, loss scale)
  replica_payload   -- records carried bit for bit through Keras' cross-replica mean
"""
