"""`GradientLogger`: gradients of the loss w.r.t. layer outputs, from the real fit() step."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional, Union

import numpy as np
import tensorflow as tf

from tb_layergrad import distribute, logger_arguments, nonfinite_origin
from tb_layergrad.keras import (
    batch_count,
    logger_options,
    nonfinite_check,
    replica_payload,
    run_files,
    train_functions,
)
from tb_layergrad.keras import fit_step as _fit_step

_Base = tf.keras.callbacks.Callback  # tf_keras' under TF_USE_LEGACY_KERAS=1, Keras 3's otherwise
_MISSING = object()


class GradientLogger(_Base):
    """Log the gradients Keras computes inside `model.fit()`, per layer output, to TensorBoard.

    At each logged batch the callback records d(loss)/d(layer output) (and,
    with `weights=True`, d(loss)/d(weight)) of the training step itself: the
    batch fit() trains on, the weights before that batch's update, the loss
    exactly as the step computes it. The model's own `train_step` runs
    unmodified (Keras' own, or an override) and is only observed: every
    `gradient()` call it makes on a `tf.GradientTape` that differentiates
    trainable weights is one target of that step, answered by ONE backward
    pass for the weights and the layer outputs together, whose weight part goes
    back to the step as it is. Training is bit for bit unchanged in eager and
    graph mode (under XLA the same math: docs/FIT.md). Records go to
    `log_dir/train`, the run Keras' `TensorBoard(log_dir)` callback writes its
    training scalars to, in the `tb_layergrad.summary` format (the "layergrad"
    tab, `tb-layergrad report`, `tb_layergrad.load`).

    The step of a record is the count of batches trained, from 1, continuing
    across fit() calls: where Keras' `TensorBoard(update_freq=1)` writes that
    batch's `batch_*` scalars in one fit() of a new model, whatever optimizers
    the step applies (docs/FIT.md, "The step").

    Targets: a standard step differentiates one loss w.r.t. all trainable
    weights: target "loss". A custom step writes one target per such call
    (a GAN's discriminator, then generator tape; a CycleGAN's persistent tape
    asked for four losses), named after the sub-model or group whose weights
    it asks for ("discriminator", "generator_G", "encoder+projection_head");
    a name taken again in the same step (a WGAN critic's n updates) is
    written each time, the k-th as "name#k". A call w.r.t. inputs only (a
    gradient penalty's) is logged when asked for: `targets={"gp": "inputs"}`
    (docs/FIT.md, "Custom `train_step`").

    Every step is checked for a NaN/Inf (the loss, the output gradients and,
    with `activations=True`, the layer outputs): the first step with one is
    written in full, logged or not; where it was born is `self.nonfinite`.
    When training ends, or fails, the model is restored (`train_step`,
    `train_function`). Evaluation is untouched.

    Example:

    ```python
    import numpy as np
    import keras
    import tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(64, 4), np.random.rand(64, 1)
    model.fit(
        x, y, batch_size=16, epochs=2,
        callbacks=[
            keras.callbacks.TensorBoard("/tmp/logs/run1", update_freq=1),
            tb_layergrad.GradientLogger("/tmp/logs/run1", update_freq=2, weights=True),
        ],
    )
    # tensorboard --logdir /tmp/logs  -> "layergrad" tab; steps 2, 4, 6, 8
    ```

    Args:
        log_dir: the directory of the TensorBoard logs (records go to
            `log_dir/train`), or a `keras.callbacks.TensorBoard` callback
            whose `log_dir` to follow, read at each fit(): in a KerasTuner
            search, each trial then writes to its own run, beside its
            hyperparameters (docs/FIT.md, "With KerasTuner"). A fit() that
            would write steps its run already holds (two models, one
            log_dir) is warned about.
        layers: `None` for every layer that can be captured, or layer names,
            full paths (`"model/block/dense"`), glob patterns or `Layer`
            objects. An unknown name raises before training starts.
        update_freq: `"batch"` or an integer N: log every N-th batch trained
            (step % N == 0; "batch" is 1); `"epoch"`: the last batch of each
            epoch (needs a known number of steps per epoch). Histograms and
            statistics are written at every logged step.
        weights: also log d(target)/d(weight) for the weights the step
            differentiates (of the chosen layers); a weight the step does not
            ask a gradient for is absent.
        activations: also log the layer outputs themselves (forward values,
            source "activation"), from the same forward pass.
        timesteps: per-timestep gradients of RNN layers: `True` for every RNN
            layer, or names/patterns/layers: per step the L2 norm of the total
            dL/dh_t for every timestep t (kind "timesteps"; docs/FORMAT.md).
        targets: extra targets, `{name: fn(y_pred)}`: `fn` returns one value
            per example ([batch] or [batch, 1]) whose SUM over the batch is
            differentiated (one more backward pass at logged steps only; a
            custom step: on every tape that calls the model itself, the k-th
            as `name#k`). `{name: "inputs"}` (one name): each tape of a custom
            step w.r.t. inputs only (a WGAN-GP's gradient penalty) as target
            `name` (`name#k`), from its own gradient call (docs/FIT.md).
        per_example: also log the distribution over the batch of each
            example's own gradient norm of the loss (kind `examples`) and, with
            `weights=True`, the gradient noise scale (docs/PER_EXAMPLE.md). The
            loss must be the batch mean (Keras' default reduction). A custom
            step: for every tape that trains weights (not those w.r.t. inputs).
        max_elements: when > 0, also log the raw gradients, bounded to this
            many elements each.
        on_nonfinite: at the first step with a NaN/Inf: "log" (write it, go
            on), "stop" (write it, print where it was born, end fit() after
            that step), "raise" (write it, raise `tb_layergrad.NonFiniteError`),
            or "ignore": no check at every step (off-schedule batches run
            Keras' own train function untouched; a NaN is seen at a logged
            step only).

    Raises:
        TypeError: a `log_dir` that is neither a path nor such a callback.
        ValueError: an argument out of its range (a `targets=` value that is
            neither a function nor "inputs"; before training), or an
            unknown layer, a model without a compiled optimizer, a target that
            does not fit the model's output (at `on_train_begin`).
        RuntimeError: a train step that enters no `tf.GradientTape`; a batch
            count that cannot be known (docs/FIT.md, "The step"); training
            under a non-TensorFlow Keras backend.
        tb_layergrad.NonFiniteError: with `on_nonfinite="raise"`.
    """

    def __init__(
        self,
        log_dir: Any,
        layers: Any = None,
        update_freq: Union[int, str] = 1,
        weights: bool = False,
        activations: bool = False,
        timesteps: Any = False,
        targets: Optional[Mapping[str, Union[Callable, str]]] = None,
        per_example: bool = False,
        max_elements: int = 0,
        on_nonfinite: str = "log",
    ):
        super().__init__()
        self._log_dir = logger_arguments.log_dir(log_dir)
        self.layers = layers
        self.update_freq = logger_arguments.update_freq(update_freq)
        self.weights = bool(weights)
        self.activations = bool(activations)
        self.timesteps = False if timesteps is None else timesteps
        self.targets, self.input_target = logger_options.targets(targets)
        self.per_example = bool(per_example)
        self.max_elements = logger_arguments.max_elements(max_elements)
        self.on_nonfinite = logger_arguments.on_nonfinite(on_nonfinite)
        logger_options.warn_without_effect(self.weights, self.per_example, self.input_target)
        self._nonfinite = None  # see the `nonfinite` property
        self._file = run_files.RunFile()
        self._chief = True
        self._record_writer: Optional[Callable] = None  # compiled for self._file.writer, made at the first write
        self._writer_keys: frozenset = frozenset()  # the tensors of the plan it writes
        self._fit_step: Optional[_fit_step.FitStep] = None
        self._saved: Optional[Dict[str, Any]] = None
        self._armed = False
        self._observed = False  # did the last call of the train function run the observing step?
        self._steps_per_execution = 1
        self._count = batch_count.BatchCount()  # the step: batches trained (see batch_count)
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
                self._nonfinite = nonfinite_check.origin(
                    self._fit_step.checked, kept[1], kept[0], self._fit_step.main_target
                )
        return self._nonfinite

    @property
    def log_dir(self) -> str:
        """The folder of the logs: the path given, or the followed callback's `log_dir` as it is now."""
        return logger_arguments.resolve_log_dir(self._log_dir)

    @log_dir.setter
    def log_dir(self, value: Any) -> None:
        self._log_dir = logger_arguments.log_dir(value)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.log_dir, "train")

    # -- install / restore -------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        if self._saved is not None:  # a previous fit() was left abnormally
            self._restore()
        kind = logger_options.check_model(
            model, self.layers, self.weights, self.timesteps, self.targets, self.update_freq
        )
        self._steps_per_execution = train_functions.steps_per_execution(model)
        self._count.begin(model)
        if self.update_freq == "epoch" and not (self.params or {}).get("steps"):
            raise ValueError(
                'GradientLogger(update_freq="epoch") logs the last batch of each epoch, and this fit() does not '
                "know how many batches an epoch has: pass steps_per_epoch to fit(), or use update_freq=N"
            )
        strategy = getattr(model, "distribute_strategy", None)
        self._chief = distribute.is_chief(strategy)
        # Other workers leave no file behind. Does this fit() write steps its run already holds (run_files)?
        writer = self._file.open(self.run_dir) if self._chief else None
        self._file.check(self._count)
        xla = bool(getattr(model, "jit_compile", False)) and not bool(getattr(model, "run_eagerly", False))
        config = _fit_step.StepConfig(
            layers=self.layers,
            weights=self.weights,
            timesteps=self.timesteps,
            targets=dict(self.targets),
            input_target=self.input_target,
            max_elements=self.max_elements,
            update_freq=self.update_freq,
            xla=xla,
            activations=self.activations,
            on_nonfinite="log" if self.on_nonfinite == "ignore" else self.on_nonfinite,
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
        fit_step = (
            reuse.fit_step if reuse is not None else _fit_step.FitStep(model, kind, config, self._count, writer=writer)
        )
        step_fn = fit_step.train_step
        self._fit_step, self._saved = fit_step, saved
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

    def _logs_next_execution(self, done: int) -> bool:
        """Does the next call of the train function run a step this callback logs?

        The steps of the next execution are done + 1 ... done + steps_per_execution.
        """
        steps = range(done + 1, done + self._steps_per_execution + 1)
        if self.update_freq == "epoch":
            return int(self._count.epoch_last.numpy()) in steps
        return any(s % self.update_freq == 0 for s in steps)

    def _wrap(self, built: "train_functions.BuiltStep") -> Callable:
        """The train function fit() calls: ours on executions with a logged step, Keras' own otherwise.

        Ours runs at every execution unless `on_nonfinite="ignore"` (the check needs
        every step). The first call after the capturing step was built runs it even
        when nothing is logged (its records are then not written): it is traced, and
        a target that does not fit the model's output fails, before any other update.
        The first call of a fit() whose batch count is not known yet runs Keras' own
        function (`batch_count`, rule 4).
        """

        def train_function(*args: Any, **kwargs: Any) -> Any:
            if not self._armed:
                # Called outside a fit() this callback watches (e.g. left behind by an interrupted fit):
                # put Keras' own function back and run that.
                self._restore()
                return self.model.train_function(*args, **kwargs)
            self._armed = False
            count = self._count
            if not count.known:
                observe = False
            else:
                observe = self.on_nonfinite != "ignore" or not built.traced or self._logs_next_execution(count.count)
            if observe:
                count.sync()
            self._observed = observe
            inner = built.logging_fn if observe else built.keras_fn
            try:
                out = inner(*args, **kwargs)
                built.traced = built.traced or observe
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

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self._saved is None:
            return
        self._count.epoch_begin(epoch, (self.params or {}).get("steps"))
        self._file.check(self._count)
        if not self._count.known:
            self._count.warn_unlogged_first_batch()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._armed = self._saved is not None

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._saved is None:
            return
        try:
            self._count.batch_end(batch, self._observed)
        except BaseException:
            self._restore()
            raise
        self._file.check(self._count)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._file.flush()

    def on_train_end(self, logs: Any = None) -> None:
        self._restore()

    def restore(self) -> None:
        """Put the model back as it was before fit() (done automatically when training ends or fails)."""
        self._restore()

    def close(self) -> None:
        """Close the event file now (also done when the callback is garbage-collected); a later fit() opens a new one."""
        self._restore()
        self._file.close()
        self._record_writer = None

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
            self._file.end(self._count.count)
        # Flushed, not closed: a later fit() with this callback into the same run goes on
        # writing to the same event file, with its compiled record writer (closed with the callback).
        self._file.flush()

    # -- writing -----------------------------------------------------------------
    def _write(self, payload: Dict[str, Any]) -> None:
        """Write what a step handed out (XLA, eager, several replicas) and act on its finiteness flags."""
        if "encoded" in payload:  # several replicas: see replica_payload
            payload = replica_payload.decode(payload, self._fit_step.layout)
        flags = np.asarray(payload["flags"], dtype=bool).reshape(-1)
        first = bool(flags.any()) and self._nonfinite is None
        if self._file.writer is not None and "tensors" in payload and (bool(payload["log"]) or first):
            keys = frozenset(payload["tensors"])
            if self._record_writer is None or keys != self._writer_keys:  # a step whose series differ (eager)
                self._record_writer = train_functions.record_writer(self._file.writer, self._fit_step.plan)
                self._writer_keys = keys
            step = tf.cast(payload["step"], tf.int64)
            self._record_writer(step, payload["tensors"], tf.constant(True))
        if first:
            self._found_nonfinite(int(np.asarray(payload["step"]).reshape(-1)[0]), flags)

    def _found_nonfinite(self, step: int, flags: np.ndarray) -> None:
        """The first step with a NaN/Inf: say where it was born; stop or raise if asked (that step is written)."""
        self._nonfinite = nonfinite_check.origin(self._fit_step.checked, flags, step, self._fit_step.main_target)
        self._file.flush()
        if self.on_nonfinite == "log" or self._nonfinite is None:
            return
        if self.on_nonfinite == "raise":
            raise nonfinite_origin.NonFiniteError(self.nonfinite)
        print(f"GradientLogger: {self.nonfinite.line}; stopping training (on_nonfinite='stop')", flush=True)
        self.model.stop_training = True
