"""Statistics: the numbers every record holds, in TensorFlow's own ops (docs/FORMAT.md): the reference the fused
C++ kernel is tested against, and what computes them where the kernel is not used.
"""
