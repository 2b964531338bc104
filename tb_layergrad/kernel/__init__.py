"""The fused C++ kernel: one op computes (and can write) the records of all of a step's tensors.

`fused` builds, loads and calls it (TensorFlow); `host_records` runs its loops without TensorFlow, on host
arrays, for JAX's host callback; `cache` says where builds live and makes them, without TensorFlow.
"""
