"""`tb-layergrad report --sort COLUMN`: one order for the CSV's rows, the JSON's runs and layers, the text's runs.

Why one order from the CSV: its header is the report's one flat list of names (a layer's statistics, its
verdict, and the run's `hp/<name>` hyperparameters), so a user picks a column they can see. The rows are
sorted; runs then come in the order of their first row, so `--sort -last_norm` puts the run with the
largest norm first and `--sort hp/learning_rate` orders runs by learning rate.

Rules: `COLUMN` ascending, `-COLUMN` descending; empty cells (no value, NaN) last either way; numbers and
booleans compare as numbers, before strings when a column holds both; ties keep model order (stable).
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple


def split_sort(text: str) -> Tuple[str, bool]:
    """'-last_norm' -> ('last_norm', True); 'hp/lr' -> ('hp/lr', False).

    Example:

        split_sort("-hp/learning_rate")  # ("hp/learning_rate", True)
    """
    if text.startswith("-"):
        return text[1:], True
    return text, False


def _empty(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, float) and not math.isfinite(v))


def _key(v: Any) -> Tuple[int, Any]:
    if isinstance(v, (bool, int, float)):
        return (0, float(v))
    return (1, str(v))


def order(rows: Sequence[Sequence[Any]], header: Sequence[str], sort: str) -> List[int]:
    """The indexes of `rows` in `sort`'s order (see the module's rules).

    Args:
      rows: cells, one list per row, in `header`'s order (values before formatting).
      header: the column names.
      sort: a column of `header`, with "-" before it for descending.

    Returns:
      A permutation of `range(len(rows))`.

    Raises:
      ValueError: `sort` names no column of `header` (the message lists them).

    Example:

        order([[1.0], [None], [3.0]], ["x"], "-x")  # [2, 0, 1]
    """
    column, descending = split_sort(sort)
    if column not in header:
        raise ValueError(f"unknown --sort column {column!r}; use one of: {', '.join(header)}")
    j = list(header).index(column)
    present = [i for i, row in enumerate(rows) if not _empty(row[j])]
    present.sort(key=lambda i: _key(rows[i][j]), reverse=descending)
    return present + [i for i, row in enumerate(rows) if _empty(row[j])]
