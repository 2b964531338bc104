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
