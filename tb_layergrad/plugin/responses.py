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
import io
import json
import logging
import math
from typing import Any, Callable, Iterable, List, Optional, Sequence

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


def json_response(request: wrappers.Request, doc: dict, code: int = 200) -> wrappers.Response:
    """`doc` as strict JSON after `api_version`; its `RawJson` values are written last, as they are."""
    body = {"api_version": API_VERSION}
    body.update((key, value) for key, value in doc.items() if not isinstance(value, RawJson))
    text = dumps(body)
    raw = [(key, value) for key, value in doc.items() if isinstance(value, RawJson)]
    if raw:
        text = text[:-1] + "".join(f",{dumps(key)}:{value}" for key, value in raw) + "}"
    return http_util.Respond(request, text, JSON_TYPE, code=code)


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


def csv_number(value: float, integer: bool = False) -> str:
    """One CSV cell: shortest round-trip repr; nan/inf/-inf spelled as float() reads them."""
    value = float(value)
    if math.isnan(value):  # math, not numpy: a cell per statistic per step, numpy's per-call cost was most of it
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if integer and value == int(value):
        return str(int(value))
    return repr(value)


def csv_text(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """CSV with RFC 4180 quoting of cells that need it (names may hold commas)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()
