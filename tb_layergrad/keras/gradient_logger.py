"""`GradientLogger`: gradients of the loss w.r.t. layer outputs, from the real fit() step."""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from tb_layergrad import distribute
from tb_layergrad.capturing.layer_capture import Capture
from tb_layergrad.capturing.rnn_probe import TimestepProbe
from tb_layergrad.capturing.targets import check_target_shape, validate_targets
from tb_layergrad.keras import fit_step as _fit_step
from tb_layergrad.keras import model_facts, nonfinite_check, replica_payload, train_functions

_Base = tf.keras.callbacks.Callback  # tf_keras' under TF_USE_LEGACY_KERAS=1, Keras 3's otherwise
_MISSING = object()


class GradientLogger(_Base):
    """Log the gradients Keras computes inside `model.fit()`, per layer output, to TensorBoard.

    For every chosen layer, the callback records d(loss)/d(layer output) (and,
    optionally, d(loss)/d(weight)) *of the actual training step*: the batch
    fit() trains on, the weights before that batch's update, the loss exactly
    as the step computes it. Nothing is recomputed and nothing of Keras is
    copied: the model's own `train_step` runs unmodified (Keras' own, or the
    model's override that uses a `tf.GradientTape`), and the callback only
    observes it: the layer outputs are watched on the tape the step opens, and
    the step's one `tape.gradient(loss, weights)` call is answered by ONE call
    for the weights and the outputs together, whose weight part goes back to
    the step as it is. Training is therefore bit for bit unchanged in eager and
    graph mode (under XLA, see README: the same math, bitwise on some CPUs). Gradients
    are reduced to a histogram and statistics (`tb_layergrad.summary` format,
    plugin "layergrad") and written by the step itself (`jit_compile=False`)
    or right after it (XLA, eager), at step `s = optimizer.iterations` after
    this batch's update (the s-th update; the step Keras' `TensorBoard`
    callback uses for batch metrics), when `s % every_n_steps == 0`.

    Every step is checked for a NaN/Inf (the loss, the output gradients and,
    with `activations=True`, the layer outputs; one pass over them, in the
    fused write op where it is built): the first step at which one appears is
    written in full whether or not it is a logged step, and where it was born
    (forward pass, loss, backward pass: `tb_layergrad.nonfinite_origin`) is
    in `self.nonfinite`, in the tab and in `tb-layergrad report`.
    `on_nonfinite` says what happens then. So the observing step runs at every
    step; with `check_every_step=False`, the steps that log nothing run
    Keras' own train function, untouched, and cost nothing (a NaN is then
    seen at the next logged step only). The observing step is compiled at the
    first batch and kept for a later fit() with the same callback. When
    training ends, or fails, the model is restored (`train_step`,
    `train_function`).

    A model that overrides `train_step` is observed the same way: the first
    `tf.GradientTape` its step enters is the one watched, and the first
    `gradient()` call on it is the one logged (target "loss"). A step that
    enters no tape raises a clear error at the first batch.

    Evaluation (`validation_data`, `evaluate()`) is untouched and logs nothing.
    Records go to `log_dir/train` (the run Keras' `TensorBoard(log_dir)`
    callback writes its training scalars to), so both show up side by side.

    Example:

    ```python
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(
        x, y, epochs=3, validation_data=(x_val, y_val),
        callbacks=[
            keras.callbacks.TensorBoard("logs/run1"),
            tb_layergrad.GradientLogger(
                "logs/run1", every_n_steps=10, weights=True,
                targets={"class_3": lambda y_pred: y_pred[:, 3]},
            ),
        ],
    )
    # tensorboard --logdir logs  -> "layergrad" tab
    ```

    Stop at the first NaN, and say where it was born:

    ```python
    logger = tb_layergrad.GradientLogger("logs/run2", activations=True, on_nonfinite="stop")
    model.fit(x, y, callbacks=[logger])
    # GradientLogger: first non-finite value at step 23: forward pass, output of model/log_features; ...
    logger.nonfinite.pass_, logger.nonfinite.origin  # ("forward", "model/log_features")
    ```

    Args:
        log_dir: directory of the TensorBoard logs; records go to
            `log_dir/<run_name>`.
        layers: `None` for every layer that can be captured, or layer names,
            full paths (`"model/block/dense"`), glob patterns or `Layer`
            objects. An unknown name raises before training starts.
        every_n_steps: log when `optimizer.iterations % every_n_steps == 0`
            (checked after the step's update). Must be >= 1.
        histogram_every_n_steps: of the logged steps, write the histograms at
            those where `optimizer.iterations % histogram_every_n_steps == 0`
            (the statistics at every logged step): 1 (default), every logged
            step; in format version 2 a histogram is 60 of about 160 bytes per
            layer and step. A step with a NaN/Inf is always written in full.
        weights: also log d(target)/d(weight) of the chosen layers' weights.
        timesteps: per-timestep gradients of RNN layers: `True` for every RNN
            layer, or names/patterns/layers. Logs, per step, the L2 norm of
            the TOTAL dL/dh_t (through the output at t AND the recurrence) for
            every timestep t, as a float64 [T] record (kind "timesteps"); for
            an LSTM, h_t is the output state (not the cell state c). With
            `max_elements > 0`, also example 0's [T, units] gradient (layer
            path + "[h_t]", kind "tensor"). See `tb_layergrad.rnn_probe`.
        targets: extra scalars to differentiate, `{name: fn(y_pred)}`; `fn`
            returns one value per example ([batch] or [batch, 1]) and the SUM
            over the batch is differentiated. Each target is its own series
            (its name in the "target" field) and costs one more backward pass
            on logged steps only.
        buckets: histogram buckets per record.
        max_elements: when > 0, also log the raw gradient, bounded to this
            many elements (docs/FORMAT.md, kind `tensor`).
        run_name: subdirectory of `log_dir` to write to ("train", like Keras).
        activations: also log the layer outputs themselves (forward values:
            histogram and statistics, source "activation"), from the same
            forward pass as the gradients of that step (the global batch's under
            several replicas, merged as the output gradients are).
        on_nonfinite: at the first step with a NaN/Inf: "log" (write it and go
            on), "stop" (write it, print one line saying where it was born,
            end fit() after that step) or "raise" (write it, raise
            `tb_layergrad.NonFiniteError`, a FloatingPointError, with that line).
        check_every_step: check every step for a NaN/Inf (see above), not only
            the logged ones.
        per_example: also log, at the logged steps, the distribution over the
            batch of each example's own gradient norm of the loss, per layer
            output and (with `weights=True`) per weight (kind `examples`:
            min, median, max, the largest example's share, the five largest
            and their batch positions; docs/PER_EXAMPLE.md), and with
            `weights=True` the gradient noise scale as TensorBoard scalars
            `layergrad/gradient_noise_scale[/trace|/signal|/coverage]`
            (docs/FORMAT.md). The loss must be the batch mean (Keras' default
            reduction). Several replicas: every replica's
            examples, in global batch order.

    Mixed precision: with a loss-scaling optimizer, the recorded gradients are
    divided by the loss scale read before the step's update (float32). A step
    whose scaled gradients overflow still writes its records: the non-finite
    elements are counted in the stats (`nan`, `pos_inf`, `neg_inf`) and never
    put in histogram buckets. Such a step makes no update; under Keras 3 it
    does not advance `optimizer.iterations`, so the next step writes at the
    same step number (tf_keras counts it).

    Several replicas (Keras 3): the records are those of the global batch,
    written once by the chief (docs/DISTRIBUTED.md). Not supported: several
    replicas under tf_keras, non-TensorFlow Keras backends. With `steps_per_execution=k > 1` under XLA, eagerly or
    with several replicas, Keras returns only the last step of each
    execution: use an `every_n_steps` multiple of k (with `jit_compile=False`
    the step writes every logged step itself).
    """

    def __init__(
        self,
        log_dir: Any,
        layers: Any = None,
        every_n_steps: int = 1,
        weights: bool = False,
        timesteps: Any = False,
        targets: Optional[Mapping[str, Callable]] = None,
        buckets: int = 30,
        max_elements: int = 0,
        run_name: str = "train",
        activations: bool = False,
        on_nonfinite: str = "log",
        check_every_step: bool = True,
        histogram_every_n_steps: int = 1,
        per_example: bool = False,
    ):
        super().__init__()
        self.on_nonfinite = nonfinite_check.check_mode(on_nonfinite)
        for name, value in (("every_n_steps", every_n_steps), ("histogram_every_n_steps", histogram_every_n_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
            raise ValueError(f"buckets must be an integer >= 1, got {buckets!r}")
        if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 0:
            raise ValueError(f"max_elements must be an integer >= 0, got {max_elements!r}")
        if not isinstance(run_name, str) or not run_name:
            raise ValueError(f"run_name must be a non-empty string, got {run_name!r}")
        try:
            self.log_dir = os.fspath(log_dir)
        except TypeError:
            raise TypeError(f"log_dir must be a path, got {type(log_dir).__name__}") from None
        if not self.log_dir:
            raise ValueError("log_dir must be a non-empty path")
        if timesteps is None:
            timesteps = False
        self.per_example = bool(per_example)
        self.layers = layers
        self.every_n_steps = every_n_steps
        self.histogram_every_n_steps = histogram_every_n_steps
        self.weights = bool(weights)
        self.timesteps = timesteps
        self.targets = validate_targets(targets)
        self.buckets = buckets
        self.max_elements = max_elements
        self.run_name = run_name
        self.activations = bool(activations)
        self.check_every_step = bool(check_every_step)
        self._nonfinite = None  # see the `nonfinite` property
        self._writer = None
        self._chief = True
        self._record_writer: Optional[Callable] = None  # compiled for self._writer, made at the first write
        self._fit_step: Optional[_fit_step.FitStep] = None
        self._saved: Optional[Dict[str, Any]] = None
        self._armed = False
        self._steps_per_execution = 1
        self._counting = False  # may optimizer.iterations be counted in Python (see _iterations_before_call)?
        self._iterations: Optional[int] = None  # optimizer.iterations now, when counted; None: read it
        self._built: Optional[train_functions.BuiltStep] = None  # the compiled capturing step, reused by the next fit()

    # tf_keras' CallbackList asks these of every callback (Keras 3's does not).
    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    @property
    def nonfinite(self) -> Any:
        """Where the first NaN/Inf of this callback's training was born (`nonfinite_origin.Origin`), or None.

        Read from the step's own record of it when the step writes itself (it
        keeps the first non-finite step and its flags in variables: nothing is
        handed out of a step for this with `on_nonfinite="log"`).
        """
        if self._nonfinite is None and self._fit_step is not None:
            kept = self._fit_step.first_nonfinite.read()
            if kept is not None and len(kept[1]) == len(self._fit_step.checked):
                self._nonfinite = nonfinite_check.origin(self._fit_step.checked, kept[1], kept[0])
        return self._nonfinite

    @property
    def run_dir(self) -> str:
        return os.path.join(self.log_dir, self.run_name)

    # -- checks before training --------------------------------------------------
    def _check_model(self, model: Any) -> str:
        kind = model_facts.check_supported(model)
        if getattr(model, "optimizer", None) is None:
            raise ValueError("GradientLogger needs a compiled model with an optimizer")
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None and strategy.num_replicas_in_sync > 1 and kind != "keras":
            raise ValueError(
                f"GradientLogger supports {strategy.num_replicas_in_sync} replicas ({type(strategy).__name__}) "
                "with Keras 3 only, not tf_keras; capture in a custom loop (tb_layergrad.distribute) instead"
            )
        Capture(model, layers=self.layers, weights=self.weights)  # unknown layers raise here
        if self.timesteps is not False:
            TimestepProbe(model, None if self.timesteps is True else self.timesteps)
        self._check_targets_statically(model)
        spe = train_functions.steps_per_execution(model)
        if spe > 1 and self.every_n_steps % spe and not train_functions.step_writes_itself(model):
            warnings.warn(
                f"steps_per_execution={spe}: Keras returns only the last step of each execution, so a step logged "
                f"by every_n_steps={self.every_n_steps} that is not the last of its execution is lost; use a "
                f"multiple of {spe} (or jit_compile=False: then the step writes every logged step itself)",
                RuntimeWarning,
                stacklevel=3,
            )
        return kind

    def _check_targets_statically(self, model: Any) -> None:
        """Try each target on a zero y_pred when the output shape is known (Functional/Sequential)."""
        if not self.targets:
            return
        try:
            outputs = model.outputs
        except (AttributeError, ValueError):
            return
        if not outputs or len(outputs) != 1:
            return
        shape = list(outputs[0].shape)
        if any(d is None for d in shape[1:]):
            return
        dtype = getattr(outputs[0], "dtype", "float32")
        dtype = getattr(dtype, "name", dtype)
        y_pred = tf.zeros([2] + shape[1:], dtype=dtype)
        for name, fn in self.targets.items():
            try:
                value = tf.convert_to_tensor(fn(y_pred))
            except Exception as e:  # noqa: BLE001 - re-raised with context
                raise ValueError(f"target {name!r} failed on a y_pred of shape {[None] + shape[1:]}: {e}") from e
            check_target_shape(name, value, 2)

    def _open_writer(self) -> Any:
        try:
            tf.io.gfile.makedirs(self.run_dir)
            return tf.summary.create_file_writer(self.run_dir)
        except (tf.errors.OpError, OSError) as e:
            raise OSError(f"GradientLogger cannot write to log_dir {self.run_dir!r}: {e}") from e

    # -- install / restore -------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        if self._saved is not None:  # a previous fit() was left abnormally
            self._restore()
        kind = self._check_model(model)
        self._steps_per_execution = train_functions.steps_per_execution(model)
        self._counting = train_functions.iterations_countable(model, kind, self._steps_per_execution)
        self._iterations = None
        strategy = getattr(model, "distribute_strategy", None)
        self._chief = distribute.is_chief(strategy)
        if self._chief:
            writer = self._writer if self._writer is not None else self._open_writer()  # one event file per callback
        else:
            writer = None  # other workers leave no file behind
        xla = bool(getattr(model, "jit_compile", False)) and not bool(getattr(model, "run_eagerly", False))
        config = _fit_step.StepConfig(
            layers=self.layers,
            weights=self.weights,
            timesteps=self.timesteps,
            targets=dict(self.targets),
            buckets=self.buckets,
            max_elements=self.max_elements,
            every_n_steps=self.every_n_steps,
            xla=xla,
            activations=self.activations,
            on_nonfinite=self.on_nonfinite,
            histogram_every_n_steps=self.histogram_every_n_steps,
            per_example=self.per_example,
        )
        if model.train_function is None:  # fit() builds it before on_train_begin; a caller outside fit() may not
            model.make_train_function()
        saved = {
            "train_function": model.train_function,
            "train_tf_function": getattr(model, "train_tf_function", _MISSING),
            "train_step": model.__dict__.get("train_step", _MISSING),
        }
        reuse = (
            self._built
            if self._built is not None and self._built.fits(model, saved["train_function"], config, writer)
            else None
        )
        fit_step = reuse.fit_step if reuse is not None else _fit_step.FitStep(model, kind, config, writer=writer)
        step_fn = fit_step.train_step
        self._writer, self._fit_step, self._saved = writer, fit_step, saved
        try:
            object.__setattr__(model, "train_step", step_fn)
            if reuse is None:
                self._record_writer = None  # it knows the series of the previous step
                built = model.make_train_function(force=True)
                logging_fn = model.train_function if built is None else built
                reuse = train_functions.BuiltStep(model, saved["train_function"], config, fit_step, logging_fn)
            self._built = reuse
            model.train_function = self._wrap(reuse)
        except BaseException:
            self._restore()
            raise

    def _iterations_before_call(self) -> int:
        """`optimizer.iterations` now: counted in Python where that is exact, read otherwise.

        Why count: reading the variable costs an op and a device-to-host copy per
        batch, a visible share of a small model's step. Counted only with
        one step per execution and an optimizer that advances at every step
        (not Keras 3's loss scaling, which skips overflowing steps); read again at
        the start of each fit() and after a call that raised.
        """
        if self._iterations is None:
            self._iterations = int(tf.convert_to_tensor(model_facts.update_count(self.model.optimizer)).numpy())
        return self._iterations

    def _logs_next_execution(self, done: int) -> bool:
        """Does the next call of the train function run a step this callback logs?

        The steps of the next execution are done + 1 ... done + steps_per_execution.
        """
        n = self.every_n_steps
        return any((done + j) % n == 0 for j in range(1, self._steps_per_execution + 1))

    def _wrap(self, built: "train_functions.BuiltStep") -> Callable:
        """The train function fit() calls: ours on executions with a logged step, Keras' own otherwise.

        The first call after the capturing step was built runs it even when nothing is
        logged (its records are then not written): it is traced, and a target that does
        not fit the model's output fails, before any other update.
        """

        def train_function(*args: Any, **kwargs: Any) -> Any:
            if not self._armed:
                # Called outside a fit() this callback watches (e.g. left behind by an interrupted fit):
                # put Keras' own function back and run that.
                self._restore()
                return self.model.train_function(*args, **kwargs)
            self._armed = False
            # Checking every step runs the observing step at every call: no count is needed to choose.
            done = None if self.check_every_step else self._iterations_before_call()
            capturing = done is None or not built.traced or self._logs_next_execution(done)
            inner = built.logging_fn if capturing else built.keras_fn
            self._iterations = None  # unknown until the call returns (it may stop the epoch)
            try:
                out = inner(*args, **kwargs)
                built.traced = built.traced or capturing
                if self._counting and done is not None:
                    self._iterations = done + 1
            except (StopIteration, tf.errors.OutOfRangeError):
                raise
            except BaseException:
                self._restore()
                raise
            if isinstance(out, dict) and _fit_step.PAYLOAD_KEY in out:
                out = dict(out)
                payload = out.pop(_fit_step.PAYLOAD_KEY)
                try:
                    self._write(payload)
                except BaseException:
                    self._restore()
                    raise
            return out

        train_function._tb_layergrad_wrapper = True
        return train_function

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._armed = self._saved is not None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._writer is not None:
            self._writer.flush()

    def on_train_end(self, logs: Any = None) -> None:
        self._restore()

    def restore(self) -> None:
        """Put the model back as it was before fit() (done automatically when training ends or fails)."""
        self._restore()

    def close(self) -> None:
        """Close the event file now (also done when the callback is garbage-collected); a later fit() opens a new one."""
        self._restore()
        if self._writer is not None:
            self._writer.close()
        self._writer, self._record_writer = None, None

    def _restore(self) -> None:
        saved, self._saved = self._saved, None
        self._armed = False
        if saved is not None:
            model = self.model
            if saved["train_step"] is _MISSING:
                model.__dict__.pop("train_step", None)
            else:
                object.__setattr__(model, "train_step", saved["train_step"])
            model.train_function = saved["train_function"]
            if saved["train_tf_function"] is not _MISSING:
                model.train_tf_function = saved["train_tf_function"]
        if self._writer is not None:
            # Flushed, not closed: a later fit() with this callback goes on writing to the
            # same event file, with its compiled record writer (closed with the callback).
            self._writer.flush()

    # -- writing -----------------------------------------------------------------
    def _write(self, payload: Dict[str, Any]) -> None:
        """Write what a step handed out (XLA, eager, several replicas) and act on its finiteness flags."""
        if "encoded" in payload:  # several replicas: see replica_payload
            payload = replica_payload.decode(payload, self._fit_step.layout)
        flags = np.asarray(payload["flags"], dtype=bool).reshape(-1)
        first = bool(flags.any()) and self._nonfinite is None
        if self._writer is not None and "tensors" in payload and (bool(payload["log"]) or first):
            if self._record_writer is None:
                self._record_writer = train_functions.record_writer(self._writer, self._fit_step.plan)
            step = tf.cast(payload["step"], tf.int64)
            histograms = tf.equal(tf.math.floormod(step, self.histogram_every_n_steps), 0)
            self._record_writer(step, payload["tensors"], tf.reshape(histograms, []))
        if first:
            self._found_nonfinite(int(np.asarray(payload["step"]).reshape(-1)[0]), flags)

    def _found_nonfinite(self, step: int, flags: np.ndarray) -> None:
        """The first step with a NaN/Inf: say where it was born; stop or raise if asked (that step is written)."""
        self._nonfinite = nonfinite_check.origin(self._fit_step.checked, flags, step)
        if self._writer is not None:
            self._writer.flush()
        if self.on_nonfinite == "log" or self._nonfinite is None:
            return
        if self.on_nonfinite == "raise":
            raise nonfinite_check.NonFiniteError(self.nonfinite)
        print(f"GradientLogger: {self.nonfinite.line}; stopping training (on_nonfinite='stop')", flush=True)
        self.model.stop_training = True
