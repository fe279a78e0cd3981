"""Assert tests split into sandbox expressions and trusted checks (grpolab.rewards.code_checks)."""

from __future__ import annotations

import pytest

from grpolab.rewards.code_checks import split_test


def shape(test: str) -> list[tuple[str, str, object]]:
    return [(c.expr, c.op, c.expected) for c in split_test(test, 0)]


@pytest.mark.parametrize(
    ("test", "checks"),
    [
        ("assert add(1, 2) == 3", [("add(1, 2)", "==", 3)]),
        ("assert 3 == add(1, 2)", [("add(1, 2)", "==", 3)]),
        ("assert f(x=[1]) != (1, 2)", [("f(x=[1])", "!=", (1, 2))]),
        ("assert 0 < f()", [("f()", ">", 0)]),
        ("assert f() <= -1.5", [("f()", "<=", -1.5)]),
        ("assert 3 in primes(10)", [("primes(10)", "contains", 3)]),
        ("assert f() in {1, 2}", [("f()", "in", {1, 2})]),
        ("assert f() is None", [("f()", "is", None)]),
        ("assert f() is not False", [("f()", "is not", False)]),
        ("assert is_prime(7)", [("is_prime(7)", "is true", True)]),
        ("assert not is_prime(8)", [("is_prime(8)", "is false", False)]),
        ("assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", [("area(1)", "isclose", 3.14159)]),
        ("assert f(1) == 1 and f(2) == 4", [("f(1)", "==", 1), ("f(2)", "==", 4)]),
        ("assert f(1) == 1, 'msg'\nassert g() == {'a': [1]}", [("f(1)", "==", 1), ("g()", "==", {"a": [1]})]),
    ],
)
def test_accepted_shapes(test, checks):
    assert shape(test) == checks


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("assert f() == g()", "cannot split 'assert f\\(\\) == g\\(\\)'"),
        ("assert f() == Point(1, 2)", "cannot split"),
        ("assert 0 < f() < 3", "cannot split"),
        ("assert f() is 3", "cannot split"),
        ("x = f()\nassert x == 1", "cannot split 'x = f\\(\\)'"),
        ("check(candidate)", "cannot split"),
        ("assert f(", "is not valid Python"),
        ("", "holds no assert"),
    ],
)
def test_refused_shapes_name_the_test(test, message):
    with pytest.raises(ValueError, match=rf"test 0 .*{message}"):
        split_test(test, 0)


@pytest.mark.parametrize(
    ("test", "value", "passes"),
    [
        ("assert f() == 3", "3", True),
        ("assert f() == 3", "3.0", True),  # as == would say
        ("assert f() == 3", "True", False),
        ("assert f() == (1, 2)", "[1, 2]", False),  # a list is not a tuple, as == would say
        ("assert f() == {1, 2}", "{2, 1}", True),
        ("assert f() == 'x'", "<__main__.Any object at 0x7f>", False),  # not a literal: never equal
        ("assert f() == 'x'", "__import__('os').system('true')", False),  # never evaluated
        ("assert f() == 3", "[" * 200000, False),
        ("assert f() == 3", "9" * 5000, False),
        ("assert f() == 3", None, False),  # the expression raised, or no value came back
        ("assert f() is None", "None", True),
        ("assert f() is True", "1", False),
        ("assert 3 in f()", "[1, 2, 3]", True),
        ("assert f() in [1, 2]", "[1]", False),  # unhashable or not a member: no error, a failure
        ("assert f() > 2", "'a'", False),  # str > int raises TypeError: a failure
        ("assert g()", "[0]", True),
        ("assert not g()", "''", True),
        ("assert math.isclose(h(), 0.3)", "0.30000000000000004", True),
        ("assert math.isclose(h(), 0.3, abs_tol=0.01)", "0.305", True),
        ("assert math.isclose(h(), 0.3)", "0.31", False),
    ],
)
def test_checks_compare_plain_values(test, value, passes):
    [check] = split_test(test, 0)
    assert check.holds(value) is passes
