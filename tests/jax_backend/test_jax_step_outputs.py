"""`step_outputs.HandedSteps`: the records a step returns, read on a thread of their own as the steps finish.

The order is the order the steps were put (the order they ran), whatever the work each takes; a step that did not
write is not taken; what goes wrong in taking one is raised on the training thread at its next `wait()`, once,
and the other steps are taken all the same.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.jax import step_outputs


def _compiled_step():
    """A compiled step that writes its even steps and hands out its records as the logger's step does, and the
    layout its trace gave them."""
    layouts = []

    @jax.jit
    def step_fn(step, values):
        tensors = [values, values * step]
        group = step_outputs.Group("loss", metadata.SOURCE_OUTPUT, ["l0", "l1"], [0, 1], tensors)
        layout, arrays = step_outputs.hand_out(step, step % 2 == 0, [group])
        layouts.append(layout)
        return arrays

    return step_fn, layouts


def test_each_written_step_is_taken_once_in_the_order_the_steps_ran():
    taken = []

    def take(step, records):
        time.sleep(0.001 * (step % 3))  # uneven work per step
        taken.append((step, threading.current_thread().name, records))

    handed = step_outputs.HandedSteps(take)
    step_fn, layouts = _compiled_step()
    values = jnp.arange(4, dtype=jnp.float32) - 1.5
    for step in range(1, 41):
        arrays = step_fn(jnp.int32(step), values)
        handed.put(layouts[-1], arrays)
    handed.wait()
    handed.close()
    assert [s for s, _, _ in taken] == list(range(2, 41, 2))
    assert all(thread == "tb_layergrad-jax-steps" for _, thread, _ in taken)
    for step, _, records in taken:
        (record,) = records
        assert record.group.layers == ("l0", "l1")
        mean = record.stats[:, metadata.STAT_INDEX["mean"]]
        np.testing.assert_allclose(mean, [0.0, 0.0], atol=1e-12)
        maxima = record.stats[:, metadata.STAT_INDEX["max"]]
        np.testing.assert_allclose(maxima, [1.5, 1.5 * step], rtol=1e-7)
        assert record.counts.shape == (2, step_outputs.BUCKETS) and record.counts.sum() == 8


def test_an_error_in_taking_a_step_is_raised_at_the_next_wait_once():
    taken = []

    def take(step, records):
        if step == 4:
            raise OSError("disk full")
        taken.append(step)

    handed = step_outputs.HandedSteps(take)
    step_fn, layouts = _compiled_step()
    values = jnp.ones(4, jnp.float32)
    for step in range(1, 7):
        arrays = step_fn(jnp.int32(step), values)
        handed.put(layouts[-1], arrays)
    with pytest.raises(OSError, match="disk full"):
        handed.wait()
    handed.wait()  # raised once
    for step in range(7, 9):
        arrays = step_fn(jnp.int32(step), values)
        handed.put(layouts[-1], arrays)
    handed.wait()
    handed.close()
    assert taken == [2, 6, 8]  # every other written step is taken, the failed one's error raised


def test_put_reads_no_step_that_is_still_running(monkeypatch):
    """`put` runs on the training thread after each step is dispatched: it reads the written flag of the steps
    that are done only (waiting on one that runs would spin, taking a core from it); `wait` reads the rest."""
    reads = []
    on_host = step_outputs._on_host

    def spy(x):
        reads.append((in_put[0], x.is_ready()))
        return on_host(x)

    monkeypatch.setattr(step_outputs, "_on_host", spy)
    in_put = [False]
    taken = []
    handed = step_outputs.HandedSteps(lambda step, records: taken.append(step))

    @jax.jit
    def slow_step(step, values):
        def body(_, x):
            return jnp.tanh(x @ x) / 2

        tensors = [jax.lax.fori_loop(0, 40, body, values)]
        group = step_outputs.Group("loss", metadata.SOURCE_OUTPUT, ["l0"], [0], tensors)
        layout, arrays = step_outputs.hand_out(step, jnp.asarray(True), [group])
        layouts.append(layout)
        return arrays

    layouts = []
    values = jnp.eye(600, dtype=jnp.float32)
    jax.block_until_ready(slow_step(jnp.int32(0), values))  # compiled
    running = 0
    for step in range(1, 6):
        arrays = slow_step(jnp.int32(step), values)
        in_put[0] = True
        handed.put(layouts[-1], arrays)
        in_put[0] = False
        running += not arrays[1].is_ready()
    handed.wait()
    handed.close()
    assert taken == [1, 2, 3, 4, 5]
    assert running > 0, "every step was done before its put: nothing was checked"
    assert all(ready for during_put, ready in reads if during_put)
    assert len(reads) == 5 + 5 * 4  # each flag, then each written step's number, flag, stats and counts
