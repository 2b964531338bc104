"""What a logged step hands out: its tensors, in ONE ordered host callback, reduced there by a function of its own.

Why one callback per step: each host callback has a fixed cost of the order of a millisecond, which a callback
per tensor or per layer pays many times over (docs/PERFORMANCE.md); all groups' arrays travel together, and
`ordered=True` keeps the steps in order. JAX runs ordered effects on one device only: a step sharded over several
(`keras.distribution`) hands its records out unordered, and the logger puts them in step order on the host.
Why behind a `lax.cond`: a step that is not written hands out nothing. Why the reductions are not in that
branch: XLA allocates the scratch memory of both branches at every run of the step, taken or not, and once it
passes glibc's largest mmap threshold (32 MB) every step maps it afresh and pays a page fault per page it
touches (docs/DESIGN.md, "The cost of a step that is not written on JAX"). The branch holds the callback only
(and what needs the step's own trace: per-example rows, the targets' passes); the statistics and histogram are
computed in the callback (`host_records`: the fused kernel's C++ loops, or `reductions` compiled on their own),
on the very values the step computed. That is
the CPU's case only (`reduced_on_device`): on an accelerator the tensors would have to be copied to the host
first, and its allocator does not map memory per run, so there the records are reduced in the branch and only
they travel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from tb_layergrad import metadata
from tb_layergrad.jax import example_norms, reductions
from tb_layergrad.kernel import host_records as kernel_host_records
from tb_layergrad.writer.step_records import GroupStep

BUCKETS = 30
# Compiled once per list of shapes: an eager step (jit_compile=False) would otherwise dispatch each operation.
_records = jax.jit(lambda tensors: reductions.records(tensors, BUCKETS))
# Where the callback reduces (CPU steps): the tensors it is handed are on the host already.
_HOST = jax.devices("cpu")[0]


def host_records(arrays: Sequence[Any]) -> Tuple[np.ndarray, np.ndarray]:
    """(stats [T, NUM_STATS], counts [T, BUCKETS]) of the tensors a CPU step handed its callback.

    The one place that decides what reduces them on the host: the fused kernel's C++ loops
    (`kernel.host_records`) where they are built here, one pass per tensor where the same definitions under
    XLA's CPU code make several (docs/DESIGN.md, "The cost of a written step on JAX"); elsewhere (no
    compiler, not Linux x86-64, `TB_LAYERGRAD_FUSED=0`) `reductions` compiled on its own, on the host device.
    """
    done = kernel_host_records.records([np.asarray(a) for a in arrays], BUCKETS)
    if done is not None:
        return done
    with jax.enable_x64(True), jax.default_device(_HOST):
        return tuple(jax.device_get(_records(list(arrays))))


def reduced_on_device() -> bool:
    """Are a written step's records reduced inside the step rather than in its host callback?

    On the CPU, no: reductions in the written branch grow the scratch memory every step allocates, written or
    not (the module's docstring). On an accelerator, yes: handing the host every tensor would copy each one
    across, where the records are a few hundred numbers per layer.
    """
    return jax.default_backend() != "cpu"


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
    flags = [~jnp.all(jnp.isfinite(t)) for g in groups if g.checked for t in g.tensors]
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


def emit(
    step: jax.Array,
    write: jax.Array,
    groups: Sequence[Group],
    host: Callable[..., None],
    ordered: bool = True,
    more: Callable[[], List[Group]] = list,
) -> None:
    """When `write` holds, reduce every group and call `host(step, [GroupStep...])` once (in step order if
    `ordered`). `more()` traces further groups on the written steps only (the targets' own passes)."""

    def reduce_and_send() -> None:
        todo = [g for g in [*groups, *more()] if g.tensors]
        infos = [g.info() for g in todo]

        def on_host(step_value: Any, *arrays: Any) -> None:
            records, at = [], 0
            for info, g, statuses in zip(infos, todo, example_statuses):
                n = 2 if on_device else len(g.tensors)  # the group's records, or its tensors to reduce here
                raws = len(g.tensors) if g.max_elements > 0 else 0
                handed, raw = arrays[at : at + n], arrays[at + n : at + n + raws]
                at += n + raws
                stats, counts = handed if on_device else host_records(handed)
                table = None
                if statuses is not None:
                    squares = None
                    if metadata.EXAMPLE_EXACT in statuses:
                        squares, at = arrays[at], at + 1
                    table = example_norms.table(statuses, squares, g.batch)
                records.append(
                    GroupStep(
                        info,
                        np.asarray(stats),
                        np.asarray(counts) if g.histogram else None,
                        [np.asarray(r) for r in raw] if raws else None,
                        table,
                    )
                )
            host(int(np.asarray(step_value)), records)

        on_device = reduced_on_device()
        example_statuses: List[Optional[List[int]]] = []
        arrays: List[Any] = []
        for g in todo:
            if on_device:
                with jax.enable_x64(True):
                    arrays += list(_records(g.tensors))
            else:
                arrays += list(g.tensors)
            if g.max_elements > 0:
                arrays += [bounded(t, g.max_elements) for t in g.tensors]
            if g.examples is None:
                example_statuses.append(None)
                continue
            exact, statuses = example_norms.split(g.examples())
            example_statuses.append(statuses)
            if exact:
                arrays.append(jnp.stack(exact))
        if todo:
            jax.debug.callback(on_host, step, *arrays, ordered=ordered)

    if isinstance(write, jax.core.Tracer):
        jax.lax.cond(write, reduce_and_send, lambda: None)
    elif bool(write):  # an eager step (jit_compile=False): a cond here would be compiled anew at every step
        reduce_and_send()
