"""Event files written without TensorFlow: the same format-v2 records (docs/FORMAT.md), off the training thread."""
