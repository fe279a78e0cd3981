"""Assert-style tests split into the calls the sandbox evaluates and the verdict the trainer computes.

In ``assert abs(add(1, 2) - 3) < 1e-9`` only ``add(1, 2)`` runs in the sandbox (a *probe*); the
sandbox sends back its value as plain data, and ``abs(<value> - 3) < 1e-9`` is evaluated here by
grpolab.sandbox.verdict on that value. The expected value, the comparison and every function
applied to the result (``abs``, ``math.isclose``, ``sorted``, arithmetic) never enter the sandbox,
so code that redefines ``abs``, patches ``math.isclose`` or returns an object with a lying
``__eq__`` or ``__sub__`` gains nothing: the value it returns is data, compared here.

A probe is the largest sub-expression rooted at a name the evaluator does not know: a call of the
candidate's code with its arguments (``add(1, 2)``, ``Solution().two_sum([2, 7], 9)``), or a name or
attribute it defines. A subscript of a probe is taken here (``f(x)[0]``: ``f(x)`` is the probe).
Write expected values outside such calls: ``check(f(x), 3)``, with ``check`` not a known function,
sends ``3`` to the sandbox as an argument.

A test is one or more ``assert`` statements (all must hold; messages are ignored) and optionally
``import math``. Around the probes it may use constants, list/tuple/set/dict displays, arithmetic,
comparisons (chained too; ``is`` / ``is not`` only with None, True or False), ``and``/``or``/``not``,
``x if c else y``, subscripts and slices, and calls of code_verdict.FUNCTIONS and ``math.<name>``
for the names of code_verdict.MATH. Comprehensions and generator expressions whose iterables are
known here (``all(f(i) == 2 * i for i in range(3))``) are unrolled when the test is split: each
binding of the loop variables gives its own probes (``f(0)``, ``f(1)``, ``f(2)``), up to
MAX_UNROLLED bindings. Anything else (an iterable that calls the code, lambdas, f-strings, other
statements) is refused with a message naming the test; stdin/stdout tests remain for the rest.
"""

from __future__ import annotations

import ast
import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.sandbox.verdict import (
    _NODES,
    FUNCTIONS,
    MATH,
    PROBE,
    RAISED,
    TYPES,
    Unrolled,
    evaluate,
    holds,
)

_KNOWN = frozenset(FUNCTIONS) | frozenset(TYPES) | {"math"}
_SINGLETONS = (None, True, False)
_SHAPES = (
    "assert statements comparing calls of the code under test with expected values, e.g. "
    "'assert add(1, 2) == 3' or 'assert abs(area(2) - 12.566) < 1e-3', using only constants, "
    "arithmetic, comparisons, and/or/not and the functions "
    f"{', '.join(sorted(FUNCTIONS))}, math.{{{', '.join(sorted(MATH))}}} around those calls"
)


class Unsupported(ValueError):
    """A part of a test the trusted evaluator does not evaluate."""


@dataclass(frozen=True)
class AssertTest:
    """One test: ``probes`` (source, run in the sandbox, in order) and ``conditions`` (checked here)."""

    source: str
    probes: tuple[str, ...]
    conditions: tuple[ast.expr, ...]
    """Each assert's condition, with probe k replaced by the name ``PROBE + str(k)``."""

    def passes(self, values: Sequence[Any]) -> bool:
        """Whether every assert holds, given the probes' plain values (code_verdict.RAISED for none)."""
        if len(values) != len(self.probes):
            raise ValueError(f"{len(values)} values for {len(self.probes)} probes")
        return all(holds(condition, values) for condition in self.conditions)


def _root(node: ast.expr) -> ast.expr:
    """The start of an access chain: ``a`` for ``a.b(c)[d].e``."""
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _is_probe(node: ast.AST) -> bool:
    if not isinstance(node, ast.Name | ast.Call | ast.Attribute):
        return False  # a subscript is taken here, of its value (which may be a probe)
    root = _root(node)
    return isinstance(root, ast.Name) and root.id not in _KNOWN


def _singleton(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and any(node.value is s for s in _SINGLETONS)


def _check_node(node: ast.expr) -> None:
    """Raise Unsupported unless the evaluator knows ``node`` (its children are checked on their own)."""
    if isinstance(node, ast.Slice):
        return
    if type(node) not in _NODES:
        raise Unsupported(f"{ast.unparse(node)!r} ({type(node).__name__})")
    if isinstance(node, ast.Name) and node.id == "math":
        raise Unsupported("'math' on its own")
    if isinstance(node, ast.Attribute) and not (_is_math(node) and node.attr in MATH):
        raise Unsupported(f"{ast.unparse(node)!r} (not one of math.{{{', '.join(sorted(MATH))}}})")
    if isinstance(node, ast.Call):
        known = _is_math(node.func) or (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS)
        if not known:
            raise Unsupported(f"{ast.unparse(node.func)!r} called")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise Unsupported(f"{ast.unparse(node)!r} (* or ** arguments)")
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if isinstance(op, ast.Is | ast.IsNot) and not (_singleton(sides[i]) or _singleton(sides[i + 1])):
                raise Unsupported(f"{ast.unparse(node)!r} ('is' only with None, True or False)")


def _is_math(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"


class _Splitter(ast.NodeTransformer):
    def __init__(self) -> None:
        self.probes: list[str] = []

    def visit(self, node: ast.AST) -> ast.AST:
        if type(node) in _COMPREHENSIONS:
            return self._unroll(node)  # type: ignore[arg-type]
        if _is_probe(node):
            self.probes.append(ast.unparse(node))
            return ast.Name(id=f"{PROBE}{len(self.probes) - 1}", ctx=ast.Load())
        if isinstance(node, ast.expr):
            _check_node(node)
            if isinstance(node, ast.Attribute):
                return node  # math.<name>: nothing below it to visit
        return self.generic_visit(node)


    def _unroll(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> Unrolled:
        if len(self.probes) > MAX_UNROLLED:  # nested comprehensions multiply
            raise Unsupported(f"more than {MAX_UNROLLED} calls of the code in one test")
        """The comprehension over its iterables' values (they may not call the code under test)."""
        parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        conditions = [c for generator in node.generators for c in generator.ifs]
        items = []
        for env in _bindings(node.generators, {}, [0]):
            condition = ast.BoolOp(ast.And(), conditions) if conditions else ast.Constant(True)
            condition = self.visit(_substituted(condition, env))
            items.append((condition, tuple(self.visit(_substituted(part, env)) for part in parts)))
        if len(self.probes) > MAX_UNROLLED:
            raise Unsupported(f"more than {MAX_UNROLLED} calls of the code in one test")
        return Unrolled(_COMPREHENSIONS[type(node)], items)


_COMPREHENSIONS = {ast.ListComp: "list", ast.SetComp: "set", ast.GeneratorExp: "generator", ast.DictComp: "dict"}
MAX_UNROLLED = 1000
"""Most bindings of a comprehension's loop variables (each one's calls are probes)."""


def _bindings(generators: list[ast.comprehension], env: dict, count: list[int]):
    """Every binding of the loop variables, in order; an iterable may use the variables bound before it."""
    if not generators:
        count[0] += 1
        if count[0] > MAX_UNROLLED:
            raise Unsupported(f"a comprehension over more than {MAX_UNROLLED} values")
        yield env
        return
    first = generators[0]
    checker = _Splitter()
    iterable = checker.visit(_substituted(first.iter, env))
    if first.is_async or checker.probes:
        raise Unsupported(f"{ast.unparse(first.iter)!r} (a comprehension's iterable must not call the code)")
    try:
        values = list(evaluate(iterable, []))
    except Exception as err:  # noqa: BLE001 (refused, with the reason)
        raise Unsupported(f"{ast.unparse(first.iter)!r} ({type(err).__name__}: {err})") from None
    for value in values:
        yield from _bindings(generators[1:], {**env, **_assigned(first.target, value)}, count)


def _assigned(target: ast.expr, value: Any) -> dict:
    if isinstance(target, ast.Name):
        return {target.id: value}
    if isinstance(target, ast.Tuple | ast.List) and all(isinstance(t, ast.Name) for t in target.elts):
        values = list(value) if isinstance(value, list | tuple) else None
        if values is not None and len(values) == len(target.elts):
            return {t.id: v for t, v in zip(target.elts, values, strict=True)}  # type: ignore[attr-defined]
    raise Unsupported(f"{ast.unparse(target)!r} = {value!r} (a loop target is a name or a tuple of names)")


def _literal(value: Any) -> ast.expr:
    """``value`` as an expression (it goes into probes' source, sent to the sandbox, as an argument)."""
    if value is None or type(value) in (bool, int, str, bytes, complex) or (type(value) is float and math.isfinite(value)):
        return ast.Constant(value)
    if type(value) in (list, tuple, set) and (value or type(value) is not set):
        kind = {list: ast.List, tuple: ast.Tuple, set: ast.Set}[type(value)]
        return kind(elts=[_literal(v) for v in value], ctx=ast.Load()) if kind is not ast.Set else ast.Set([_literal(v) for v in value])
    if type(value) is dict:
        return ast.Dict(keys=[_literal(k) for k in value], values=[_literal(v) for v in value.values()])
    raise Unsupported(f"a loop value {value!r} that cannot be written as a literal")


class _Substitute(ast.NodeTransformer):
    def __init__(self, env: dict) -> None:
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return _literal(self.env[node.id]) if node.id in self.env else node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        bound = {n.id for g in getattr(node, "generators", ()) for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Lambda):
            bound |= {a.arg for a in node.args.args}
        if bound & set(self.env):
            raise Unsupported(f"{ast.unparse(node)!r} (binds a name of the enclosing comprehension again)")
        return super().generic_visit(node)


def _substituted(node: ast.expr, env: dict) -> ast.expr:
    """A copy of ``node`` with the loop variables of ``env`` replaced by their values."""
    return _Substitute(env).visit(copy.deepcopy(node))


def _is_math_import(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Import) and all(a.name == "math" and a.asname is None for a in statement.names)


def split_test(test: str, index: int) -> AssertTest:
    """Assert-style test number ``index`` split (module docstring); ValueError naming it if it cannot be."""
    try:
        body = ast.parse(test).body
    except SyntaxError as err:
        raise ValueError(f"test {index} ({test!r}) is not valid Python: {err.msg}") from None
    splitter = _Splitter()
    conditions = []
    for statement in body:
        if _is_math_import(statement):
            continue
        if not isinstance(statement, ast.Assert):
            raise ValueError(
                f"test {index} ({test!r}): {ast.unparse(statement)!r} is not an assert statement; write each "
                f"test as {_SHAPES}, or use stdin/stdout tests"
            )
        try:
            conditions.append(splitter.visit(statement.test))
        except Unsupported as err:
            raise ValueError(
                f"test {index} ({test!r}): cannot check {err} outside the sandbox; write each test as "
                f"{_SHAPES}, or use stdin/stdout tests"
            ) from None
    if not conditions:
        raise ValueError(f"test {index} ({test!r}) holds no assert statement; write it as {_SHAPES}")
    return AssertTest(test, tuple(splitter.probes), tuple(conditions))


__all__ = ["RAISED", "AssertTest", "split_test"]
