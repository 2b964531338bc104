"""Capturing: d(target)/d(layer output), layer outputs and weight gradients from one backward pass.

This `__init__` imports nothing: TensorFlow loads only when capturing is used.
"""
