"""JAX: `GradientLogger` for Keras 3's fit() on JAX, observed through the layers' outputs and the optimizer."""
