"""The verdict's decoder (sandbox/verdict.py): only plain values come back from the sandbox."""

from __future__ import annotations

import json

import pytest

from grpolab.sandbox.verdict import MAX_DEPTH, decode


@pytest.mark.parametrize(
    ("tree", "value"),
    [
        ([1, "a", None, True, 2.5], [1, "a", None, True, 2.5]),
        ({"tuple": [1, {"set": [2]}]}, (1, {2})),
        ({"dict": [[{"tuple": [1, 2]}, {"bytes": "6869"}]]}, {(1, 2): b"hi"}),
        ({"int": hex(10**100)}, 10**100),
        ({"complex": [1.0, -2.0]}, 1 - 2j),
        ({"set": [{"frozenset": [1]}]}, {frozenset({1})}),
    ],
)
def test_decode_plain_values(tree, value):
    assert decode(json.loads(json.dumps(tree))) == value


@pytest.mark.parametrize(
    "tree",
    [
        {"i": 0},  # an object is always one tag
        {"tuple": [1], "set": [2]},
        {"eval": "__import__('os')"},
        {"int": "f" * 100000},  # past the bound on ints
        {"float": "1e5"},  # only nan/inf/-inf are tagged
        {"dict": [[[1], 2]]},  # an unhashable key
        {"set": [[1]]},
        {"complex": ["a", 1]},
    ],
)
def test_decode_refuses_what_is_not_a_plain_value(tree):
    with pytest.raises((ValueError, TypeError)):
        decode(tree)


def test_decode_refuses_deep_nesting():
    tree: list = []
    for _ in range(MAX_DEPTH + 5):
        tree = [tree]
    with pytest.raises(ValueError, match="nested too deeply"):
        decode(tree)
