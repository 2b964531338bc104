"""The fused reduction kernel from Python: built on first use, cached, loaded, and its two ops called.

Why: on a small model, what logging every step costs is mostly the number of
TensorFlow kernels the records take (about ten per tensor plus their scalar
work), not the reading of the tensors. `src/` computes the histograms and
statistics of all of a step's tensors in one kernel, two reads of each, and
can write them to the summary writer in that same op (see
docs/PERFORMANCE.md for the figures). Whether a step uses it is decided in
one place, `tb_layergrad.summary.write`.

TensorFlow has no stable binary interface for custom ops, so the kernel is
compiled here, against the installed TensorFlow, with the machine's C++
compiler, once per TensorFlow version, compiler and CPU kind, and cached
(`cache`: the user's cache folder or `TB_LAYERGRAD_CACHE`). It is built
and used on Linux x86-64 only, where it is tested. Elsewhere, without a
compiler, with a GPU visible (the kernel is CPU-only) or with
`TB_LAYERGRAD_FUSED=0`, `tb_layergrad.statistics.reductions` computes the
records with TensorFlow's ops: the same records, more kernels.
`python -m tb_layergrad.kernel` builds it ahead of time. A build failure is logged with the compiler's message and never
raised; it is remembered, so later processes do not compile again in vain.

Its two ops: `histograms_and_stats` computes the records of several tensors; `write_histograms_and_stats`
also writes them to a summary writer, in groups (docs/FORMAT.md, format version 2), when its `Condition`
holds. Both raise RuntimeError where the kernel is not available (`unavailable_reason()`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad.kernel import cache

log = logging.getLogger("tb_layergrad")

KERNELS = Path(__file__).with_name("src")
# The TensorFlow ops' sources (host_records.cc and jax_step_records.cc are the TensorFlow-free builds':
# `host_records`).
SOURCES = tuple(sorted(f for f in KERNELS.glob("*.cc") if f.name not in ("host_records.cc", "jax_step_records.cc")))
HEADERS = tuple(sorted(KERNELS.glob("*.h")))
OP_NAME = "TbLayergradHistogramsAndStats"
WRITE_OP_NAME = "TbLayergradWriteHistogramsAndStats"
# The dtypes the kernel reads (float16/bfloat16 are widened to float32 inside it).
DTYPES = (tf.float16, tf.bfloat16, tf.float32)
ENV_CACHE = cache.ENV_CACHE

_lock = threading.Lock()
_state: dict = {}  # "module": the loaded library or None once decided; "error": why not


def _build_command(compiler: str, output: Path) -> List[str]:
    return [
        compiler,
        "-shared",
        "-fPIC",
        *cache.arithmetic_flags(compiler),
        "-w",
        *map(str, SOURCES),
        "-o",
        str(output),
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
    ]


def library_path(compiler: str) -> Path:
    """Where the build for this source, command (compiler, flags, TensorFlow), compiler version and CPU lives."""
    inputs = (*(f.read_bytes() for f in SOURCES + HEADERS), tf.__version__)
    return cache.library_path("histograms_and_stats", inputs, _build_command(compiler, Path("out")), compiler)


def build(compiler: Optional[str] = None, retry: bool = False) -> Path:
    """Compiles the kernel unless it is cached; returns the library. Raises RuntimeError on failure.

    A failed build is remembered (`cache.failure_marker`) and raised again
    without compiling, unless `retry`.
    """
    compiler = cache.compiler_or_raise(compiler)
    return cache.build(
        library_path(compiler),
        lambda output: _build_command(compiler, output),
        what=f"{KERNELS.name}/*.cc with {compiler}",
        announce="its fused reduction kernel for this TensorFlow (once, ~30 s)",
        retry=retry,
    )


def _load() -> Tuple[Optional[Any], Optional[str]]:
    unsupported = cache.supported_platform()
    if unsupported:  # not a warning: TensorFlow's ops are what this platform is meant to use
        log.info("tb_layergrad: %s; TensorFlow ops compute the records", unsupported)
        return None, unsupported
    if tf.config.list_logical_devices("GPU"):
        return None, "a GPU is visible (the fused kernel is CPU-only)"
    try:
        module = tf.load_op_library(str(build()))
    except (RuntimeError, OSError, subprocess.SubprocessError, tf.errors.OpError) as e:
        log.warning("tb_layergrad: the fused reduction kernel is not available, TensorFlow ops are used instead: %s", e)
        return None, str(e)
    tf.no_gradient(OP_NAME)
    tf.no_gradient(WRITE_OP_NAME)
    _state["write_error"] = _write_op_error(module)
    if _state["write_error"]:
        log.warning(
            "tb_layergrad: the fused write op cannot write to TensorFlow's summary writers here, "
            "tf.summary.write is used instead: %s",
            _state["write_error"],
        )
    return module, None


def _write_op_error(module: Any) -> Optional[str]:
    """Why the write op cannot write here (None: it can), found by writing one record to a scratch writer.

    Why: it looks the writer up as TensorFlow's own `SummaryWriterInterface` across
    shared libraries, which holds for TensorFlow's own builds (type names, not
    addresses, identify resource types) but is not promised by any interface. A
    build where it fails must cost the fallback, never a training step.
    """
    try:
        with tempfile.TemporaryDirectory() as scratch, tf.init_scope():
            writer = tf.summary.create_file_writer(scratch)
            one = (("self_test", b""),)
            groups = Groups(sizes=(1,), block_steps=(1,), histogram=one, stats=one, first_nonfinite=())
            condition = Condition(record=tf.constant(True), step=tf.constant(0, tf.int64), flush=True)
            op = module.tb_layergrad_write_histograms_and_stats
            resource = writer._resource  # noqa: SLF001
            write_histograms_and_stats(resource, [tf.constant([1.0, 2.0])], 2, groups, condition, op=op)
            writer.close()
            if not any(os.path.getsize(os.path.join(scratch, f)) > 0 for f in os.listdir(scratch)):
                return "the self-test wrote nothing"
    except (tf.errors.OpError, RuntimeError, TypeError, ValueError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _module() -> Optional[Any]:
    """The loaded library, or None when it cannot be used here (built and loaded once per process; the switch
    is read each time)."""
    if cache.switched_off():
        return None
    with _lock:
        if "module" not in _state:
            _state["module"], _state["error"] = _load()
    return _state["module"]


def op():
    """The kernel's op function, or None when it cannot be used here."""
    module = _module()
    return None if module is None else module.tb_layergrad_histograms_and_stats


def write_op():
    """The op function that also writes the records (`write_histograms_and_stats`), or None where it cannot
    write here (`_write_op_error`)."""
    module = _module()
    if module is None or _state.get("write_error"):
        return None
    return module.tb_layergrad_write_histograms_and_stats


def unavailable_reason() -> Optional[str]:
    """Why `op()` is None (None when it is not, or has not been asked for yet)."""
    return f"{cache.ENV_SWITCH}=0" if cache.switched_off() else _state.get("error")


# -- the two ops, called from Python: what they take, in a few named parts --------------------
Series = Tuple[Tuple[str, bytes], ...]  # (tag, serialized SummaryMetadata): one per group


@dataclasses.dataclass(frozen=True)
class Condition:
    """When the write op writes, and what.

    `record`: a bool scalar, write this step; `step`: int64 scalar; `histograms`: a bool (scalar), write the
    histogram records too (a step at which a tensor holds a NaN/Inf always gets them); `record_if_nonfinite`:
    None, or a bool scalar: then an unrecorded step's tensors are checked for a NaN/Inf too, and written after
    all when one holds one and it is true; `flush`: flush the writer after writing.
    """

    record: Any
    step: Any
    histograms: Any = True
    record_if_nonfinite: Any = None
    flush: bool = False


@dataclasses.dataclass(frozen=True)
class Groups:
    """How the tensors are written: consecutive groups of `sizes`, each one record per kind.

    Per group and kind, the (tag, serialized metadata) of its records (`first_nonfinite` empty: those
    records are not written); `block_steps` (one per group): each of the group's tags gets
    `/{first step of the block of that many steps holding step}`.
    """

    sizes: Tuple[int, ...]
    block_steps: Tuple[int, ...]
    histogram: Series
    stats: Series
    first_nonfinite: Series = ()


class Written(NamedTuple):
    """What the write op did: `written` (bool scalar); `first_steps` [T] the running first non-finite steps
    with this step applied; `nonfinite` [T] which tensors held a NaN/Inf (all false when nothing was
    recorded or checked); `metadata_written` [3 * groups] which (histogram, stats, first_nonfinite) record of
    each group carried its metadata; `stats` [T, 12] each tensor's stats as written (zeros when not)."""

    written: tf.Tensor
    first_steps: tf.Tensor
    nonfinite: tf.Tensor
    metadata_written: tf.Tensor
    stats: tf.Tensor


def histograms_and_stats(tensors: Sequence[tf.Tensor], buckets: int) -> Tuple[tf.Tensor, tf.Tensor]:
    """([T, buckets, 3], [T, NUM_STATS]) float64 of float16/bfloat16/float32 tensors, by the kernel."""
    fn = op()
    if fn is None:
        raise RuntimeError(f"the fused kernel is not available: {unavailable_reason()}")
    return fn(list(tensors), buckets=buckets)


class Running(NamedTuple):
    """What the write op reads of the state kept across steps: `first_steps` int64 [T], each tensor's first step
    with a NaN/Inf so far (-1: none); `with_metadata` [3 * groups] bool, which of each group's (histogram,
    stats, first_nonfinite) records carries its metadata."""

    first_steps: tf.Tensor
    with_metadata: tf.Tensor


def write_histograms_and_stats(
    writer: tf.Tensor,
    tensors: Sequence[tf.Tensor],
    buckets: int,
    groups: Groups,
    condition: Condition,
    running: Optional[Running] = None,
    op: Any = None,
) -> Written:
    """When `condition` holds, write each group's records to `writer` (a summary writer's resource handle).

    The records are those `tf.summary.write` would write (docs/FORMAT.md). `running`: default, no first
    non-finite step yet and the metadata with every record. `op`: the write op's function (default:
    `write_op()`). One op, on the CPU, where the writer lives.
    """
    op = op if op is not None else write_op()
    if op is None:
        raise RuntimeError(f"the fused kernel is not available: {unavailable_reason()}")
    if running is None:
        running = Running(tf.fill([len(tensors)], tf.constant(-1, tf.int64)), tf.ones([3 * len(groups.sizes)], tf.bool))
    check = condition.record_if_nonfinite is not None
    with tf.device("cpu:0"):
        out = op(
            writer,
            condition.record,
            condition.record_if_nonfinite if check else tf.constant(False),
            tf.convert_to_tensor(condition.histograms, tf.bool),
            condition.step,
            running.first_steps,
            running.with_metadata,
            list(tensors),
            buckets=buckets,
            histogram_tags=[t for t, _ in groups.histogram],
            histogram_metadata=[m for _, m in groups.histogram],
            stats_tags=[t for t, _ in groups.stats],
            stats_metadata=[m for _, m in groups.stats],
            first_nonfinite_tags=[t for t, _ in groups.first_nonfinite],
            first_nonfinite_metadata=[m for _, m in groups.first_nonfinite],
            flush=condition.flush,
            check=check,
            group_sizes=list(groups.sizes),
            block_steps=list(groups.block_steps),
        )
    return Written(*out)


def main() -> None:
    """`python -m tb_layergrad.kernel`: build now (e.g. in a Docker image), print where.

    Retries a remembered failure, so that the compiler's message is shown again.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build(retry=True))
