"""See a layer's pre-activation in the forward pass that runs anyway, without changing what it computes.

Why: the exact per-example weight-gradient norms of Dense/EinsumDense/Conv need δ, the gradient at the
pre-activation z (`output = activation(z)`); the layer exposes only its output. The observer stands
in for the layer's `activation` attribute (an instance attribute, like the `call` hook): it calls
the layer's own activation on the very tensor it is given and returns that result, so the forward
pass has the same ops on the same tensors (same bits); it only remembers z.

Nothing about a Keras version is assumed: `close()` hands z back only if, during that one call of
the layer, the activation ran exactly once and its result IS the layer's output (the same tensor
object). Any other shape of `call` (an activation applied twice, something after it, no activation
attribute used) yields None, and the caller reports the layer's weights as unsupported rather than
guessing.
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Tuple


class PreactivationObserver:
    """Callable that replaces `layer.activation` for the life of a capture; see the module docstring."""

    def __init__(self, activation: Any):
        self.activation = activation
        self._local = threading.local()  # MirroredStrategy runs replicas in threads

    def __call__(self, z: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.activation(z, *args, **kwargs)
        frame: Optional[List[Tuple[Any, Any]]] = getattr(self._local, "frame", None)
        if frame is not None:
            frame.append((z, out))
        return out

    def open(self) -> Any:
        """Start watching one call of the layer; returns what `close` restores (calls may nest)."""
        previous = getattr(self._local, "frame", None)
        self._local.frame = []
        return previous

    def close(self, previous: Any, layer_output: Any) -> Optional[Any]:
        """The pre-activation of the call just made, or None when it cannot be told apart for sure."""
        frame = self._local.frame
        self._local.frame = previous
        if len(frame) == 1 and frame[0][1] is layer_output:
            return frame[0][0]
        return None
