"""The fused C++ kernel: one op computes (and can write) the records of all of a step's tensors.

`fused` builds, loads and calls it (TensorFlow); `cache` says where builds live, without TensorFlow.
"""
