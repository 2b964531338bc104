"""The fused C++ kernel: one op computes (and can write) the records of all of a step's tensors.

`fused` builds, loads and calls it (TensorFlow); `host_records` runs its loops without TensorFlow, inside JAX's
compiled step (an XLA FFI handler) and on host arrays; `cache` says where builds live and makes them, without
TensorFlow.
"""
