"""Event-file bytes of a real `fit()` with `GradientLogger` at its defaults, by part and format version.

Trains a deep MLP (`layers` Dense layers) for `steps` steps with
`GradientLogger(logdir)` (every step, output gradients; `format_version` 1 or
2) and splits the event file's bytes into what they carry: framing (the
TFRecord frame, the Event and Summary wrappers, tags, dtypes and shapes),
summary metadata, and the stats, histogram and other tensor payloads.

    python bench/format_bytes.py OUT --layers 100 --steps 4000 --format-version 2
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from typing import Dict

import numpy as np

PARTS = ("framing", "metadata", "stats", "histogram", "other")
# A TFRecord frame around each Event: length (8), its CRC (4), the data's CRC (4).
_FRAME = 16


def write_fit_logdir(logdir: str, layers: int = 100, steps: int = 4000, width: int = 32) -> float:
    """Train `layers` Dense layers for `steps` steps with GradientLogger's defaults; returns the seconds taken."""
    import keras

    import tb_layergrad

    keras.utils.set_random_seed(0)
    stack = [keras.Input((width,))] + [
        keras.layers.Dense(width, activation="relu", name=f"dense_{i}") for i in range(layers - 1)
    ]
    model = keras.Sequential(stack + [keras.layers.Dense(1, name="out")], name="deep_mlp")
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    batch = 32
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, width)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    start = time.perf_counter()
    logger = tb_layergrad.GradientLogger(logdir)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[logger])
    return time.perf_counter() - start


def bytes_by_part(logdir: str) -> Dict[str, int]:
    """Bytes of every layergrad record under `logdir`, split into PARTS (other events count as framing)."""
    from tensorboard.backend.event_processing import event_file_loader

    from tb_layergrad import metadata

    out = dict.fromkeys(PARTS, 0)
    for path in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
        for event in event_file_loader.EventFileLoader(path).Load():
            total = len(event.SerializeToString()) + _FRAME
            payload = 0
            for value in event.summary.value:
                meta = len(value.metadata.SerializeToString()) if value.HasField("metadata") else 0
                content = len(value.tensor.tensor_content)
                kind = _kind(value, metadata)
                out["metadata"] += meta
                out[kind if kind in ("stats", "histogram") else "other"] += content
                payload += meta + content
            out["framing"] += total - payload
    return out


_KINDS: Dict[str, str] = {}


def _kind(value, metadata) -> str:
    """The record's kind, from the tag's metadata (remembered: a version-2 record after the first has none)."""
    if value.HasField("metadata") and value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
        info = metadata.try_parse_plugin_content(value.metadata.plugin_data.content)
        if info is not None:
            _KINDS[value.tag] = info.kind
    return _KINDS.get(value.tag, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--format-version", type=int, default=2, choices=(1, 2))
    args = parser.parse_args()
    seconds = write_fit_logdir(args.out, args.layers, args.steps, args.format_version)
    parts = bytes_by_part(args.out)
    per = args.layers * args.steps
    print(
        f"{seconds:.0f} s; bytes / layer / step: total {sum(parts.values()) / per:.0f}, "
        + ", ".join(f"{k} {v / per:.1f}" for k, v in parts.items())
    )


if __name__ == "__main__":
    main()
