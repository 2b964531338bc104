"""Gradients of the GLOBAL batch under `tf.distribute`, and who writes them (docs/DISTRIBUTED.md).

Modules:
  merge    -- the replicas' gradients merged into the global batch's (`merge`, `merge_in_replica`)
  workers  -- only the chief writes (`is_chief`, `create_file_writer`, `NonChiefWriter`)
"""

from tb_layergrad.distribute.merge import (
    Merged,
    holds_distributed_values,
    merge,
    merge_in_replica,
    merge_per_example,
    num_replicas,
    per_replica_map,
    replica_context,
)
from tb_layergrad.distribute.workers import NonChiefWriter, create_file_writer, is_chief

__all__ = [
    "Merged",
    "holds_distributed_values",
    "merge",
    "merge_in_replica",
    "merge_per_example",
    "num_replicas",
    "per_replica_map",
    "replica_context",
    "NonChiefWriter",
    "create_file_writer",
    "is_chief",
]
