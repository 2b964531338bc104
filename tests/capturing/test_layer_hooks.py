"""Layer hooks are per thread: MirroredStrategy's replica threads hook the same layers, each seeing its own calls."""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from tb_layergrad.capturing.layer_hooks import ClassCallHook, hook, layer_base_class, unhook


def test_two_threads_each_see_their_own_hook_and_the_layer_is_restored_whatever_the_order():
    layer = tf.keras.layers.Dense(2, kernel_initializer="ones")
    x = tf.ones([1, 3])
    layer(x)
    seen = {"a": 0, "b": 0}
    a_hooked, b_hooked, a_unhooked = threading.Event(), threading.Event(), threading.Event()
    results = {}

    def wrapper(name):
        original = layer.call  # what a hook reads before it is set: the class's, or the dispatcher

        def call(*args, **kwargs):
            seen[name] += 1
            return original(*args, **kwargs)

        return call

    def thread_a():
        installed = hook(layer, "call", wrapper("a"))
        a_hooked.set()
        b_hooked.wait(10)
        results["a"] = layer(x).numpy()  # B's hook is set too: A's call goes through A's only
        unhook(installed)  # first: B's hook stays
        a_unhooked.set()

    def thread_b():
        a_hooked.wait(10)
        installed = hook(layer, "call", wrapper("b"))
        b_hooked.set()
        a_unhooked.wait(10)
        results["b"] = layer(x).numpy()
        unhook(installed)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {"a": 1, "b": 1}
    np.testing.assert_array_equal(results["a"], np.full([1, 2], 3.0))
    np.testing.assert_array_equal(results["b"], results["a"])
    assert "call" not in layer.__dict__  # the class's own call again
    layer(x)
    assert seen == {"a": 1, "b": 1}


def test_hooks_of_one_thread_nest():
    layer = tf.keras.layers.Dense(1)
    order = []

    def make(name, original):
        def call(*args, **kwargs):
            order.append(name)
            return original(*args, **kwargs)

        return call

    inner = hook(layer, "call", make("inner", layer.call))
    outer = hook(layer, "call", make("outer", layer.call))
    layer(tf.ones([1, 2]))
    assert order == ["outer", "inner"]
    unhook(outer)
    unhook(inner)
    assert "call" not in layer.__dict__


def test_class_call_hooks_are_per_thread_and_the_class_is_restored_whatever_the_order():
    # Eagerly, Capture hooks Keras' Layer.__call__ (layers the step constructs): one thread's hook never sees
    # another's calls, and the class gets its own __call__ back when the last hook goes, in whatever order.
    layer = tf.keras.layers.Dense(2)
    base = layer_base_class(layer)
    original = base.__dict__["__call__"]
    seen = {"main": []}
    first = ClassCallHook(base, lambda called: seen["main"].append(called))
    second = ClassCallHook(base, lambda called: seen["main"].append(called))
    worker = threading.Thread(target=lambda: layer(tf.ones([1, 3])))
    worker.start()
    worker.join()
    assert seen["main"] == []  # the other thread's call
    layer(tf.ones([1, 3]))
    assert seen["main"] == [layer, layer]  # each hook of this thread, once
    first.remove()
    layer(tf.ones([1, 3]))
    assert seen["main"] == [layer] * 3
    second.remove()
    assert base.__dict__["__call__"] is original
