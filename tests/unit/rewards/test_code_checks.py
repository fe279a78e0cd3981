"""Assert tests split into probes (run in the sandbox) and a verdict evaluated here (code_checks, code_verdict)."""

from __future__ import annotations

import json
import time

import pytest

from grpolab.sandbox.checks import RAISED, split_test
from grpolab.sandbox.verdict import MAX_DEPTH, decode


@pytest.mark.parametrize(
    ("test", "probes"),
    [
        ("assert add(1, 2) == 3", ["add(1, 2)"]),
        ("assert 3 == add(1, 2)", ["add(1, 2)"]),
        # the three: the expected value and the arithmetic stay here
        ("assert abs(add(1, 2) - 5) < 1e-9", ["add(1, 2)"]),
        ("assert f(x) - 5 == 0", ["f(x)"]),
        ("assert math.isclose(f(1), 5) == True", ["f(1)"]),
        ("import math\nassert math.isclose(area(1), 3.14159, rel_tol=1e-3)", ["area(1)"]),
        ("assert Solution().two_sum([2, 7], 9) == [0, 1]", ["Solution().two_sum([2, 7], 9)"]),
        ("assert f(1)[0] == 2", ["f(1)"]),  # a subscript is taken here
        ("assert sorted(f(1)) == [1, 2] and g() is None", ["f(1)", "g()"]),
        ("assert 0 < f() < 3", ["f()"]),
        ("assert f() == g()", ["f()", "g()"]),
        ("assert True", []),
        # comprehensions over iterables known here are unrolled: each call is a probe
        ("assert 7 in [p for p in range(10) if is_prime(p)]", [f"is_prime({p})" for p in range(10)]),
        ("assert all(f(i) == 2 * i for i in range(3))", ["f(0)", "f(1)", "f(2)"]),
        ("assert {k: f(k) for k in 'ab'} == {'a': 1}", ["f('a')", "f('b')"]),
        ("assert [g(i, j) for i in range(3) for j in range(i)]", ["g(1, 0)", "g(2, 0)", "g(2, 1)"]),
        ("assert f(1) == 1, 'msg'\nassert g() == {'a': [1]}", ["f(1)", "g()"]),
    ],
)
def test_only_the_calls_under_test_are_probes(test, probes):
    assert list(split_test(test, 0).probes) == probes


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("assert all(f(i) for i in g())", "must not call the code"),
        ("assert [f(x) for x in range(2000)] == []", "more than 1000 values"),
        ("assert [[f(i, j) for j in range(100)] for i in range(100)]", "more than 1000 calls"),
        ("assert [f([p for p in range(2)]) for p in range(2)]", "binds a name of the enclosing"),
        ("assert [f(x) for x in range(3.5)]", "TypeError"),
        ("assert sorted(f(), key=lambda t: t[1]) == [1]", "Lambda"),
        ("assert f() == f'{1}'", "JoinedStr"),
        ("assert math.factorial(f()) == 6", "math.factorial"),
        ("assert sorted(f()).index(3) == 0", "called"),
        ("assert f() is 3", "'is' only with None"),
        ("assert max(*f()) == 3", r"\* or \*\*"),
        ("x = f()\nassert x == 1", "not an assert statement"),
        ("check(candidate)", "not an assert statement"),
        ("assert f(", "is not valid Python"),
        ("", "holds no assert"),
    ],
)
def test_refused_shapes_name_the_test(test, message):
    with pytest.raises(ValueError, match=rf"test 0 .*{message}"):
        split_test(test, 0)


@pytest.mark.parametrize(
    ("test", "values", "passes"),
    [
        ("assert add(1, 2) == 3", [3], True),
        ("assert add(1, 2) == 3", [3.0], True),  # as == would say
        ("assert add(1, 2) == 3", [4], False),
        ("assert f() == (1, 2)", [[1, 2]], False),  # a list is not a tuple, as == would say
        ("assert f() == {1, 2}", [{2, 1}], True),
        ("assert abs(add(1, 2) - 5) < 1e-9", [5], True),
        ("assert abs(add(1, 2) - 5) < 1e-9", [3], False),
        ("assert abs(add(1, 2) - 5) < 1e-9", ["5"], False),  # str - int: TypeError, a failure
        ("assert f(x) - 5 == 0", [5], True),
        ("assert f(x) - 5 == 0", [6], False),
        ("assert math.isclose(f(1), 5) == True", [5.0000000001], True),
        ("assert math.isclose(f(1), 5) == True", [5.1], False),
        ("assert math.isclose(h(), 0.3, abs_tol=0.01)", [0.305], True),
        ("assert f() is None", [None], True),
        ("assert f() is True", [1], False),
        ("assert 3 in f()", [[1, 2, 3]], True),
        ("assert f() in [1, 2]", [[1]], False),  # unhashable or not a member: no error, a failure
        ("assert f() > 2", ["a"], False),
        ("assert g()", [[0]], True),
        ("assert not g()", [""], True),
        ("assert f(1)[0] == 2", [[2, 9]], True),
        ("assert f(1)[5] == 2", [[2]], False),  # IndexError: a failure
        ("assert sorted(f(1)) == [1, 2]", [(2, 1)], True),
        ("assert len(f()) == 3 and isinstance(f(), str)", ["abc", "abc"], True),
        ("assert type(f()) == int", [True], False),
        ("assert f() == 3", [RAISED], False),  # the call raised, or sent back nothing plain
        ("assert f() == 3 or True", [RAISED], False),  # evaluated first, as in Python
        ("assert True or f() == 3", [RAISED], True),  # never evaluated, as in Python
        ("assert True", [], True),
        ("assert all(f(i) == 2 * i for i in range(3))", [0, 2, 4], True),
        ("assert all(f(i) == 2 * i for i in range(3))", [0, 3, 4], False),
        ("assert any(f(i) for i in range(3))", [0, 1, RAISED], True),  # stops at the first true, as in Python
        ("assert any(f(i) for i in range(3))", [RAISED, 1, 0], False),
        ("assert [f(x) for x in range(3) if x != 1] == [0, 4]", [0, RAISED, 4], True),  # f(1) is never needed
        ("assert sum(f(x) for x, y in [(1, 2), (3, 4)] if y > 2) == 5", [9, 5], True),
    ],
)
def test_the_verdict_is_evaluated_here(test, values, passes):
    assert split_test(test, 0).passes(values) is passes


@pytest.mark.parametrize(
    "test",
    [
        "assert f() ** 10**9 == 1",
        "assert [0] * f() == []",
        "assert f() * f() == 1",
        "assert f() << 10**9 == 1",
        "assert pow(f(), 10**9) == 1",
        "assert str(f()) == '1'",
        "assert sum(f(), []) == []",
        "assert '%*d' % (f(), 1) == ''",
        "assert round(f(), -10**9) == 0",
        "assert bytes(f()) == b''",
        "assert str([g()] * 1000) == ''",
    ],
)
def test_values_cannot_make_the_trainer_hang(test):
    """The candidate chose the value (a huge int, a long list): each operation is refused past its bound."""
    huge = [[0]] * 100000 if "sum" in test else "x" * 200000 if "g()" in test else 10**19000
    start = time.monotonic()
    assert split_test(test, 0).passes([huge] * len(split_test(test, 0).probes)) is False
    assert time.monotonic() - start < 1.0


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
