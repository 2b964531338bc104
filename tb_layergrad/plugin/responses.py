"""Response bodies: strict JSON, CSV, and JSON for every error.

Why not `http_util.Respond(request, dict, "application/json")`: TensorBoard's
JSON cleanser turns NaN/Infinity into the *strings* "NaN"/"Infinity", which a
chart would then have to special-case; this API promises `null` instead
(docs/HTTP_API.md). And TensorBoard's error middleware answers a PublicError
with a text/plain body, while the tab expects JSON errors; so every route is
wrapped by `json_errors`, which renders errors itself.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import logging
import math
from typing import Any, Callable, Iterable, List, Optional, Sequence, Union

import numpy as np
from tensorboard import errors
from tensorboard.backend import http_util
from werkzeug import wrappers

from tb_layergrad.reader.catalog import quote

logger = logging.getLogger(__name__)

API_VERSION = 1

JSON_TYPE = "application/json"
CSV_TYPE = "text/csv; charset=utf-8"


class MethodNotAllowedError(errors.PublicError):
    """Only GET and HEAD are served."""

    http_code = 405

    def __init__(self, method: str) -> None:
        super().__init__(f"Method not allowed: {quote(method)}; use GET")


def float_list(values: Iterable[float]) -> List[Optional[float]]:
    """A list of Python floats, with None for NaN and +-Inf."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


def count_list(values: Iterable[float]) -> List[Optional[int]]:
    """Counts stored as float64, sent as JSON integers (None if non-finite)."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    finite = np.isfinite(arr)
    out = np.where(finite, arr, 0).round().astype(np.int64).astype(object)
    out[~finite] = None
    return out.tolist()


def float_matrix(rows: np.ndarray) -> List[List[Optional[float]]]:
    """A 2-D float array as nested lists, None for NaN/Inf."""
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        arr = arr.reshape(arr.shape[0] if arr.ndim else 1, -1)
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


# 17 significant digits name every float64 exactly (DBL_DECIMAL_DIG): parsed, the same number as the
# shortest repr json.dumps writes, but a fixed format is much cheaper to write than the shortest one,
# and the matrix sends a million of them (docs/DESIGN.md, "Reading side").
_FLOAT = "%.17g"


@functools.lru_cache(maxsize=64)
def _finite_row_format(n: int) -> str:
    return ",".join([_FLOAT] * n)


def float_rows_json(rows: Iterable[np.ndarray]) -> str:
    """JSON text of a list of float rows, `null` for NaN/+-Inf: what `dumps([float_list(r) ...])`
    gives once parsed, for a `RawJson` value (integral values come as `1`, not `1.0`)."""
    parts = []
    for row in rows:
        arr = np.asarray(row, dtype=np.float64).reshape(-1)
        finite = np.isfinite(arr)
        if finite.all():
            fmt = _finite_row_format(arr.size)
        else:
            fmt = ",".join(np.where(finite, _FLOAT, "null").tolist())
        parts.append("[" + fmt % tuple(arr[finite].tolist()) + "]")
    return "[" + ",".join(parts) + "]"


def finite_or_none(value: float) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


def dumps(doc: Any) -> str:
    """Strict JSON: a NaN that slipped through is a bug, raised, not sent."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":"))


class RawJson(str):
    """A value that is JSON text already (`float_rows_json`): `json_response` writes it as it is."""


class EncodedBody:
    """A JSON body encoded once (`encode`), and gzipped once for the requests that accept it.

    Why: a body kept for a run's listing (`lookups.AnswerCache`) answers every reader of the run until the run
    changes, and encoding (and compressing, for a browser) a body of a few hundred KiB again for each of
    them was most of what those readers cost while a run is written."""

    __slots__ = ("data", "_gzipped")

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")
        self._gzipped: Optional[bytes] = None

    def gzipped(self) -> bytes:
        if self._gzipped is None:  # two threads may both compress it: the same bytes
            self._gzipped = gzip.compress(self.data, compresslevel=3, mtime=0)
        return self._gzipped


def encode(doc: dict) -> EncodedBody:
    """`doc` as strict JSON after `api_version`; its `RawJson` values are written last, as they are."""
    body = {"api_version": API_VERSION}
    body.update((key, value) for key, value in doc.items() if not isinstance(value, RawJson))
    text = dumps(body)
    raw = [(key, value) for key, value in doc.items() if isinstance(value, RawJson)]
    if raw:
        text = text[:-1] + "".join(f",{dumps(key)}:{value}" for key, value in raw) + "}"
    return EncodedBody(text)


def accepts_gzip(request: wrappers.Request) -> bool:
    """Whether the request's Accept-Encoding names gzip with a weight above 0 (RFC 9110)."""
    for part in request.headers.get("Accept-Encoding", "").split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() in ("gzip", "x-gzip"):
            weight = params.replace(" ", "").lower()
            return not (weight.startswith("q=0") and weight[3:].strip(".0") == "")
    return False


def json_response(request: wrappers.Request, doc: Union[dict, EncodedBody], code: int = 200) -> wrappers.Response:
    """`doc` (a dict, or a body `encode`d already) as strict JSON, gzipped where the request accepts it."""
    body = doc if isinstance(doc, EncodedBody) else encode(doc)
    if accepts_gzip(request):
        return http_util.Respond(request, body.gzipped(), JSON_TYPE, code=code, content_encoding="gzip")
    return http_util.Respond(request, body.data, JSON_TYPE, code=code)


def error_response(request: wrappers.Request, code: int, message: str) -> wrappers.Response:
    return json_response(request, {"error": message, "code": code}, code=code)


def csv_response(request: wrappers.Request, text: str, filename: str) -> wrappers.Response:
    headers = [("Content-Disposition", f'attachment; filename="{filename}"')]
    return http_util.Respond(request, text, CSV_TYPE, headers=headers)


Handler = Callable[[Any, wrappers.Request], wrappers.Response]


def json_errors(handler: Handler) -> Callable[[Any, dict, Callable], Iterable[bytes]]:
    """Turn a `(self, request) -> Response` method into a WSGI app with JSON errors.

    PublicErrors (400/404/405) become JSON with their code; anything else is a
    bug: logged with its traceback, answered as a JSON 500 without it.
    """

    @functools.wraps(handler)
    def app(self: Any, environ: dict, start_response: Callable) -> Iterable[bytes]:
        request = wrappers.Request(environ)
        try:
            if request.method not in ("GET", "HEAD"):
                raise MethodNotAllowedError(request.method)
            response = handler(self, request)
        except errors.PublicError as e:
            response = error_response(request, e.http_code, str(e))
        except Exception:  # noqa: BLE001 - last line of defence, logged
            logger.exception("layergrad: error serving %s", request.path)
            response = error_response(request, 500, "Internal error in the layergrad plugin; see the TensorBoard log")
        return response(environ, start_response)

    return app


def csv_cells(values: np.ndarray, integer: bool = False) -> List[str]:
    """A column of CSV cells: each value's shortest round-trip repr (nan, inf and -inf spelled as float() reads
    them), and for counts (`integer`) an integral value as an integer. A column at a time, not a call per cell:
    the export is a cell per statistic per step, and a Python call per cell was most of the route's work."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    cells = list(map(repr, arr.tolist()))  # repr of a Python float: the shortest that reads back the same
    if not integer:
        return cells
    whole = np.isfinite(arr) & (np.floor(arr) == arr)
    small = whole & (np.abs(arr) < 2.0**63)  # what int64 holds exactly; a larger whole count through int()
    if small.all():
        return list(map(str, arr.astype(np.int64).tolist()))
    for i, v in zip(np.flatnonzero(small).tolist(), arr[small].astype(np.int64).tolist()):
        cells[i] = str(v)
    for i in np.flatnonzero(whole & ~small).tolist():
        cells[i] = str(int(arr[i]))
    return cells


def csv_line(cells: Sequence[str]) -> str:
    """One CSV line without its end, RFC 4180 quoting the cells that need it (names may hold commas)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    return buf.getvalue()
