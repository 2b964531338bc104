"""`metadata.parse_plugin_content`: round trip, memoized, and errors never cached as answers."""

from __future__ import annotations

import json

import pytest

from tb_layergrad import metadata


def content(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_round_trip_and_one_shared_answer_per_content():
    info = metadata.SeriesInfo(layer="net/dense", kind=metadata.KIND_STATS, index=3, dtype="float32")
    raw = info.to_content()
    assert metadata.parse_plugin_content(raw) == info
    # Memoized by the bytes: equal content (as bytes or bytearray) gives the same frozen object.
    assert metadata.parse_plugin_content(bytes(bytearray(raw))) is metadata.parse_plugin_content(bytearray(raw))


def test_unknown_fields_are_ignored_and_missing_ones_defaulted():
    got = metadata.parse_plugin_content(content(version=1, layer="a", kind="histogram", future_field=[1, 2]))
    assert (got.layer, got.kind, got.target, got.source, got.index) == (
        "a",
        "histogram",
        metadata.DEFAULT_TARGET,
        "output",
        -1,
    )


@pytest.mark.parametrize(
    "raw, error",
    [
        (b"\xff", ValueError),
        (b"[1]", ValueError),
        (content(layer="a", kind="stats"), ValueError),  # no version
        (content(version=metadata.FORMAT_VERSION + 1, layer="a", kind="stats"), metadata.UnsupportedFormatError),
        (content(version=1, kind="stats"), ValueError),  # no layer
        (content(version=1, layer="a", kind="pie"), ValueError),
        ("text", TypeError),
    ],
)
def test_bad_content_raises_every_time(raw, error):
    for _ in range(2):  # the second call is not answered from the memo
        with pytest.raises(error):
            metadata.parse_plugin_content(raw)
    assert metadata.try_parse_plugin_content(raw) is None


def test_the_kernels_statistic_positions_are_stat_fields():
    """records_core.h names each position of a stats record; they must be metadata.STAT_FIELDS, in order."""
    import re
    from pathlib import Path

    import tb_layergrad

    header = (Path(tb_layergrad.__file__).parent / "kernel" / "src" / "records_core.h").read_text()
    enum = re.search(r"enum Stat : int \{(.*?)\};", header, re.S).group(1)
    names = [name.strip() for name in enum.split(",")]
    assert all(re.fullmatch(r"k[A-Za-z]+", name) for name in names), names  # no explicit values: positions count
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", name[1:]).lower() for name in names]
    assert snake == list(metadata.STAT_FIELDS) + ["num_stats"]


def test_stat_values_are_placed_by_name():
    values = {name: float(i) * 10 for i, name in enumerate(reversed(metadata.STAT_FIELDS))}
    assert metadata.stat_values(**values) == [values[f] for f in metadata.STAT_FIELDS]
    with pytest.raises(ValueError, match="missing \\['no_gradient'\\]"):
        metadata.stat_values(**{k: v for k, v in values.items() if k != "no_gradient"})
    with pytest.raises(ValueError, match="unknown \\['median'\\]"):
        metadata.stat_values(**values, median=1.0)
