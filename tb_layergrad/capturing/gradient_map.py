"""The result of `Capture.gradients`: gradients keyed by stable path.

It is a read-only mapping (path -> tensor or None) that also remembers what
the summary ops need to tag each entry (whether it is a layer output or a
weight, the layer's position in the model, the target's name), and the
gradients of `model.trainable_variables` in order, so a training loop can
apply them without a second backward pass. It also carries the forward side
of the same pass: the target's value and, with `capture(activations=True)`,
the layer outputs themselves, so that one object says where a NaN was born
(`nonfinite_origin`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.capturing.read_only_map import ReadOnlyMap


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of a pass and what its records are tagged with.

    `value` is a gradient for sources "output" and "weight" (None when the target does not depend on the
    tensor) and the forward value itself for source "activation".
    """

    value: Any  # tf.Tensor, or None
    source: str  # metadata.SOURCE_OUTPUT, SOURCE_WEIGHT or SOURCE_ACTIVATION
    index: int  # position in the model (pre-order), -1 if unknown
    elements: int = -1  # static element count when known (for "no gradient" records)
    dtype: str = ""


class GradientMap(ReadOnlyMap):
    """path -> d target / d tensor (None where the target does not depend on it).

    It behaves as a read-only dict (`ReadOnlyMap`) and implements tf.nest's
    `__tf_flatten__`/`__tf_unflatten__`, so it can be returned from a
    `tf.function` with what it carries. `Capture.gradients` builds it; build
    one yourself only to write gradients you computed another way.

    Args:
      entries: path -> `Entry` (the gradient and what its records are tagged with), in model order.
      target: the name of the differentiated scalar ("loss").
      variable_gradients: the gradients of `model.trainable_variables`, in that order.
      replicas: how many replicas' gradients it covers (`tb_layergrad.distribute.merge`).
      activations: path -> `Entry` of the layer outputs (forward values) of the same pass.
      target_value: the differentiated scalar's value.
      per_example: each example's own gradient norms of the same pass (a `PerExampleNorms`).

    Raises:
      KeyError: an unknown path (`grads["no/such/layer"]`).

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="out")], name="m")
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = tf.reduce_sum(model(tf.ones([3, 4])))
    grads = cap.gradients(tape, loss)
    print(grads.target, list(grads), grads["m/out"].shape)
    ```
    """

    def __init__(
        self,
        entries: Dict[str, Entry],
        target: str,
        variable_gradients: Optional[List[Any]] = None,
        replicas: int = 1,
        activations: Optional[Dict[str, Entry]] = None,
        target_value: Any = None,
        per_example: Any = None,
    ):
        self._entries = dict(entries)
        self._activations = dict(activations or {})
        self.target = target
        #: The value of the target that was differentiated (a scalar tensor), or None when unknown.
        self.target_value = target_value
        #: How many replicas' gradients this map covers (>1 after `tb_layergrad.distribute.merge`).
        self.replicas = int(replicas)
        #: Gradients of `model.trainable_variables`, in that order (None where unconnected).
        self.variable_gradients: List[Any] = list(variable_gradients or [])
        #: Each example's own gradient norms from the same backward pass (a `PerExampleNorms`), when
        #: captured with `per_example=True`; else None.
        self.per_example = per_example

    def __getitem__(self, path: str) -> Any:
        return self._entries[path].value

    def _paths(self) -> Dict[str, Entry]:
        return self._entries

    def entry(self, path: str) -> Entry:
        return self._entries[path]

    @property
    def outputs(self) -> Dict[str, Any]:
        """Only the layer-output gradients."""
        return {p: e.value for p, e in self._entries.items() if e.source == metadata.SOURCE_OUTPUT}

    @property
    def weights(self) -> Dict[str, Any]:
        """Only the weight gradients (present when capture(..., weights=True))."""
        return {p: e.value for p, e in self._entries.items() if e.source == metadata.SOURCE_WEIGHT}

    @property
    def activations(self) -> Dict[str, Any]:
        """The layer outputs (forward values) of the same pass, when captured with `activations=True`; else empty."""
        return {p: e.value for p, e in self._activations.items()}

    def activation_entry(self, path: str) -> Entry:
        return self._activations[path]

    def with_entries(self, entries: Dict[str, Entry]) -> "GradientMap":
        """The same pass (target, activations, target value, replicas) with other gradient entries, e.g. a subset."""
        return GradientMap(
            entries,
            self.target,
            self.variable_gradients,
            self.replicas,
            self._activations,
            self.target_value,
            self.per_example,
        )

    def nonfinite_origin(self, step: Optional[int] = None) -> Optional[nonfinite_origin.Origin]:
        """Where a NaN/Inf of this pass was born (forward, loss or backward), or None if everything is finite.

        Eager only (it reads the tensors): in a `tf.function`, return the map and
        call this outside. The rules are `tb_layergrad.nonfinite_origin`'s, the
        same the tab and `GradientLogger(on_nonfinite=...)` apply.
        """

        def seen(entries: Dict[str, Entry]) -> List[nonfinite_origin.Seen]:
            return [
                nonfinite_origin.Seen(p, e.index, _nonfinite(e.value))
                for p, e in entries.items()
                if e.value is not None
            ]

        by_source = {
            src: {p: e for p, e in self._entries.items() if e.source == src} for src in metadata.GRADIENT_SOURCES
        }
        return nonfinite_origin.locate(
            step,
            target=self.target,
            target_nonfinite=None if self.target_value is None else _nonfinite(self.target_value),
            activations=seen(self._activations) if self._activations else None,
            outputs=seen(by_source[metadata.SOURCE_OUTPUT]),
            weights=seen(by_source[metadata.SOURCE_WEIGHT]),
        )

    # tf.nest protocol: lets a GradientMap be returned from a tf.function.
    def __tf_flatten__(self):
        keys = tuple((path, dataclasses.replace(e, value=None)) for path, e in self._entries.items())
        acts = tuple((path, dataclasses.replace(e, value=None)) for path, e in self._activations.items())
        has_value = self.target_value is not None
        has_per_example = self.per_example is not None
        meta = (self.target, keys, len(self.variable_gradients), self.replicas, acts, has_value, has_per_example)
        components = tuple(e.value for e in self._entries.values()) + tuple(self.variable_gradients)
        components += tuple(e.value for e in self._activations.values())
        components += (self.target_value,) if has_value else ()
        return meta, components + ((self.per_example,) if has_per_example else ())

    @classmethod
    def __tf_unflatten__(cls, meta, components):
        target, keys, n_vars, replicas, acts, has_value, has_per_example = meta
        n, m = len(keys), len(acts)
        entries = {path: dataclasses.replace(e, value=g) for (path, e), g in zip(keys, components[:n])}
        activations = {
            path: dataclasses.replace(e, value=a) for (path, e), a in zip(acts, components[n + n_vars : n + n_vars + m])
        }
        value = components[n + n_vars + m] if has_value else None
        per_example = components[-1] if has_per_example else None
        return cls(entries, target, list(components[n : n + n_vars]), replicas, activations, value, per_example)

    def __repr__(self) -> str:
        return f"GradientMap(target={self.target!r}, paths={list(self._entries)!r})"


def _nonfinite(tensor: Any) -> bool:
    if not hasattr(tensor, "numpy"):
        raise RuntimeError(
            "nonfinite_origin() reads the tensors: call it eagerly (return the GradientMap from your tf.function "
            "and call it outside)"
        )
    return not bool(np.all(np.isfinite(np.asarray(tensor.numpy(), dtype=np.float64))))
