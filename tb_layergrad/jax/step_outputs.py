"""What a logged step hands out: its records, computed inside the compiled step and returned as its outputs.

Why outputs and not a host callback: on JAX's CPU a compiled step that holds a host callback runs synchronously
(the call returns once the step has run, so Python's work between steps no longer overlaps it), taken or not,
and a callback receives each tensor as a copy (docs/DESIGN.md, "The cost of a step that is not written on
JAX"). Here the written branch of a `lax.cond` reduces the step's tensors to its records, a few hundred numbers
per layer, and the step returns them with its number and whether it wrote them, beside its logs; the host reads
them once the step has run, in the order the steps ran (`HandedSteps`: the flag on the training thread, the
written steps' records on a thread of its own).

What reduces them (`_reduce`, the one place that decides): on the CPU the fused kernel's loops as an XLA FFI
custom call (`kernel.host_records.step_handler`): one pass per tensor where XLA's definitions make several, and
no scratch memory of their own, which XLA would allocate at every run of the step, written or not. Elsewhere (an
accelerator, no compiler, another platform, `TB_LAYERGRAD_FUSED=0`) the same definitions in XLA (`reductions`).
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from tb_layergrad import metadata
from tb_layergrad.jax import example_norms, reductions
from tb_layergrad.kernel import host_records
from tb_layergrad.writer.step_records import GroupStep

BUCKETS = 30
NUM_STATS = len(metadata.STAT_FIELDS)
# XLA's definitions of the records: inlined in a compiled step, compiled once per list of shapes for an eager one.
_records = jax.jit(lambda tensors: reductions.records(tensors, BUCKETS))
# The name the loops' FFI handler is registered under, for the CPU platform (once per process).
FFI_TARGET = "tb_layergrad_step_records"
_registered: dict = {}
_register_lock = threading.Lock()


def _ffi_target() -> Optional[str]:
    """FFI_TARGET once the loops are built and registered with XLA here, else None (said once, by the build)."""
    handler = host_records.step_handler(Path(jax.ffi.include_dir()))
    if handler is None:
        return None
    with _register_lock:
        if not _registered:
            jax.ffi.register_ffi_target(FFI_TARGET, jax.ffi.pycapsule(handler), platform="cpu")
            _registered["target"] = FFI_TARGET
    return FFI_TARGET


def reduced_by_the_loops() -> bool:
    """Do the fused kernel's loops compute the records (a CPU step, where they are built), or XLA's definitions?"""
    return jax.default_backend() == "cpu" and _ffi_target() is not None


def _readable(x: Any) -> Any:
    """`x` in a dtype the loops read: integers and booleans widened to float64, other floats (float8) to float32."""
    if x.dtype in (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64):
        return x
    return x.astype(jnp.float64 if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else jnp.float32)


def _reduce(tensors: Sequence[Any]) -> Tuple[Any, Any]:
    """(stats float64 [T, NUM_STATS], counts int64 [T, BUCKETS]) of a group's tensors, traced in the step."""
    with jax.enable_x64(True):
        if not reduced_by_the_loops():
            stats, counts = _records(list(tensors))
            return stats, counts
        shapes = (
            jax.ShapeDtypeStruct((len(tensors), NUM_STATS), jnp.float64),
            jax.ShapeDtypeStruct((len(tensors), BUCKETS), jnp.int64),
        )
        call = jax.ffi.ffi_call(FFI_TARGET, shapes)
        stats, counts = call(
            *[_readable(t) for t in tensors], buckets=np.int64(BUCKETS), threads=np.int64(host_records.threads())
        )
        return stats, counts


@dataclasses.dataclass
class Group:
    """One (target, source) of the step: its rows (layer keys, positions) and the tensors traced for them."""

    target: str
    source: str
    keys: List[str]
    indexes: List[int]
    tensors: List[Any]
    histogram: bool = True
    max_elements: int = 0  # > 0: also each tensor's bounded raw view (kind `tensor`)
    examples: Optional[Callable[[], List[Any]]] = None  # traced in the written branch: `example_norms.Row`s
    batch: int = 0  # the examples in the batch (static), with `examples`

    def info(self) -> metadata.GroupInfo:
        return metadata.GroupInfo(
            kind=metadata.KIND_STATS,
            target=self.target,
            source=self.source,
            layers=tuple(self.keys),
            indexes=tuple(self.indexes),
            dtypes=tuple(str(np.dtype(t.dtype)) for t in self.tensors),
        )

    @property
    def checked(self) -> bool:
        """Is this group's finiteness checked at every step (the loss, output gradients, activations)?"""
        return self.source != metadata.SOURCE_WEIGHT


def nonfinite(groups: Sequence[Group]) -> jax.Array:
    """Does any checked tensor of the step hold a NaN/Inf? (a reduction per tensor, on every step)."""
    # x * 0 is 0 for every finite x and NaN for NaN and ±Inf, so the sum is NaN exactly where a NaN/Inf is, in
    # any order and without overflow: a float sum, which costs the step far less than a per-element test
    # reduced by `all` (docs/DESIGN.md, "The cost of a step that is not written on JAX").
    flags = [~jnp.isfinite(jnp.sum(t * 0)) for g in groups if g.checked for t in g.tensors]
    return jnp.any(jnp.stack(flags)) if flags else jnp.asarray(False)


def bounded(x: Any, max_elements: int) -> jax.Array:
    """float32 [rows, cols]: the deterministic bounded view of docs/FORMAT.md's `tensor` record.

    `x` seen as [shape[0], prod(shape[1:])] (a scalar or vector as one row); whole rows from the top while
    `rows * cols <= max_elements` (at least one); a row longer than that alone strided by the smallest `s` that
    fits (columns 0, s, 2s, ...). Shapes are static here, so it is slicing only.
    """
    x = jnp.asarray(x, jnp.float32)
    x = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], -1)
    rows, cols = x.shape
    stride = max(1, -(-cols // max_elements))
    x = x[:, ::stride]
    keep = min(rows, max(1, max_elements // max(x.shape[1], 1)))
    return x[:keep]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the arrays a step hands out read back as its records: fixed when the step is traced.

    The arrays: the step's number, whether it was written, then per group its stats and counts, its bounded raw
    views (`raws` of them) and, with per-example rows, the exact rows' squares (where `exact`)."""

    infos: Tuple[metadata.GroupInfo, ...]
    histogram: Tuple[bool, ...]
    raws: Tuple[int, ...]
    statuses: Tuple[Optional[Tuple[int, ...]], ...]  # per_example: each row's status (`example_norms.split`)
    exact: Tuple[bool, ...]
    batch: Tuple[int, ...]

    def records(self, arrays: Sequence[np.ndarray]) -> Tuple[int, bool, List[GroupStep]]:
        """(step, written, its records) from the host values of the arrays the step handed out."""
        step, written, at = int(arrays[0]), bool(arrays[1]), 2
        if not written:
            return step, False, []
        out = []
        for g, info in enumerate(self.infos):
            stats, counts = arrays[at], arrays[at + 1]
            raw = [np.asarray(r) for r in arrays[at + 2 : at + 2 + self.raws[g]]]
            at += 2 + self.raws[g]
            table = None
            if self.statuses[g] is not None:
                squares = None
                if self.exact[g]:
                    squares, at = arrays[at], at + 1
                table = example_norms.table(list(self.statuses[g]), squares, self.batch[g])
            out.append(
                GroupStep(
                    info,
                    np.asarray(stats, np.float64),
                    np.asarray(counts, np.int64) if self.histogram[g] else None,
                    raw or None,
                    table,
                )
            )
        return step, True, out


def hand_out(
    step: jax.Array, write: jax.Array, groups: Sequence[Group], more: Callable[[], List[Group]] = list
) -> Optional[Tuple[Layout, Tuple[Any, ...]]]:
    """The step's records when `write` holds, as arrays the step returns, and how to read them (None: nothing to
    hand out). `more()` traces further groups in the written branch only (the targets' own passes)."""
    layouts: List[Layout] = []

    def reduce() -> Tuple[Any, ...]:
        todo = [g for g in [*groups, *more()] if g.tensors]
        arrays: List[Any] = []
        statuses: List[Optional[Tuple[int, ...]]] = []
        exact: List[bool] = []
        for g in todo:
            arrays += _reduce(g.tensors)
            if g.max_elements > 0:
                arrays += [bounded(t, g.max_elements) for t in g.tensors]
            rows, status = example_norms.split(g.examples()) if g.examples is not None else ([], None)
            statuses.append(None if status is None else tuple(status))
            exact.append(bool(rows))
            if rows:
                arrays.append(jnp.stack(rows))
        layouts.append(
            Layout(
                infos=tuple(g.info() for g in todo),
                histogram=tuple(g.histogram for g in todo),
                raws=tuple(len(g.tensors) if g.max_elements > 0 else 0 for g in todo),
                statuses=tuple(statuses),
                exact=tuple(exact),
                batch=tuple(g.batch for g in todo),
            )
        )
        return tuple(arrays)

    if isinstance(write, jax.core.Tracer):
        shapes = jax.eval_shape(reduce)  # what the branch not taken returns in its place

        def nothing() -> Tuple[Any, ...]:
            with jax.enable_x64(True):  # the records' float64 / int64 zeros
                return tuple(jnp.zeros(s.shape, s.dtype) for s in shapes)

        arrays = jax.lax.cond(write, reduce, nothing)
    elif bool(write):  # an eager step (jit_compile=False): a cond here would be compiled anew at every step
        arrays = reduce()
    else:
        return None
    if not layouts[-1].infos:
        return None
    return layouts[-1], (jnp.asarray(step, jnp.int32), jnp.asarray(write), *arrays)


def _on_host(x: Any) -> np.ndarray:
    """One array a step handed out, on the host (waiting for its step): a view of a CPU buffer, and none of
    `jax.device_get`'s work for trees and other devices, which costs a written step more than its reads."""
    return np.asarray(x)


class HandedSteps:
    """The arrays each step handed out, read as their steps finish, in the order the steps ran; `take(step,
    records)` for each written step, on a thread of its own.

    Why the training thread looks at each step's written flag only once its step has run (`put` forwards the
    steps that are done, `wait` waits for the rest): waiting on an array that is not ready yet spins a while
    before it sleeps, and on a thread of ours that spin would take a core from the step, at every step. The
    written steps go to the thread: reading their records and writing them must not hold up the training
    thread, which meanwhile goes on dispatching the next steps (JAX runs them asynchronously).
    """

    def __init__(self, take: Callable[[int, List[GroupStep]], None]) -> None:
        self._take = take
        self._pending: "collections.deque[Tuple[Layout, Tuple[Any, ...]]]" = collections.deque()
        self._queue: "queue.Queue[Optional[Tuple[Layout, Tuple[Any, ...]]]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="tb_layergrad-jax-steps", daemon=True)
        self._thread.start()

    def put(self, layout: Layout, arrays: Tuple[Any, ...]) -> None:
        """A step's arrays, in the order the steps ran; the steps that are done by now are forwarded."""
        self._pending.append((layout, arrays))
        self._forward(wait=False)

    def wait(self) -> None:
        """Every step put so far is taken; raises the first error met in taking them (once)."""
        self._forward(wait=True)
        self._queue.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self._forward(wait=True)
        self._queue.put(None)
        self._thread.join()

    def _forward(self, wait: bool) -> None:
        """The written steps among the first pending ones to the thread, in order: those that are done (`wait`:
        all, waiting for each); the first step not done yet stops it, so the order holds."""
        while self._pending:
            layout, arrays = self._pending[0]
            written = arrays[1]
            if not wait and not written.is_ready():
                return
            self._pending.popleft()
            try:
                if bool(_on_host(written)):  # most steps write nothing: their records are not fetched
                    self._queue.put((layout, arrays))
            except BaseException as e:  # a failed step: raised at the next wait(), as a failed take
                if self._error is None:
                    self._error = e

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                layout, arrays = item
                step, _, records = layout.records([_on_host(a) for a in arrays])
                self._take(step, records)
            except BaseException as e:  # the first is handed to the training thread at its next wait()
                if self._error is None:
                    self._error = e
            finally:
                self._queue.task_done()
