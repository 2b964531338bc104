"""Keras: `GradientLogger`, the callback that logs the gradients of the real `model.fit()` step."""
