"""The trusted half of an assert test: a small evaluator over the assert's AST, run in the trainer.

The sandbox evaluates only the sub-expressions that call or read the candidate's code (the probes,
grpolab.sandbox.checks) and sends back their values as plain data. Everything else in the
assert (the expected values, ``abs``, ``math.isclose``, arithmetic, comparisons) is evaluated here,
on those values, by ``evaluate``: it knows only the node types and functions listed below, and every
operation whose cost grows with its operands (``**``, ``*`` on sequences, ``<<``, ``int(str)``,
``round`` of an int) is refused past a bound, so no value the candidate chose can make this process
hang or run out of memory. A value is one of None, bool, int, float, complex, str, bytes and lists,
tuples, dicts, sets and frozensets of them: what ``decode`` accepts from the sandbox.

Names a test may use outside the probes: ``FUNCTIONS``, ``TYPES``, and ``math.<name>`` for the
names of ``MATH``. They always mean Python's own (a candidate cannot redefine them here), so a task
whose function under test shares one of these names cannot be tested by asserts.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

MAX_BITS = 1 << 16
"""Largest int (in bits) an operation here may produce or turn into text."""
MAX_ITEMS = 1 << 20
"""Longest sequence an operation here may produce (items, or characters)."""
MAX_DEPTH = 100
"""Deepest nesting of a value from the sandbox."""
MAX_HEX = MAX_BITS // 4 + 2
"""Longest hex text of an int from the sandbox."""
PROBE = "probe "
"""Prefix of the placeholder names that stand for probe values (a space: no real name has one)."""


class Failed(Exception):
    """The test fails: a probe raised or sent nothing back, or an operation was refused."""


class Raised:
    """Stands for a probe that raised, sent back no value, or a value that was not plain data."""

    def __repr__(self) -> str:
        return "RAISED"


RAISED = Raised()


def _numbers(*values: Any) -> bool:
    return all(type(v) in (bool, int, float, complex) for v in values)


def _bits(value: Any) -> int:
    return value.bit_length() if type(value) in (int, bool) else 0


def _check_bits(bits: int) -> None:
    if bits > MAX_BITS:
        raise Failed(f"an int of about {bits} bits is beyond the evaluator's bound")


def _mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, str | bytes | list | tuple) and type(n) in (int, bool) and len(seq) * max(n, 0) > MAX_ITEMS:
            raise Failed("a repeated sequence beyond the evaluator's bound")
    _check_bits(_bits(a) + _bits(b))
    return a * b


def _pow(a: Any, b: Any, mod: Any = None) -> Any:
    if mod is not None:
        _check_bits(max(_bits(a), _bits(b), _bits(mod)))
        return pow(a, b, mod)
    if type(a) in (int, bool) and type(b) in (int, bool) and b > 0 and abs(a) > 1:
        _check_bits(_bits(a) * b)
    return a**b


def _lshift(a: Any, b: Any) -> Any:
    if type(b) in (int, bool):
        _check_bits(_bits(a) + max(b, 0))
    return a << b


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, str | bytes):  # printf-style formatting: its width can be any size
        raise Failed("% on text is not supported in tests")
    return a % b


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
    ast.LShift: _lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: operator.contains(b, a),
    ast.NotIn: lambda a, b: not operator.contains(b, a),
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def _text(value: Any, convert: Callable[[Any], str]) -> str:
    """str() or repr() of a value whose text is bounded (a list repeating one long string is not)."""
    budget, stack = MAX_ITEMS, [value]
    while stack:
        item = stack.pop()
        if type(item) in (int, bool):
            _check_bits(_bits(item) * 2)  # decimal text of a big int costs quadratic time
        sized = isinstance(item, str | bytes | dict | list | tuple | set | frozenset)
        budget -= len(item) * (2 if isinstance(item, dict) else 1) + 1 if sized else 1
        if budget < 0:  # checked before the stack grows: it never holds more than the budget
            raise Failed("str() or repr() of a value beyond the evaluator's bound")
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple | set | frozenset):
            stack += item
    return convert(value)


def _int(value: Any = 0, base: Any = None) -> int:
    if isinstance(value, str | bytes) and len(value) > MAX_BITS // 8:
        raise Failed("int() of a text beyond the evaluator's bound")
    return int(value) if base is None else int(value, base)


def _round(value: Any, ndigits: Any = None) -> Any:
    if ndigits is not None and type(value) in (int, bool) and abs(ndigits) > MAX_BITS // 4:
        raise Failed("round() of an int to that many digits is beyond the evaluator's bound")
    return round(value) if ndigits is None else round(value, ndigits)


def _sum(values: Iterable[Any], start: Any = 0) -> Any:
    values = list(values)
    if not _numbers(start, *values):  # sum of lists or strings is quadratic
        raise Failed("sum() of anything but numbers is not supported in tests")
    return sum(values, start)


def _sorted(values: Iterable[Any], *, reverse: bool = False) -> list:
    return sorted(values, reverse=bool(reverse))


def _bytes(value: Any = b"", *args: Any) -> bytes:
    if type(value) in (int, bool) and value > MAX_ITEMS:
        raise Failed("bytes() of that size is beyond the evaluator's bound")
    return bytes(value, *args)


def _minmax(pick: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if set(kwargs) - {"default"}:
            raise Failed(f"{pick.__name__}() takes no key= in tests")
        return pick(*args, **kwargs)

    return call


def _range(*args: Any) -> range:
    values = range(*args)
    if len(values) > MAX_ITEMS:
        raise Failed("a range beyond the evaluator's bound")
    return values


TYPES: dict[str, type] = {
    t.__name__: t for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    **TYPES,
    "int": _int,
    "bytes": _bytes,
    "str": lambda value="": _text(value, str),
    "repr": lambda value: _text(value, repr),
    "abs": abs,
    "all": all,
    "any": any,
    "divmod": divmod,
    "isinstance": isinstance,
    "len": len,
    "max": _minmax(max),
    "min": _minmax(min),
    "pow": _pow,
    "round": _round,
    "sorted": _sorted,
    "reversed": lambda values: list(reversed(values)),
    "range": _range,
    "enumerate": lambda values, start=0: list(enumerate(values, start)),
    "zip": lambda *values: list(zip(*values)),  # noqa: B905 (Python's zip, as a test means it)
    "sum": _sum,
    "type": lambda value: type(value),
}
MATH: dict[str, Any] = {
    **{name: getattr(math, name) for name in ("isclose", "isfinite", "isinf", "isnan", "fabs", "floor", "ceil")},
    **{name: getattr(math, name) for name in ("sqrt", "trunc", "gcd", "log", "log2", "log10", "exp", "hypot")},
    **{name: getattr(math, name) for name in ("pi", "e", "inf", "nan", "tau")},
}


def evaluate(node: ast.expr, probes: Sequence[Any]) -> Any:
    """The value of ``node`` (checked by code_checks), with ``probe k`` names bound to ``probes[k]``."""
    kind = type(node)
    if kind in _NODES:
        return _NODES[kind](node, probes)
    raise Failed(f"{kind.__name__} is not supported in tests")


def _name(node: ast.Name, probes: Sequence[Any]) -> Any:
    if node.id.startswith(PROBE):
        value = probes[int(node.id[len(PROBE) :])]
        if value is RAISED:
            raise Failed("the code under test raised, or sent back no plain value")
        return value
    return TYPES[node.id] if node.id in TYPES else FUNCTIONS[node.id]


def _call(node: ast.Call, probes: Sequence[Any]) -> Any:
    func = node.func
    fn = MATH[func.attr] if isinstance(func, ast.Attribute) else FUNCTIONS[func.id]  # type: ignore[attr-defined]
    args = [evaluate(arg, probes) for arg in node.args]
    kwargs = {kw.arg: evaluate(kw.value, probes) for kw in node.keywords}
    return fn(*args, **kwargs)


def _compare(node: ast.Compare, probes: Sequence[Any]) -> bool:
    left = evaluate(node.left, probes)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = evaluate(right_node, probes)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _bool_op(node: ast.BoolOp, probes: Sequence[Any]) -> Any:
    value = None
    for operand in node.values:  # short-circuits as Python does
        value = evaluate(operand, probes)
        if bool(value) is isinstance(node.op, ast.Or):
            return value
    return value


def _subscript(node: ast.Subscript, probes: Sequence[Any]) -> Any:
    value = evaluate(node.value, probes)
    if isinstance(node.slice, ast.Slice):
        parts = (node.slice.lower, node.slice.upper, node.slice.step)
        index: Any = slice(*(None if p is None else evaluate(p, probes) for p in parts))
    else:
        index = evaluate(node.slice, probes)
    return value[index]


class Unrolled(ast.expr):
    """A comprehension unrolled over its iterables (known when the test is split): per binding of its
    loop variables, the condition (all its ``if``s) and the element (key and value for a dict), with the
    loop variables replaced by their values. Evaluated lazily: an element only where its condition holds,
    a generator's elements only as they are consumed (``all`` and ``any`` stop early, as in Python)."""

    _fields = ()

    def __init__(self, kind: str, items: list[tuple[ast.expr, tuple[ast.expr, ...]]]) -> None:
        super().__init__()
        self.kind, self.items = kind, items


def _unrolled(node: Unrolled, probes: Sequence[Any]) -> Any:
    chosen = (
        tuple(evaluate(part, probes) for part in parts) for condition, parts in node.items if evaluate(condition, probes)
    )
    if node.kind == "dict":
        return {key: value for key, value in chosen}
    elements = (parts[0] for parts in chosen)
    return {"list": list, "set": set, "generator": iter}[node.kind](elements)


def _dict(node: ast.Dict, probes: Sequence[Any]) -> dict:
    return {evaluate(k, probes): evaluate(v, probes) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]


_NODES: dict[type[ast.AST], Callable[[Any, Sequence[Any]], Any]] = {
    ast.Constant: lambda node, _: node.value,
    ast.Name: _name,
    ast.Attribute: lambda node, _: MATH[node.attr],
    ast.Call: _call,
    ast.Compare: _compare,
    ast.BoolOp: _bool_op,
    ast.UnaryOp: lambda node, p: _UNARY[type(node.op)](evaluate(node.operand, p)),
    ast.BinOp: lambda node, p: _BINARY[type(node.op)](evaluate(node.left, p), evaluate(node.right, p)),
    ast.IfExp: lambda node, p: evaluate(node.body if evaluate(node.test, p) else node.orelse, p),
    ast.Subscript: _subscript,
    ast.List: lambda node, p: [evaluate(e, p) for e in node.elts],
    ast.Tuple: lambda node, p: tuple(evaluate(e, p) for e in node.elts),
    ast.Set: lambda node, p: {evaluate(e, p) for e in node.elts},
    ast.Dict: _dict,
    Unrolled: _unrolled,
}
"""Every node type the evaluator knows (code_checks refuses a test holding any other)."""


def holds(condition: ast.expr, probes: Sequence[Any]) -> bool:
    """Whether ``assert condition`` passes with these probe values; any exception is a failure, as in Python."""
    try:
        return bool(evaluate(condition, probes))
    except Exception:  # noqa: BLE001 (TypeError, ArithmeticError, Failed, ...: the assert fails)
        return False


# Values from the sandbox: JSON as sandbox_harness._encode writes it, checked and rebuilt here.
_TAGS = ("tuple", "set", "frozenset", "dict", "int", "float", "complex", "bytes")


def decode(tree: Any, depth: int = 0) -> Any:
    """The plain value a JSON tree from the sandbox stands for; ValueError if it is not one."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    kind = type(tree)
    if tree is None or kind in (bool, int, float, str):
        return tree
    if kind is list:
        return [decode(item, depth + 1) for item in tree]
    if kind is not dict or len(tree) != 1 or next(iter(tree)) not in _TAGS:
        raise ValueError("not an encoded value")
    (tag, body), = tree.items()
    return _DECODERS[tag](body, depth + 1)


def _items(body: Any, depth: int) -> list:
    if type(body) is not list:
        raise ValueError("not a list of items")
    return [decode(item, depth + 1) for item in body]


def _hashable(value: Any) -> Any:
    return frozenset(value) if type(value) is set else value


def _int_from_hex(body: Any, _depth: int) -> int:
    if type(body) is not str or len(body) > MAX_HEX:
        raise ValueError("not a bounded hex int")
    return int(body, 16)


def _float_from_text(body: Any, _depth: int) -> float:
    if body not in ("nan", "inf", "-inf"):
        raise ValueError("not a float tag")
    return float(body)


def _complex(body: Any, depth: int) -> complex:
    parts = _items(body, depth)
    if len(parts) != 2 or not all(type(p) in (int, float) for p in parts):
        raise ValueError("not a complex")
    return complex(*parts)


def _bytes_from_hex(body: Any, _depth: int) -> bytes:
    if type(body) is not str:
        raise ValueError("not hex bytes")
    return bytes.fromhex(body)


def _dict_from_pairs(body: Any, depth: int) -> dict:
    pairs = _items(body, depth)
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        raise ValueError("not a list of pairs")
    return {_hashable(k): v for k, v in pairs}


_DECODERS: dict[str, Callable[[Any, int], Any]] = {
    "tuple": lambda body, depth: tuple(_items(body, depth)),
    "set": lambda body, depth: {_hashable(v) for v in _items(body, depth)},
    "frozenset": lambda body, depth: frozenset(_hashable(v) for v in _items(body, depth)),
    "dict": _dict_from_pairs,
    "int": _int_from_hex,
    "float": _float_from_text,
    "complex": _complex,
    "bytes": _bytes_from_hex,
}
