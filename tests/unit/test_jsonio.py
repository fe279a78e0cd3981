"""Strict JSON (grpolab.jsonio): non-finite floats are written as null and counted, duplicate keys and
NaN are refused on reading."""

from __future__ import annotations

import json
import math

import pytest

from grpolab import jsonio


def _strict(text: str):
    """json.loads that fails on NaN / Infinity, as jq and JavaScript do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))


def test_dumps_writes_null_for_every_non_finite_float_and_counts_them():
    row = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": 2, "e": "x"}
    assert jsonio.finite(row) == ({"a": None, "b": [1.0, None, {"c": None}], "d": 2, "e": "x"}, 3)
    assert _strict(jsonio.dumps_row(row)) == {"a": None, "b": [1.0, None, {"c": None}], "d": 2, "e": "x",
                                              "nonfinite_count": 3}
    assert "nonfinite_count" not in _strict(jsonio.dumps_row({"a": 1.5}))


def test_loads_strict_refuses_duplicate_keys_and_nan():
    with pytest.raises(jsonio.DuplicateKey, match="key 'a' is given twice"):
        jsonio.loads_strict('{"a": 1, "b": {"a": 2}, "a": 3}')
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        jsonio.loads_strict('{"a": NaN}')
    assert math.isnan(jsonio.loads_strict('{"a": NaN}', allow_nan=True)["a"])
