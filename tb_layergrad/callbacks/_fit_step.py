"""Internal: the train step `GradientLogger` runs inside `model.fit()`: the model's own, observed.

Why observed, not copied. The step fit() runs is the model's `train_step`,
unmodified: Keras' own (Keras 3 or tf_keras, whatever the version) or the
model's override. While it runs (traces, in graph mode and XLA), an
observation is active (`_tape_observer`): the layer hooks of `Capture` (and
`TimestepProbe`) are installed, the first `tf.GradientTape` the step enters is
the one the outputs are watched on, and the step's one `tape.gradient(loss,
weights)` call is answered by ONE call for (weights, layer outputs, probes)
whose weight part goes back to the step unchanged. Watch-style capture adds
no op to the forward pass, so training stays bitwise what it is without the
callback; identity-style capture (custom gradients) would not
(docs/FIT.md).

The callback runs this step only for executions that contain a logged step
(Keras' own train function otherwise); the step computes the logging flag
from `optimizer.iterations` (a tensor). In graph mode without XLA it reduces
and writes its records itself, behind that flag (`FitStep._writes_in_step`).
Otherwise it returns the step's logs plus one extra key (PAYLOAD_KEY) holding
the captured gradients (unscaled), the small records computed inside the step
(per-timestep norms, bounded tensors, "no gradient" records) and the flag; the
callback strips the key and reduces and writes outside the compiled function.
(Several replicas: the merged records are computed inside the step, see
`_with_replica_payload`.) See `FitStep._with_payload` and
`FitStep._shadow_weights` for what keeps training bitwise unchanged.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import tensorflow as tf

from tb_layergrad import distribute, fused_kernel, metadata, record_writes, reductions, replica_stats, summary_state
from tb_layergrad.callbacks import _replica_payload, _step_records, _tape_observer
from tb_layergrad.gradient_map import GradientMap
from tb_layergrad.graph_util import cond_out_of_line
from tb_layergrad.layer_capture import Capture
from tb_layergrad.rnn_probe import TapeWithExtraSources, TimestepProbe, timestep_norms
from tb_layergrad.targets import target_value

PAYLOAD_KEY = "__tb_layergrad__"

# Suffix of the layer path for the bounded [T, units] per-timestep tensor.
TIMESTEP_TENSOR_SUFFIX = "[h_t]"


def flavor(model: Any) -> str:
    """'keras' (Keras 3) or 'tf_keras' (Keras 2), from the model's class hierarchy."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root == "tf_keras":
            return "tf_keras"
        if root == "keras" and cls.__name__ in ("Model", "Trainer", "TensorFlowTrainer"):
            return "keras"
    raise TypeError(f"GradientLogger needs a Keras model (Keras 3 or tf_keras), got {type(model).__name__}")


def check_supported(model: Any) -> str:
    """Raise before training where the step cannot be observed. Returns the flavor.

    What is checked is behaviour, not a version: the model's Keras, and that it
    runs on TensorFlow (the observation watches `tf.GradientTape`).
    """
    kind = flavor(model)
    if kind == "keras":
        import keras

        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                f"GradientLogger observes TensorFlow's GradientTape; Keras runs on {keras.backend.backend()!r}. "
                "Set KERAS_BACKEND=tensorflow."
            )
    return kind


def model_train_step(model: Any) -> Callable:
    """The train step fit() would run without the callback: an instance attribute, else the class's."""
    own = model.__dict__.get("train_step")
    return own if own is not None else type(model).train_step.__get__(model, type(model))


# -- the optimizer: its update count and its loss scale ---------------------------
def update_count(optimizer: Any) -> Any:
    """The variable that counts the optimizer's applied updates (`optimizer.iterations`).

    A loss-scaling wrapper counts on its inner optimizer, the one that applies the
    updates: newer Keras forwards `iterations` to it, Keras 3.3 leaves the wrapper's
    own counter at 0, so the inner optimizer's is the one that counts everywhere.
    """
    inner = getattr(optimizer, "inner_optimizer", None)
    return (inner if inner is not None else optimizer).iterations


def loss_scale(kind: str, optimizer: Any) -> Optional[tf.Tensor]:
    """The factor the step multiplies its loss by before differentiating (None: 1), read now.

    Asked of the optimizer's own public scaling method with a loss of 1 (Keras 3:
    `scale_loss`, which its train step calls; tf_keras: `get_scaled_loss`), so the
    answer is whatever the optimizer applies at this point of the step: a dynamic
    scale, its initial value before the optimizer is built, a fixed factor, or none.
    """
    if optimizer is None:
        return None
    scale = getattr(optimizer, "scale_loss" if kind == "keras" else "get_scaled_loss", None)
    if scale is None:
        return None
    one = tf.constant(1.0, tf.float32)
    scaled = scale(one)
    if scaled is one:  # the optimizer does not scale
        return None
    return tf.cast(tf.convert_to_tensor(scaled), tf.float32)


_XLA_SAFE_ARG = "xla_safe" in inspect.signature(reductions.histogram_and_stats).parameters


_REDUCERS: Dict[Tuple[str, int, bool], Callable] = {}


def _reducer(dtype: tf.DType, buckets: int, xla: bool) -> Callable:
    """`reductions.histogram_and_stats` of a flat tensor, as ONE function call op.

    Inlined, the ~300 ops of each reduction made tracing and graph optimization of a
    MobileNet-sized step take minutes; a cached function is traced once per dtype
    and kept out of line (`_noinline`), so the step's graph holds one call per tensor.
    """
    key = (dtype.name, buckets, xla)
    fn = _REDUCERS.get(key)
    if fn is None:

        def reduce_flat(x: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
            if _XLA_SAFE_ARG:
                return reductions.histogram_and_stats(x, buckets, xla_safe=xla)
            return reductions.histogram_and_stats(x, buckets)

        fn = tf.function(
            reduce_flat,
            input_signature=[tf.TensorSpec([None], dtype)],
            autograph=False,
            experimental_attributes={"_noinline": True},
        )
        _REDUCERS[key] = fn
    return fn


def _histogram_and_stats(u: tf.Tensor, buckets: int, xla: bool) -> Tuple[tf.Tensor, tf.Tensor]:
    x = tf.reshape(tf.cast(u, reductions.compute_dtype(u.dtype)), [-1])
    hist, stats = _reducer(x.dtype, buckets, xla)(x)
    return tf.ensure_shape(hist, [buckets, 3]), tf.ensure_shape(stats, [reductions.NUM_STATS])


def _timestep_sumsq(g: tf.Tensor, time_axis: int = 1) -> tf.Tensor:
    """`rnn_probe.timestep_norms` before its square root: sums over replicas."""
    g = tf.cast(g, tf.float64)
    return tf.reduce_sum(tf.square(g), axis=[a for a in range(g.shape.rank) if a != time_axis])


def _unscale(g: tf.Tensor, scale: Optional[tf.Tensor]) -> tf.Tensor:
    if scale is None:
        return g
    dt = tf.float32 if g.dtype in (tf.float16, tf.bfloat16, tf.float32) else g.dtype
    return tf.cast(g, dt) / tf.cast(scale, dt)


# -- configuration ---------------------------------------------------------------
@dataclasses.dataclass
class StepConfig:
    layers: Any
    weights: bool
    timesteps: Any  # False, True, or a layer spec
    targets: Dict[str, Callable]
    buckets: int
    max_elements: int
    every_n_steps: int
    xla: bool
    replicas: str = "gather"  # how several replicas are merged: "gather" or "stats" (docs/DISTRIBUTED.md)


class FitStep:
    """Builds the observing train_step for one fit() call; remembers the series it writes."""

    def __init__(self, model: Any, kind: str, config: StepConfig, writer: Any = None):
        self.model = model
        self.kind = kind
        self.config = config
        #: the summary writer the step writes to itself (see `_writes_in_step`); None: hand records to Python.
        self.writer = writer
        #: the model's own train step, run unmodified inside the observation (read before the callback
        #: sets its own as the model's instance attribute).
        self.inner = model_train_step(model)
        #: tag -> SeriesInfo, filled while the step is traced (or run eagerly).
        self.series: Dict[str, metadata.SeriesInfo] = {}

    def _step_and_flag(self) -> Tuple[tf.Tensor, tf.Tensor]:
        iterations = tf.cast(tf.convert_to_tensor(update_count(self.model.optimizer)), tf.int64)
        step = iterations + 1  # the update this batch makes: Keras' TensorBoard batch step
        log = tf.equal(tf.math.floormod(step, self.config.every_n_steps), 0)
        return step, log

    # -- the observed step ------------------------------------------------------
    def train_step(self, data: Any) -> Any:
        """The model's own train step, observed (module docstring), then this step's records."""
        step, log = self._step_and_flag()
        cfg = self.config
        cap = Capture(self.model, layers=cfg.layers, weights=cfg.weights)
        probe = TimestepProbe(self.model, None if cfg.timesteps is True else cfg.timesteps) if cfg.timesteps is not False else None
        seen = _StepObservation(self, cap, probe)
        with contextlib.ExitStack() as scope:
            scope.callback(seen.stop_aux)  # also when the step raises
            scope.callback(seen.remove_hooks)
            scope.enter_context(_tape_observer.observing(seen))
            seen.install_hooks()
            logs = self.inner(data)
        if seen.tape is None:
            raise RuntimeError(
                f"{type(self.model).__name__}.train_step entered no tf.GradientTape: GradientLogger logs the gradients "
                "a train step computes with one. Capture inside your step with tb_layergrad.capture instead."
            )
        if not seen.answered:
            warnings.warn(
                "GradientLogger: the train step asked its GradientTape for no gradient (a model without trainable "
                "weights?); nothing is logged for this step",
                RuntimeWarning,
                stacklevel=2,
            )
            return logs
        return self._with_payload(logs, step, log, cap, probe, seen.gmap, seen.eps_grads, seen.scale, seen.aux, seen.values, seen.target)

    # -- auxiliary backward passes (logged steps only) --------------------------
    def _shadow_weights(self) -> bool:
        """Graph mode (no XLA): weight gradients for the records come from a second backward pass.

        Grappler's arithmetic optimizer folds the optimizer's learning-rate multiply into
        the last multiply of a weight gradient ONLY when nothing else reads that gradient
        (MinimizeBroadcasts). Reading the applied tensor would change which rewrite happens,
        and the update in the last bits. So in graph mode the weight records are computed
        from an identical, separate backward pass, on logged steps only.
        """
        return self.config.weights and not self.config.xla and not tf.executing_eagerly()

    def _aux_tape(self) -> Optional[Any]:
        n = len(self.config.targets) + (1 if self._shadow_weights() else 0)
        return tf.GradientTape(persistent=n > 1) if n else None

    # -- targets ---------------------------------------------------------------
    def _target_values(self, y_pred: Any, scale: Optional[tf.Tensor]) -> Dict[str, tf.Tensor]:
        out = {}
        for name, fn in self.config.targets.items():
            value = target_value(name, fn, y_pred)
            if scale is not None:  # same protection against float16 underflow as the loss
                value = value * tf.cast(scale, value.dtype)
            out[name] = value
        return out

    # -- payload ---------------------------------------------------------------
    def _register(self, info: metadata.SeriesInfo) -> str:
        self.series[info.tag] = info
        return info.tag

    def _reduce(self, target: str, cap: Capture, gmap: Any, eps_sources: Dict[str, Any], eps_grads: Dict[str, Any], probe: Optional[TimestepProbe], scale: Optional[tf.Tensor], precomputed: Optional[Dict[str, Any]] = None, norms_of: Optional[Dict[str, tf.Tensor]] = None, deferred: Optional[Dict[str, tf.Tensor]] = None) -> Dict[str, tf.Tensor]:
        """The records of one target: {tag: tensor}.

        With `deferred` (a dict), a present gradient's histogram and statistics are
        not computed here: the unscaled gradient goes to `deferred[stats tag]` and the
        writer reduces them all at once, outside this step (see `_with_payload`).
        """
        cfg = self.config
        precomputed = precomputed or {}
        norms_of = norms_of or {}
        out: Dict[str, tf.Tensor] = {}
        # With the fused kernel, all of this target's gradients are reduced by ONE op (below).
        fused: List[Tuple[str, str, tf.Tensor]] = [] if not cfg.xla and fused_kernel.op() is not None else None  # type: ignore[assignment]
        for path in gmap:
            e = gmap.entry(path)
            g = e.gradient
            info = lambda kind: metadata.SeriesInfo(layer=path, kind=kind, target=target, source=e.source, index=int(e.index), dtype=e.dtype)  # noqa: E731
            if path in precomputed:
                hist, stats = precomputed[path]
            elif g is None:
                hist, stats = reductions.no_gradient_records(e.elements, cfg.buckets)
            else:
                u = _unscale(g, scale)
                if deferred is not None:
                    self._register(info(metadata.KIND_HISTOGRAM))
                    deferred[self._register(info(metadata.KIND_STATS))] = u
                    hist = stats = None
                elif fused is not None and u.dtype in fused_kernel.DTYPES:
                    hist_tag, stats_tag = self._register(info(metadata.KIND_HISTOGRAM)), self._register(info(metadata.KIND_STATS))
                    out[hist_tag] = out[stats_tag] = None  # type: ignore[assignment]  # keeps the records' order
                    fused.append((hist_tag, stats_tag, u))
                    hist = stats = None
                else:
                    hist, stats = _histogram_and_stats(u, cfg.buckets, cfg.xla)
            if hist is not None:
                out[self._register(info(metadata.KIND_HISTOGRAM))] = hist
                out[self._register(info(metadata.KIND_STATS))] = stats
            if cfg.max_elements > 0 and g is not None:  # no gradient: its stats say so, no tensor record
                out[self._register(info(metadata.KIND_TENSOR))] = reductions.bounded_tensor(u, cfg.max_elements)
        for key, eps in eps_sources.items():
            g = eps_grads.get(key)
            index = probe.layer_index(key) if probe is not None else -1
            u = tf.zeros_like(eps) if g is None else _unscale(g, scale)
            norms = norms_of[key] if key in norms_of else timestep_norms(u)
            info = metadata.SeriesInfo(layer=key, kind=metadata.KIND_TIMESTEPS, target=target, source=metadata.SOURCE_OUTPUT, index=index, dtype="float64")
            out[self._register(info)] = norms
            if cfg.max_elements > 0:
                t = reductions.bounded_tensor(u[0], cfg.max_elements)
                info = metadata.SeriesInfo(layer=key + TIMESTEP_TENSOR_SUFFIX, kind=metadata.KIND_TENSOR, target=target, source=metadata.SOURCE_OUTPUT, index=index, dtype=eps.dtype.name)
                out[self._register(info)] = t
        if fused:  # one kernel op for all (reductions sends every kernel-readable tensor to it)
            reduced = reductions.histograms_and_stats([u for _, _, u in fused], cfg.buckets)
            for (hist_tag, stats_tag, _), (hist, stat) in zip(fused, reduced):
                out[hist_tag], out[stats_tag] = hist, stat
        return out

    def _with_payload(self, logs, step, log, cap, probe, gmap, eps_grads, scale, aux, values, aux_loss) -> Dict[str, Any]:
        """Write this step's records (graph mode), or add them to Keras' logs (see the module docstring).

        `GradientLogger` calls this step's function only for executions that contain
        a logged step, and Keras' own train function for every other one. Under XLA
        the payload is produced unconditionally: no conditional on the flag in the
        compiled step (handing backward-pass tensors to a conditional moves XLA's
        fusion boundaries and the last bits of training). Nor are the histograms and
        statistics computed in it: the step hands out the (unscaled) gradients,
        `payload["gradients"]`, and the callback's writer reduces them all in one
        call outside the step. Why: XLA's CPU code sums a tensor in one serial chain
        (measured ~1.7 ns per element and reduction, 5-6x TensorFlow's own kernels),
        and histogram_fixed_width does not compile at all; inside an XLA step the
        reductions of a small MLP cost more than its training step. `log` travels
        with the payload: with `steps_per_execution > 1` only some steps of an
        execution are logged. In graph mode without XLA the step reduces and writes
        behind `log` itself (`_writes_in_step`); eagerly the callback writes.
        """
        eps_sources = dict(probe.sources) if probe is not None else {}
        ctx = distribute.replica_context()
        if ctx is not None:
            return self._with_replica_payload(logs, step, log, cap, probe, gmap, eps_grads, scale, aux, values, aux_loss, ctx)
        loss_map = self._with_shadow_weights(cap, gmap, aux, aux_loss) if self._shadow_weights() else gmap
        deferred: Dict[str, tf.Tensor] = {}
        records = self._reduce(metadata.DEFAULT_TARGET, cap, loss_map, eps_sources, eps_grads, probe, scale, deferred=deferred)
        for name, value in values.items():
            wrapped = TapeWithExtraSources(aux, list(eps_sources.values()))
            tmap = cap.gradients(wrapped, value, name=name)
            teps = dict(zip(eps_sources.keys(), wrapped.extra_gradients))
            records.update(self._reduce(name, cap, tmap, eps_sources, teps, probe, scale, deferred=deferred))
        if self._writes_in_step():
            self._write_in_step(step, log, records, deferred)
            return logs
        logs = dict(logs)
        logs[PAYLOAD_KEY] = {"step": step, "log": log, "records": records, "gradients": deferred}
        return logs

    def _writes_in_step(self) -> bool:
        """Does the compiled step reduce and write its records itself?

        Yes in graph mode without XLA: handing the gradients to Python and calling a
        second compiled function there cost about 1.3 ms per logged step on the
        benchmark MLP (outputs materialized, a dict argument matched, a call), more
        than the reductions. Not under XLA (see `_with_payload`), not eagerly (the
        callback writes then), not with several replicas (`_with_replica_payload`).
        """
        return self.writer is not None and not self.config.xla and not tf.executing_eagerly()

    def _write_in_step(self, step: tf.Tensor, log: tf.Tensor, records: Dict[str, tf.Tensor], gradients: Dict[str, tf.Tensor]) -> None:
        """Reduce and write, on logged steps only.

        The gradients the fused write op can take are written by it, with `log` as
        its input and a flush after (`record_writes.write_fused`): no condition. The
        rest, if any, in one out-of-line branch (a call op when not taken). Why:
        a condition's branch waits for every gradient it reads and costs a call
        (docs/PERFORMANCE.md).
        """
        series, buckets, writer = self.series, self.config.buckets, self.writer
        resource = summary_state.writer_resource(writer) if fused_kernel.write_op() is not None else None
        direct = [tag for tag, g in gradients.items() if resource is not None and record_writes.fusable(g)]
        rest = {tag: g for tag, g in gradients.items() if tag not in set(direct)}

        def write() -> tf.Tensor:
            with writer.as_default(), tf.summary.record_if(True):  # flushes on exit (see _step_records)
                _step_records.write_step_records(series, buckets, step, records, rest)
            return tf.constant(True)

        with tf.name_scope("layergrad"):
            if direct:
                record_writes.write_fused(
                    resource, log, [series[t] for t in direct], [gradients[t] for t in direct], buckets,
                    tf.cast(step, tf.int64), flush=True,
                )
            if records or rest:
                cond_out_of_line(log, write)

    # -- several replicas (tf.distribute) ---------------------------------------------
    def _with_replica_payload(self, logs, step, log, cap, probe, gmap, eps_grads, scale, aux, values, aux_loss, ctx) -> Dict[str, Any]:
        """The same records as one device on the global batch, identical on every replica.

        Collectives cannot run inside a `tf.cond` in replica context, so the merge
        and the reductions run whenever this step runs; the records are encoded so
        that Keras' cross-replica mean of the step's outputs returns them unchanged
        (`_replica_payload`). `variable_gradients` are untouched: training is
        Keras' own.
        """
        eps_sources = dict(probe.sources) if probe is not None else {}
        loss_map = self._with_shadow_weights(cap, gmap, aux, aux_loss) if self._shadow_weights() else gmap
        records = self._reduce_replicas(metadata.DEFAULT_TARGET, cap, loss_map, eps_sources, eps_grads, probe, scale, ctx)
        for name, value in values.items():
            wrapped = TapeWithExtraSources(aux, list(eps_sources.values()))
            tmap = cap.gradients(wrapped, value, name=name)
            teps = dict(zip(eps_sources.keys(), wrapped.extra_gradients))
            records.update(self._reduce_replicas(name, cap, tmap, eps_sources, teps, probe, scale, ctx))
        logs = dict(logs)
        logs[PAYLOAD_KEY] = _replica_payload.encode(step, log, records)
        return logs

    def _reduce_replicas(self, target, cap, gmap, eps_sources, eps_grads, probe, scale, ctx) -> Dict[str, tf.Tensor]:
        """`_reduce` of the global batch: gathered tensors, or (replicas="stats") merged statistics."""
        entries = {p: dataclasses.replace(gmap.entry(p), gradient=None if gmap[p] is None else _unscale(gmap[p], scale)) for p in gmap}
        unscaled = GradientMap(entries, gmap.target, [])
        eps = {k: None if g is None else _unscale(g, scale) for k, g in eps_grads.items()}
        if self.config.replicas == "gather":
            merged = distribute.merge(unscaled)
            keys = [k for k, g in eps.items() if g is not None]
            gathered = ctx.all_gather([eps[k] for k in keys], axis=0) if keys else []
            eps.update(zip(keys, gathered))
            return self._reduce(target, cap, merged, eps_sources, eps, probe, None)
        n = ctx.num_replicas_in_sync
        weights = [p for p in unscaled if unscaled[p] is not None and unscaled.entry(p).source == metadata.SOURCE_WEIGHT]
        outputs = [p for p in unscaled if unscaled[p] is not None and unscaled.entry(p).source == metadata.SOURCE_OUTPUT]
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [unscaled[p] for p in weights]) if weights else []
        records = replica_stats.merged_histograms_and_stats([unscaled[p] for p in outputs], self.config.buckets, ctx, xla_safe=self.config.xla)
        for p, g in zip(weights, summed):
            entries[p] = dataclasses.replace(entries[p], gradient=g)
        for p in unscaled:
            e = entries[p]
            if e.gradient is None and e.source == metadata.SOURCE_OUTPUT and e.elements >= 0:
                entries[p] = dataclasses.replace(e, elements=e.elements * n)
        keys = [k for k, g in eps.items() if g is not None]
        sq = [_timestep_sumsq(eps[k]) for k in keys]  # this replica's share of each timestep's squared norm
        norms = dict(zip(keys, (tf.sqrt(v) for v in ctx.all_reduce(tf.distribute.ReduceOp.SUM, sq)))) if keys else {}
        return self._reduce(target, cap, GradientMap(entries, gmap.target, []), eps_sources, eps, probe, None,
                            precomputed=dict(zip(outputs, records)), norms_of=norms)

    def _with_shadow_weights(self, cap: Capture, gmap: Any, aux: Any, aux_loss: Any) -> Any:
        """`gmap` with its weight entries recomputed by the aux tape (see _shadow_weights)."""
        owners = cap.tree.variable_paths()
        by_path = {owners[id(v)][0]: v for v in self.model.trainable_variables if id(v) in owners}
        paths = [p for p in gmap if gmap.entry(p).source == metadata.SOURCE_WEIGHT and p in by_path]
        grads = aux.gradient(aux_loss, [by_path[p] for p in paths]) if paths else []
        entries = {p: gmap.entry(p) for p in gmap}
        for p, g in zip(paths, grads):
            entries[p] = dataclasses.replace(entries[p], gradient=g)
        return GradientMap(entries, gmap.target, [])




class _StepObservation(_tape_observer.Observation):
    """What one run of the model's train step shows: its tape, its loss, its gradient call."""

    def __init__(self, fit_step: FitStep, cap: Capture, probe: Optional[TimestepProbe]):
        super().__init__()
        self.fit_step, self.cap, self.probe = fit_step, cap, probe
        self.aux: Optional[Any] = None  # a second tape for targets and shadow weights (FitStep._aux_tape)
        self._aux_recording = False
        self.y_pred: Any = None  # the model's output in this pass (targets only, see _keeping_prediction)
        self.gmap: Optional[GradientMap] = None
        self.eps_grads: Dict[str, Any] = {}
        self.scale: Optional[tf.Tensor] = None
        self.values: Dict[str, tf.Tensor] = {}
        self.target: Any = None
        self._hooks: Optional[contextlib.ExitStack] = None

    def install_hooks(self) -> None:
        """The layer hooks of Capture (and TimestepProbe) and the model's, for this step's forward pass."""
        hooks = contextlib.ExitStack()
        hooks.enter_context(self.cap)
        if self.probe is not None:
            hooks.enter_context(self.probe)
        hooks.enter_context(_watching_the_model_call(self.fit_step.model, self))
        self._hooks = hooks

    def remove_hooks(self) -> None:
        """Right after the forward pass, so that no other replica's forward runs through them.

        Why: MirroredStrategy runs the replicas' steps in threads that take turns at
        each cross-replica call (a metric update, the optimizer's all-reduce); hooks
        left on the layers past the forward pass would see another replica's outputs.
        """
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.close()

    def adopt(self, tape: Any) -> None:
        self.cap.watch_with(tape)
        if self.probe is not None:
            self.probe.watch_with(tape)
        aux = self.fit_step._aux_tape()
        if aux is not None:
            # Records from here to the gradient call: the forward pass, the loss and
            # its scaling (tf_keras scales inside minimize(), after the step's `with`).
            aux.__enter__()
            self.aux, self._aux_recording = aux, True
            self.cap.watch_with(aux)
            if self.probe is not None:
                self.probe.watch_with(aux)

    def stop_aux(self) -> None:
        if self._aux_recording:
            self._aux_recording = False
            self.aux.__exit__(None, None, None)

    def answer(self, tape: Any, target: Any, sources: Any, args: tuple, kwargs: Dict[str, Any], gradient: Callable) -> Any:
        fit_step = self.fit_step
        self.scale = loss_scale(fit_step.kind, fit_step.model.optimizer)  # read before the update
        if fit_step.config.targets:
            if self.y_pred is None:
                raise RuntimeError("GradientLogger(targets=...): the model was not called inside its train step's tape")
            self.values = fit_step._target_values(self.y_pred, self.scale)  # still on the aux tape
        self.target = target  # the loss as the step differentiates it (scaled, with loss scaling)
        self.remove_hooks()  # a step that never called the model itself (e.g. only its sub-models)
        self.stop_aux()  # before the backward pass: the aux tape must not record it
        eps = list(self.probe.sources.values()) if self.probe is not None else []
        combined = _CombinedCall(tape, gradient, sources, eps, args, kwargs)
        self.gmap = self.cap.gradients(combined, target, name=metadata.DEFAULT_TARGET)
        if eps:
            self.eps_grads = dict(zip(self.probe.sources.keys(), combined.extra_gradients))
        return combined.source_gradients


class _CombinedCall:
    """The tape `Capture.gradients` is given: its one call becomes the step's own call, extended.

    The step asked for `sources`; Capture asks for (model variables, layer
    outputs). ONE real call is made for (sources, layer outputs, extra): the
    step gets its part exactly as the real method returns it, and Capture gets
    each model variable's gradient picked from it by identity (None for a
    variable the step did not ask for).
    """

    _persistent = False

    def __init__(self, tape: Any, gradient: Callable, sources: Any, extra: List[Any], args: tuple, kwargs: Dict[str, Any]):
        self._tape, self._gradient, self._sources, self._extra = tape, gradient, sources, extra
        self._args, self._kwargs = args, kwargs
        self.source_gradients: Any = None
        self.extra_gradients: List[Any] = []

    def watch(self, tensor: Any) -> None:
        self._tape.watch(tensor)

    def gradient(self, target: Any, requested: Any) -> Any:
        variables, outputs = requested
        got, output_grads, extra = self._gradient(self._tape, target, (self._sources, list(outputs), self._extra), *self._args, **self._kwargs)
        self.source_gradients, self.extra_gradients = got, list(extra)
        by_id = {id(s): g for s, g in zip(tf.nest.flatten(self._sources), tf.nest.flatten(got))}
        return [by_id.get(id(v)) for v in variables], output_grads


@contextlib.contextmanager
def _watching_the_model_call(model: Any, seen: _StepObservation) -> Iterator[None]:
    """When the model's own call returns: keep its output (targets are functions of it), remove the hooks.

    Same hook as `Capture`'s on layers: an instance attribute `call`, removed afterwards.
    """
    had = "call" in model.__dict__
    previous = model.__dict__.get("call")
    original = model.call
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def call_and_watch(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        first = next(iter(tf.nest.flatten(out)), None)
        ours = isinstance(first, tf.Tensor) and (hasattr(first, "numpy") if graph is None else getattr(first, "graph", None) is graph)
        if seen.y_pred is None and ours:
            seen.y_pred = out
            seen.remove_hooks()
        return out

    call_and_watch.__wrapped__ = original  # keeps inspect.signature() truthful
    object.__setattr__(model, "call", call_and_watch)
    try:
        yield
    finally:
        if had:
            object.__setattr__(model, "call", previous)
        else:
            model.__dict__.pop("call", None)
