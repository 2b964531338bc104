"""Statistics: the histogram and statistics of a tensor, in TensorFlow's own ops.

`reductions` defines the numbers every record holds (docs/FORMAT.md): the
reference the fused C++ kernel (`tb_layergrad.kernel`) is tested against, and
what computes them where the kernel is not used (float64 and integer data, XLA,
GPUs, machines without a compiler). `across_replicas` computes the same records
of a batch split over replicas, moving only statistics between them.
"""
