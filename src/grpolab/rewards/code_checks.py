"""Assert-style tests split into what the sandbox evaluates and what the trainer checks.

``assert add(1, 2) == 3`` becomes the expression ``add(1, 2)``, evaluated by the untrusted code in
the sandbox, and the check ``== 3``, made here on the value sent back. The expected value is parsed
with ast.literal_eval and never enters the sandbox; the value sent back is text, parsed here with
ast.literal_eval too, so both sides of every comparison are plain builtin objects. Code that
overrides ``exec``, ``compile`` or ``__eq__``, or reads the harness's memory, can choose what the
expressions evaluate to, which is what any solution does; it cannot see what they are compared with
or how, so it cannot make a test pass without producing the right value.

Accepted, one or more ``assert`` statements per test (all must hold), each of the form

* ``assert EXPR OP LITERAL`` (or ``LITERAL OP EXPR``) for OP one of ``== != < <= > >= in not in``,
  and ``assert EXPR is [not] None/True/False``;
* ``assert math.isclose(EXPR, LITERAL, rel_tol=LITERAL, abs_tol=LITERAL)`` (either argument order);
* ``assert EXPR`` and ``assert not EXPR`` (EXPR's value, true or false); ``A and B`` checks both.

A LITERAL is what ast.literal_eval reads: numbers, strings, bytes, None, True, False and lists,
tuples, dicts and sets of them. A value made of other types (an instance of a class of the code's,
for one) fails the test. Anything else in a test is refused with a message naming the test.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_OPS: dict[type[ast.cmpop], tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.In: ("in", lambda value, literal: value in literal),
    ast.NotIn: ("not in", lambda value, literal: value not in literal),
    ast.Is: ("is", lambda value, literal: value is literal),
    ast.IsNot: ("is not", lambda value, literal: value is not literal),
}
# LITERAL OP EXPR read as EXPR OP' LITERAL
_MIRRORED: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "==": _OPS[ast.Eq],
    "!=": _OPS[ast.NotEq],
    "<": _OPS[ast.Gt],
    "<=": _OPS[ast.GtE],
    ">": _OPS[ast.Lt],
    ">=": _OPS[ast.LtE],
    "in": ("contains", lambda value, literal: literal in value),
    "not in": ("does not contain", lambda value, literal: literal not in value),
}
_SHAPES = (
    "assert EXPR == LITERAL (or != < <= > >= in, not in; is None/True/False), assert math.isclose(EXPR, "
    "LITERAL, ...), assert EXPR or assert not EXPR, where LITERAL is a Python literal (ast.literal_eval)"
)


@dataclass(frozen=True)
class Check:
    """One condition of a test: ``expr`` (source, run in the sandbox) ``op`` ``expected`` (trusted)."""

    expr: str
    op: str
    expected: Any
    compare: Callable[[Any, Any], bool]

    def holds(self, value_repr: str | None) -> bool:
        """Whether the value the sandbox reported (its repr, or None if it had none) passes."""
        if value_repr is None:
            return False
        try:
            value = ast.literal_eval(value_repr)
            return bool(self.compare(value, self.expected))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, ArithmeticError):
            return False


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _isclose(node: ast.Call) -> Check | None:
    func = node.func
    named = isinstance(func, ast.Attribute) and func.attr == "isclose" and isinstance(func.value, ast.Name)
    if not named or func.value.id != "math" or len(node.args) != 2:  # type: ignore[union-attr]
        return None
    options = {}
    for keyword in node.keywords:
        ok, value = _literal(keyword.value)
        if keyword.arg not in ("rel_tol", "abs_tol") or not ok:
            return None
        options[keyword.arg] = value
    for expr, other in (node.args, node.args[::-1]):
        ok, expected = _literal(other)
        if ok:
            compare = lambda value, literal: math.isclose(value, literal, **options)  # noqa: E731
            return Check(ast.unparse(expr), "isclose", expected, compare)
    return None


def _condition(node: ast.expr) -> list[Check] | None:
    """The checks ``assert node`` stands for, or None if it has none of the accepted shapes."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        parts = [_condition(value) for value in node.values]
        return None if any(p is None for p in parts) else [c for p in parts for c in p]  # type: ignore[union-attr]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [Check(ast.unparse(node.operand), "is false", False, lambda value, _: not value)]
    if isinstance(node, ast.Call) and (check := _isclose(node)) is not None:
        return [check]
    if not isinstance(node, ast.Compare):
        return [Check(ast.unparse(node), "is true", True, lambda value, _: bool(value))]
    if len(node.ops) != 1:
        return None
    left, right, (name, compare) = node.left, node.comparators[0], _OPS[type(node.ops[0])]
    if name in ("is", "is not"):
        singleton = isinstance(right, ast.Constant) and right.value in (None, True, False)
        return [Check(ast.unparse(left), name, right.value, compare)] if singleton else None  # type: ignore[attr-defined]
    ok, expected = _literal(right)
    if ok:
        return [Check(ast.unparse(left), name, expected, compare)]
    ok, expected = _literal(left)
    if ok:
        mirrored, mirrored_compare = _MIRRORED[name]
        return [Check(ast.unparse(right), mirrored, expected, mirrored_compare)]
    return None


def split_test(test: str, index: int) -> list[Check]:
    """The checks of assert-style test number ``index``; ValueError naming it if it has another shape."""
    try:
        body = ast.parse(test).body
    except SyntaxError as err:
        raise ValueError(f"test {index} ({test!r}) is not valid Python: {err.msg}") from None
    checks: list[Check] = []
    for statement in body:
        found = _condition(statement.test) if isinstance(statement, ast.Assert) else None
        if found is None:
            what = ast.unparse(statement)
            raise ValueError(
                f"test {index} ({test!r}): cannot split {what!r} into code to run and an expected value to "
                f"check outside the sandbox; write each test as {_SHAPES}, or use stdin/stdout tests"
            )
        checks += found
    if not checks:
        raise ValueError(f"test {index} ({test!r}) holds no assert statement; write it as {_SHAPES}")
    return checks
