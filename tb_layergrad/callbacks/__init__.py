"""Keras callbacks: `GradientLogger` logs layer-output gradients from the real fit() step."""
from tb_layergrad.callbacks.gradient_logger import GradientLogger

__all__ = ["GradientLogger"]
