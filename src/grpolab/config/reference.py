"""The config reference (docs/config.md), generated from the config dataclasses and their field docstrings.

    python -m grpolab.config.reference > docs/config.md

A field's docstring is the string literal written under it (docs/design.md, "Configs are typed, frozen and validated"); Python keeps no such
attribute, so it is read from the class's source with ``ast``. Each section is a table of key, type,
default and docstring; a section nested in another (``model.lora``) or a list of entries
(``reward.functions[]``) gets its own table. tests/unit/config/test_reference.py fails when the file
is out of date.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from grpolab.config.resolve import config_fields
from grpolab.config.root import Config

COMMAND = "python -m grpolab.config.reference > docs/config.md"

_HEADER = f"""# Config reference

Every key of a grpolab config: the YAML file's sections, the dotted overrides of the command line
(`algo.beta=0.0`) and the dicts of the Python API (`{{"algo": {{"beta": 0.0}}}}` or `{{"algo.beta": 0.0}}`).
`null` leaves a value to be derived; in `algo`, `null` takes the value of the preset `algo.name` names
(README, "Presets"). `grpolab config --config run.yaml` prints a config with every value resolved.

Generated from the config dataclasses' field docstrings (`src/grpolab/config/`); do not edit by hand:
`{COMMAND}`.
"""


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literal under each annotated field of ``cls``'s body."""
    return dict(_field_docs(cls))


@cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # the class definition's statements
    docs = []
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs.append((node.target.id, " ".join(inspect.cleandoc(after.value.value).split())))
    return tuple(docs)


def render(root: type = Config) -> str:
    """The whole reference as Markdown."""
    parts = [_HEADER]
    for title, cls, doc in _sections(root, ""):
        parts.append(f"\n## `{title}`\n" if title else "\n## Top level\n")
        if doc:
            parts.append(f"\n{doc}\n")
        parts.append("\n| key | type | default | what it does |\n|---|---|---|---|\n")
        parts.extend(_row(cls, f) for f in _leaf_fields(cls))
    return "".join(parts)


def _sections(cls: type, prefix: str) -> Iterator[tuple[str, type, str]]:
    """(dotted name, class, class docstring) of ``cls`` and of every dataclass under it, depth first."""
    leaves = _leaf_fields(cls)
    if leaves:
        yield prefix, cls, _class_doc(cls)
    hints = typing.get_type_hints(cls)
    for f in config_fields(cls):
        inner, suffix = _nested(hints[f.name])
        if inner is not None:
            yield from _sections(inner, f"{prefix}{f.name}{suffix}" if not prefix else f"{prefix}.{f.name}{suffix}")


def _leaf_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    return [f for f in config_fields(cls) if _nested(hints[f.name])[0] is None]


def _nested(tp: Any) -> tuple[type | None, str]:
    """The dataclass a field holds (itself, optional, or a tuple of them: suffix "[]"), or (None, "")."""
    if dataclasses.is_dataclass(tp):
        return tp, ""
    args = [a for a in typing.get_args(tp) if a is not type(None) and a is not Ellipsis]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0], "[]" if typing.get_origin(tp) is tuple else ""
    return None, ""


def _class_doc(cls: type) -> str:
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes when there is no docstring
        return ""
    return " ".join(inspect.cleandoc(doc).split())


def _row(cls: type, f: dataclasses.Field) -> str:
    doc = field_docs(cls).get(f.name, "")
    cells = [f"`{f.name}`", type_text(typing.get_type_hints(cls)[f.name]), f"`{_default(f)}`", doc]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def type_text(tp: Any) -> str:
    """A field's type in words: ``one of grpo, dr_grpo``, ``int or null``, ``list of str``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        return f"list of {len(args)} {type_text(args[0])}" if len(set(args)) == 1 else "list"
    if origin is not None and issubclass(origin, Mapping):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return json.dumps(_plain(value))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, types.MappingProxyType | dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    print(render(), end="")
