"""Per-layer rules: a layer's per-example weight gradients as factors of its input and δ.

Why rules per layer: the gradient of a weight for ONE example is, for the common layers, a simple
function of what a single backward pass already has (the layer's input a and the gradient δ at its
pre-activation, or at its output): no per-example backward pass. `ghost_norm` turns the factors into
norms. A layer with trainable weights and no rule here is *unsupported*: its weights get no number
and a reason, never an approximation.

  Dense            kernel: Outer(a, δ) over every position (token) of the example; bias: Σ_t δ_t
  EinsumDense      `P C, C F -> P F` forms (e.g. `ab,bc->ac`, `abc,cd->abd`, `...d,de->...e`,
                   `abc,cde->abde`): kernel Outer(a[C], δ[F]) over the positions P; bias: δ summed
                   over the output axes the bias broadcasts along
  Conv1D/Conv2D    kernel: Outer(patches of a, δ) over the output positions for short patches, else
                   Blocks: one Outer per kernel offset (its input window, δ); bias: Σ over positions
                   of δ. groups > 1: unsupported
  Embedding        Lookup(ids, δ at the output): repeated ids in one example share one row; float ids
                   are truncated to int32 first, as the layer's own call does
  LayerNorm        gamma: Σ_t x̂_t ⊙ δ_t, beta: Σ_t δ_t, δ at the output, x̂ recomputed from the input
                   with the layer's axis and epsilon. rms_scaling: unsupported
  BatchNorm        in inference only (moving statistics: a per-example affine map), as LayerNorm with
                   x̂ = (x - moving_mean) / sqrt(moving_variance + epsilon). In training mode it couples
                   the examples: flagged by the caller, never computed (`couples_examples`).
                   renorm / virtual batches (tf_keras): unsupported

A rule applies only when the class whose `call` runs is the rule's own (a subclass that overrides
`call` may compute anything), when the layer is not quantized (a `quantization_mode` on the layer or its
dtype policy), and only to
the variables it names (`kernel`, `bias`, ...): LoRA's `lora_kernel_a/b`, or any other trainable
variable of the layer, are reported unsupported.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

import tensorflow as tf

from tb_layergrad.capturing.ghost_norm import Blocks, Factor, Lookup, Outer, Summed
from tb_layergrad.capturing.per_example_rules import Rule, Unsupported, einsum_split

# -- factors ---------------------------------------------------------------------------------


def _f32(t: Any) -> Any:
    t = tf.convert_to_tensor(t)
    return t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32)


def batch_count(t: Any) -> Any:
    """The example count of `t` [B, ...]: a Python int where the static shape has it, else a tensor.

    Why not always `tf.shape(t)[0]`: the norms are built in a branch function of their own, where those shape
    ops are not folded away and run at every written step, a few per path.
    """
    return t.shape[0] if t.shape.rank and t.shape[0] is not None else tf.shape(t)[0]


def _positions(t: Any, features: int) -> Any:
    """[B, ..., features] -> [B, positions, features]."""
    return tf.reshape(_f32(t), [batch_count(t), -1, features])


def _summed_to(delta: Any, shape: Sequence[int]) -> Summed:
    """δ summed, per example, over every axis a variable of `shape` is broadcast along (a bias)."""
    rank, m = delta.shape.rank, len(shape)
    lead = list(range(1, rank - m))
    ones = [rank - m + j for j, n in enumerate(shape) if n == 1 and delta.shape[rank - m + j] != 1]
    v = tf.reduce_sum(_f32(delta), axis=lead + ones) if lead + ones else _f32(delta)
    return Summed(tf.reshape(v, [batch_count(delta), 1, -1]))


def _dense(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    q = int(delta.shape[-1])
    p = int(inputs.shape[-1])
    d = _positions(delta, q)
    return {"kernel": Outer(_positions(inputs, p), d), "bias": Summed(d)}


def _einsum(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    _, contracted, free = einsum_split(layer.equation)
    p = math.prod(int(n) for n in inputs.shape[inputs.shape.rank - len(contracted) :])
    q = math.prod(int(n) for n in delta.shape[delta.shape.rank - len(free) :])
    out = {"kernel": Outer(_positions(inputs, p), _positions(delta, q))}
    bias = getattr(layer, "bias", None)
    if bias is not None:
        out["bias"] = _summed_to(delta, [int(n) for n in bias.shape])
    return out


def _conv(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    rank = len(layer.kernel_size)
    a, d = _f32(inputs), _f32(delta)
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        perm = [0] + list(range(2, rank + 2)) + [1]
        a, d = tf.transpose(a, perm), tf.transpose(d, perm)
    size, stride, rate = list(layer.kernel_size), list(layer.strides), list(layer.dilation_rate)
    if len(stride) == 1 and rank > 1:
        stride = stride * rank
    if len(rate) == 1 and rank > 1:
        rate = rate * rank
    padding = str(layer.padding).lower()
    if padding == "causal":  # Conv1D: left-pad by the receptive field, then a valid convolution
        a = tf.pad(a, [[0, 0], [rate[0] * (size[0] - 1), 0], [0, 0]])
        padding = "valid"
    if rank == 1:
        a, d = a[:, None], d[:, None]
        size, stride, rate = [1] + size, [1] + stride, [1] + rate
    elif rank != 2:
        raise Unsupported(f"{rank}-D convolution")
    q = int(d.shape[-1])
    dp = _positions(d, q)
    channels = int(a.shape[-1])
    length = size[0] * size[1] * channels
    if length <= PATCHES_BY_CONVOLUTION:
        patches = _patches(a, size, stride, rate, padding.upper())
        kernel = Outer(_positions(patches, length), dp)
    else:
        windows = _windows(a, d, size, stride, rate, padding.upper())
        kernel = Blocks(tuple(Outer(_positions(w, channels), dp) for w in windows))
    return {"kernel": kernel, "bias": Summed(dp)}


# Patch length up to which the patches are made by an identity-kernel convolution (one op; its cost grows with
# the length squared); above it the kernel gradient is taken by kernel offset (`_windows`, `ghost_norm.Blocks`).
PATCHES_BY_CONVOLUTION = 32


def _patches(a: Any, size: List[int], stride: List[int], rate: List[int], padding: str) -> Any:
    """[B, H', W', kh·kw·C]: each output position's input patch, as the convolution sees it (exact: each patch
    element is one input element, copied by a convolution whose kernel is the identity)."""
    channels = int(a.shape[-1])
    length = size[0] * size[1] * channels
    eye = tf.reshape(tf.eye(length, dtype=a.dtype), [size[0], size[1], channels, length])
    return tf.nn.conv2d(a, eye, strides=[1, *stride, 1], padding=padding, dilations=[1, *rate, 1])


def _windows(a: Any, d: Any, size: List[int], stride: List[int], rate: List[int], padding: str) -> List[Any]:
    """[B, H', W', C] per kernel offset (row-major): the input element that offset multiplies at each output
    position, zero where the convolution reads its padding. `d` ([B, H', W', q]) gives the output's size.

    Why not the patches: gathering them (`tf.image.extract_patches`) is memory-bound and slow, and they are
    k² times the input; a strided slice per offset, each multiplied with δ at once, does the same
    arithmetic as the patches' product without them (docs/PER_EXAMPLE.md, "Cost").
    """
    pads, outs = [[0, 0]], []
    for axis in (0, 1):
        n = a.shape[1 + axis] if a.shape[1 + axis] is not None else tf.shape(a)[1 + axis]
        out = d.shape[1 + axis] if d.shape[1 + axis] is not None else tf.shape(d)[1 + axis]
        reach = (size[axis] - 1) * rate[axis] + 1
        # TensorFlow's SAME: the total padding that centres the kernel, its smaller half before.
        total = (out - 1) * stride[axis] + reach - n if padding == "SAME" else 0
        total = max(total, 0) if isinstance(total, int) else tf.maximum(total, 0)
        pads.append([total // 2, total - total // 2])
        outs.append(out)
    padded = tf.pad(a, pads + [[0, 0]]) if padding == "SAME" else a
    windows = []
    for i in range(size[0]):
        for j in range(size[1]):
            top, left = i * rate[0], j * rate[1]
            windows.append(
                padded[
                    :,
                    top : top + (outs[0] - 1) * stride[0] + 1 : stride[0],
                    left : left + (outs[1] - 1) * stride[1] + 1 : stride[1],
                ]
            )
    return windows


def _embedding(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    ids = tf.convert_to_tensor(inputs)
    if not ids.dtype.is_integer:  # float ids (an Input without dtype): the layer truncates them to int32 to look up
        ids = tf.cast(ids, tf.int32)
    ids = tf.reshape(ids, [batch_count(ids), -1])
    return {"embeddings": Lookup(ids, _positions(delta, int(delta.shape[-1])))}


def _feature_axes(layer: Any, rank: int, on_batch_axis: str) -> List[int]:
    """The layer's `axis` (one or several) as sorted non-negative axes; the batch axis among them is unsupported."""
    axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    axes = sorted({int(ax) % rank for ax in axis})
    if 0 in axes:
        raise Unsupported(on_batch_axis)
    return axes


def _layer_norm(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    x = _f32(inputs)
    axes = _feature_axes(layer, x.shape.rank, "LayerNormalization over the batch axis couples examples")
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    return _scale_and_offset(x, (x - mean) * tf.math.rsqrt(var + float(layer.epsilon)), delta, axes)


def _scale_and_offset(x: Any, x_hat: Any, delta: Any, axes: List[int]) -> Dict[str, Factor]:
    """gamma: Σ over the other (non-batch) axes of x̂ ⊙ δ; beta: of δ. `axes`: the axes gamma spans."""
    rank = x.shape.rank
    others = [i for i in range(1, rank) if i not in axes]
    perm = [0] + others + axes
    k = math.prod(int(x.shape[i]) for i in axes)
    d = _f32(delta)

    def per_position(t: Any) -> Summed:
        moved = t if perm == list(range(rank)) else tf.transpose(t, perm)
        return Summed(tf.reshape(moved, [batch_count(t), -1, k]))

    return {"gamma": per_position(x_hat * d), "beta": per_position(d)}


def _batch_norm_inference(layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    x = _f32(inputs)
    rank = x.shape.rank
    axes = _feature_axes(layer, rank, "BatchNormalization whose feature axis is the batch axis")
    shape = [1] * rank
    for ax in axes:
        shape[ax] = int(x.shape[ax])
    mean = tf.reshape(tf.cast(layer.moving_mean, x.dtype), shape)
    var = tf.reshape(tf.cast(layer.moving_variance, x.dtype), shape)
    return _scale_and_offset(x, (x - mean) * tf.math.rsqrt(var + float(layer.epsilon)), delta, axes)


def factors(rule: Rule, layer: Any, inputs: Any, delta: Any) -> Dict[str, Factor]:
    """role -> factor of one call, from the call's first input and δ (see the module docstring)."""
    return _FACTORS[rule.name](layer, inputs, delta)


_FACTORS = {
    "Dense": _dense,
    "EinsumDense": _einsum,
    "Conv": _conv,
    "Embedding": _embedding,
    "LayerNormalization": _layer_norm,
    "BatchNormalization": _batch_norm_inference,
}
