"""Gradients of the GLOBAL batch under `tf.distribute`, and who writes them (docs/DISTRIBUTED.md)."""

from tb_layergrad.distribute.merge import merge
from tb_layergrad.distribute.workers import create_file_writer, is_chief

# Public: what a custom loop under a strategy calls (docs/DISTRIBUTED.md). The package's own writers import the
# rest from the modules above.
__all__ = ["create_file_writer", "is_chief", "merge"]
