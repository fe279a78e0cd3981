"""The one way grpolab writes and reads JSON: never a bare NaN or Infinity out, never a duplicate key in.

Python's json writes ``NaN`` and ``Infinity`` by default, which is not JSON: jq, JavaScript and most
readers refuse the file. ``dumps`` replaces every non-finite float by ``null`` and says how many it
replaced (a row of metrics.jsonl gets ``"nonfinite_count": n``, see ``dumps_row``); ``allow_nan=False``
then guards the rest, so a non-finite value that slipped through raises instead of being written.

``loads_strict`` reads a document whose objects may not repeat a key (Python's json keeps the last
value silently) and, unless told otherwise, whose numbers are finite (``NaN`` / ``Infinity`` are not JSON).

This module imports only the standard library (eval/results.py and the CLI use it without torch).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NONFINITE_KEY = "nonfinite_count"
"""Added to a row whose non-finite values were written as null: how many there were."""


def finite(value: Any) -> tuple[Any, int]:
    """(``value`` with every non-finite float, at any depth, replaced by None; how many were replaced)."""
    if isinstance(value, float):
        return (value, 0) if math.isfinite(value) else (None, 1)
    if isinstance(value, Mapping):
        out, count = {}, 0
        for k, v in value.items():
            out[k], n = finite(v)
            count += n
        return out, count
    if isinstance(value, list | tuple):
        items = [finite(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    return value, 0


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON text of ``value`` with non-finite floats as null (allow_nan=False guards what is left)."""
    clean, _ = finite(value)
    return json.dumps(clean, allow_nan=False, **kwargs)


def dumps_row(row: Mapping[str, Any], **kwargs: Any) -> str:
    """One JSONL row: non-finite floats as null, and ``"nonfinite_count": n`` when there were any."""
    clean, count = finite(row)
    if count:
        clean[NONFINITE_KEY] = count
    return json.dumps(clean, allow_nan=False, **kwargs)


class DuplicateKey(ValueError):
    """A JSON object gives one key twice."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {key!r} is given twice in one object (JSON readers keep either one)")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; write null, or a finite number")


def loads_strict(text: str | bytes, *, allow_nan: bool = False) -> Any:
    """json.loads that refuses a repeated key, and NaN / Infinity unless ``allow_nan`` (a data row's own
    checks then name the field). Both refusals are ValueError subclasses."""
    if allow_nan:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def write_whole(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that it is whole or not there: a temporary file beside it, flushed to
    disk, renamed into place. A kill (SIGKILL included) or a crash mid-write leaves the previous file, if
    any, and at most a ``.tmp`` file beside it; a report or eval.json is never half-written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
