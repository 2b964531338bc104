"""Which layers have an exact per-example rule, and which calls couple the examples: backend-free.

Why apart from the rules' arithmetic (`per_example`, TensorFlow): the JAX room decides the same layers the
same way (the same `status` for the same model on either backend), and must not import TensorFlow. The
decision reads only classes, names and configuration, never a tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple


class Unsupported(Exception):
    """No exact per-example rule: the message says why (it reaches the user as the entry's reason)."""


def short_name(var: Any) -> str:
    return getattr(var, "name", "variable").split(":")[0].rsplit("/", 1)[-1]


def _class_names(layer: Any) -> List[str]:
    return [c.__name__ for c in type(layer).__mro__]


def _call_owner(layer: Any) -> str:
    """The name of the class whose `call` runs (the first in the MRO that defines one)."""
    for cls in type(layer).__mro__:
        if "call" in cls.__dict__:
            return cls.__name__
    return ""


def couples_examples(layer: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """Does this call mix examples (BatchNormalization with batch statistics)? A symbolic `training`
    counts as yes: while tracing we cannot know which branch will run."""
    if "BatchNormalization" not in " ".join(_class_names(layer)) or not getattr(layer, "trainable", True):
        return False
    training = kwargs.get("training", args[1] if len(args) > 1 else None)
    if training is None:
        return False
    if isinstance(training, (bool, int)):
        return bool(training)
    return True


@dataclasses.dataclass(frozen=True)
class Rule:
    """How to get one layer's per-example weight-gradient factors."""

    name: str
    classes: Tuple[str, ...]  # one of these must be in the MRO
    call_owners: Tuple[str, ...]  # the class that defines the running `call` must be one of these
    roles: Tuple[str, ...]  # the variables' short names this rule covers
    delta_at_preactivation: bool  # δ at the input of `activation` (else at the output)

    def applies_to(self, layer: Any) -> bool:
        names = _class_names(layer)
        return any(c in names for c in self.classes) and _call_owner(layer) in self.call_owners

    def check(self, layer: Any) -> None:
        """Raise Unsupported for a configuration this rule does not cover exactly."""
        # The attribute is the layer's on newer Keras, its dtype policy's on older ones: ask both.
        policy = getattr(layer, "dtype_policy", None)
        mode = getattr(layer, "quantization_mode", None) or getattr(policy, "quantization_mode", None)
        if mode:
            raise Unsupported(f"{type(layer).__name__} quantized ({mode}): its call differs")
        if self.name == "Conv" and int(getattr(layer, "groups", 1) or 1) != 1:
            raise Unsupported("grouped convolution (groups > 1)")
        if self.name == "LayerNormalization" and getattr(layer, "rms_scaling", False):
            raise Unsupported("LayerNormalization(rms_scaling=True)")
        if self.name == "EinsumDense":
            einsum_split(layer.equation)
        virtual = getattr(layer, "renorm", False) or getattr(layer, "virtual_batch_size", None)
        if self.name == "BatchNormalization" and virtual:
            raise Unsupported("BatchNormalization with renorm or virtual batches")


RULES = (
    Rule("Dense", ("Dense",), ("Dense",), ("kernel", "bias"), True),
    Rule("EinsumDense", ("EinsumDense",), ("EinsumDense",), ("kernel", "bias"), True),
    Rule("Conv", ("Conv1D", "Conv2D"), ("Conv1D", "Conv2D", "BaseConv", "Conv"), ("kernel", "bias"), True),
    Rule("Embedding", ("Embedding",), ("Embedding",), ("embeddings",), False),
    Rule("LayerNormalization", ("LayerNormalization",), ("LayerNormalization",), ("gamma", "beta"), False),
    Rule(
        "BatchNormalization",
        ("BatchNormalization",),
        ("BatchNormalization", "BatchNormalizationBase"),
        ("gamma", "beta"),
        False,
    ),
)


def rule_for(layer: Any) -> Tuple[Optional[Rule], Optional[str]]:
    """(rule, None), or (None, why not) for a layer with trainable weights and no exact rule."""
    for rule in RULES:
        if rule.applies_to(layer):
            try:
                rule.check(layer)
            except Unsupported as e:
                return None, str(e)
            return rule, None
    return None, f"no exact per-example rule for {type(layer).__name__}"


def einsum_split(equation: str) -> Tuple[str, str, str]:
    """(P, C, F) of `P C, C F -> P F`; raises Unsupported for another form."""
    try:
        lhs, out = equation.replace(" ", "").split("->")
        a, k = lhs.split(",")
    except ValueError:
        raise Unsupported(f"EinsumDense equation {equation!r} is not `input,kernel->output`") from None
    contracted = "".join(c for c in k if c in a and c not in out)
    free = "".join(c for c in k if c in out and c not in a)
    prefix = a[: len(a) - len(contracted)]
    if (
        "." in k
        or not contracted
        or a != prefix + contracted
        or k != contracted + free
        or out != prefix + free
        or not prefix
        or (prefix.startswith("...") is False and "." in prefix)
    ):
        raise Unsupported(f"EinsumDense equation {equation!r} is not of the form `P C, C F -> P F` (batch in P)")
    return prefix, contracted, free
