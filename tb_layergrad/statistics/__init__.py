"""Statistics: the histogram and statistics of a tensor, in TensorFlow's own ops.

`reductions` defines the numbers every record holds (docs/FORMAT.md): the
reference the fused C++ kernel (`tb_layergrad.kernel`) is tested against, and
what computes them where the kernel is not used (float64 and integer data, XLA,
GPUs, machines without a compiler). `special_records`: the bounded raw tensor and
the "no gradient" records; `per_example_rows` and `noise_scale`: the per-example
records and the gradient noise scale.
"""
