"""Query-string validation: every malformed value becomes a 400, never a 500.

Strict on purpose: integers are plain decimal digits only, so `1e3`, `-1`,
`0x10`, ` 5` or `5.0` are rejected with a message instead of being guessed at.
Unknown parameters are ignored (cache busters), but a known one given twice is
an error: silently taking the first or the last would hide a client bug.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from tensorboard import errors
from werkzeug.datastructures import MultiDict

from tb_layergrad import metadata
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.series import ALL_STATS, DEFAULT_STAT

MAX_STEP = 2**63 - 1
MAX_STEPS_LIMIT = 10**7
MAX_COMPARE_RUNS = 200  # a sweep's runs in one request (docs/HTTP_API.md)
MAX_POINTS = 10**5
_DIGITS = re.compile(r"[0-9]+")
_WEIGHT = re.compile(r"0|0?\.[0-9]{1,6}")
MAX_SMOOTHING = 0.999  # the tab's slider's (TensorBoard's) largest weight


def _bad(message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(message)


def single(args: MultiDict, name: str) -> Optional[str]:
    """The one value of `name`, None if absent; 400 if repeated."""
    values = args.getlist(name)
    if len(values) > 1:
        raise _bad(f"parameter {name!r} given {len(values)} times; give it once")
    return values[0] if values else None


def required_name(args: MultiDict, name: str) -> str:
    """A run/layer name: present and non-empty (existence is checked later: 404)."""
    value = single(args, name)
    if value is None or value == "":
        raise _bad(f"parameter {name!r} is required")
    return value


def optional_name(args: MultiDict, name: str, default: Optional[str]) -> Optional[str]:
    value = single(args, name)
    if value is None:
        return default
    if value == "":
        raise _bad(f"parameter {name!r} must not be empty")
    return value


def target(args: MultiDict) -> str:
    value = optional_name(args, "target", metadata.DEFAULT_TARGET)
    assert value is not None
    return value


def source(args: MultiDict) -> str:
    value = single(args, "source")
    if value is None:
        return metadata.SOURCE_OUTPUT
    if value not in metadata.SOURCES:
        raise _bad(f"source {quote(value)} is not one of {list(metadata.SOURCES)}")
    return value


def stat(args: MultiDict) -> str:
    value = single(args, "stat")
    if value is None:
        return DEFAULT_STAT
    if value not in ALL_STATS:
        raise _bad(f"stat {quote(value)} is not one of {list(ALL_STATS)}")
    return value


def integer(args: MultiDict, name: str, lo: int, hi: int) -> Optional[int]:
    """A decimal integer in [lo, hi], None if absent."""
    value = single(args, name)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        raise _bad(f"parameter {name!r} must be a non-negative decimal integer, got {quote(value)}")
    # Length first: int() of a 5,000-digit string raises ValueError in Python >= 3.11.
    number = int(value) if len(value) <= 19 else None
    if number is None or not lo <= number <= hi:
        shown = number if number is not None else quote(value)
        raise _bad(f"parameter {name!r} must be in [{lo}, {hi}], got {shown}")
    return number


def step(args: MultiDict, name: str = "step") -> Optional[int]:
    return integer(args, name, 0, MAX_STEP)


def step_range(args: MultiDict, first: str = "start", last: str = "end") -> Tuple[Optional[int], Optional[int]]:
    start, end = step(args, first), step(args, last)
    if start is not None and end is not None and start > end:
        raise _bad(f"{first} ({start}) is after {last} ({end})")
    return start, end


def series_range(args: MultiDict) -> Tuple[str, str, Optional[int], Optional[int]]:
    """(target, source, start, end), checked in that order: which series of a run a route reads, over which steps."""
    return (target(args), source(args), *step_range(args))


def max_steps(args: MultiDict) -> Optional[int]:
    return integer(args, "max_steps", 1, MAX_STEPS_LIMIT)


def points(args: MultiDict) -> Optional[int]:
    """`points`: the pixels a chart has for the range; more steps than this are binned (plugin/binned.py)."""
    return integer(args, "points", 1, MAX_POINTS)


def smoothing(args: MultiDict, default: float) -> float:
    """`smoothing`: an averaging weight in [0, 0.999], written `0`, `0.6` or `.6` (at most 6 decimals)."""
    value = single(args, "smoothing")
    if value is None:
        return default
    if not _WEIGHT.fullmatch(value) or float(value) > MAX_SMOOTHING:
        raise _bad(f"parameter 'smoothing' must be a decimal in [0, {MAX_SMOOTHING}], got {quote(value)}")
    return float(value)


def layers(args: MultiDict, runs: List[str]) -> List[str]:
    """The `layer` of each of `runs`: one name for all, or one per run in their order (repeated)."""
    names = args.getlist("layer")
    if any(n == "" for n in names):
        raise _bad("parameter 'layer' must not be empty")
    if len(names) == 1:
        return names * len(runs)
    if len(names) != len(runs):
        raise _bad(f"parameter 'layer' must be given once, or once per run ({len(runs)}), got {len(names)}")
    return names


def runs(args: MultiDict) -> List[str]:
    """The repeated `run` of `compare`, `depth` and `noise_scale`: 1..MAX_COMPARE_RUNS distinct names, in order."""
    names: List[str] = []
    for value in args.getlist("run"):
        if value == "":
            raise _bad("parameter 'run' must not be empty")
        if value not in names:
            names.append(value)
    if not names:
        raise _bad("parameter 'run' is required (repeat it for each run)")
    if len(names) > MAX_COMPARE_RUNS:
        raise _bad(
            f"at most {MAX_COMPARE_RUNS} runs can be compared at once, got {len(names)}: ask for fewer runs per request"
        )
    return names
