"""Reads through a data provider: an answer refused for its size is split, not lost (reader/series.py)."""

from __future__ import annotations

import types

import pytest

from tb_layergrad.reader import series


class Refused(Exception):
    """What gRPC raises when the Rust data server's answer is over the client's limit."""

    def code(self):
        return types.SimpleNamespace(name="RESOURCE_EXHAUSTED")


class Provider:
    """Answers at most `limit` tags per call, as a size limit would; records every call."""

    def __init__(self, limit: int, error: Exception = None):
        self.limit, self.error, self.calls = limit, error, []

    def read_tensors(self, ctx, *, experiment_id, plugin_name, downsample, run_tag_filter):
        tags = sorted(run_tag_filter.tags)
        self.calls.append(tags)
        if len(tags) > self.limit:
            raise self.error or Refused("Received message larger than max")
        return {"r": {t: [f"{t}-records"] for t in tags}}


def test_a_call_refused_as_too_large_is_split_until_it_fits():
    p = Provider(limit=2)
    got = series.read(p, None, "", "r", list("abcde"), alone=["z"])
    assert got == {t: [f"{t}-records"] for t in "abcdez"}
    # refused, then halves until each fits; a version-2 block ("z") in a call of its own
    assert p.calls == [list("abcde"), list("ab"), list("cde"), list("c"), list("de"), ["z"]]


def test_other_errors_and_a_single_tag_too_large_are_raised():
    with pytest.raises(ValueError):
        series.read(Provider(limit=0, error=ValueError("no such run")), None, "", "r", ["a", "b"])
    with pytest.raises(Refused):
        series.read(Provider(limit=0), None, "", "r", ["a"])
