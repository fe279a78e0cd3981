"""docs/config.md is generated from the config dataclasses' field docstrings, and kept up to date."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from grpolab.config import Config
from grpolab.config.reference import COMMAND, _sections, field_docs, render, type_text

DOC = Path(__file__).parents[3] / "docs" / "config.md"


@dataclass(frozen=True)
class _Inner:
    depth: int = 2
    """How deep.
    Over two lines."""


@dataclass(frozen=True)
class _Outer:
    mode: Literal["a", "b"] = "a"
    """The mode."""
    undocumented: float | None = None
    items: tuple[_Inner, ...] = ()
    """Entries."""
    inner: _Inner = field(default_factory=_Inner)
    """Nested."""


def test_docstrings_are_the_strings_under_each_field():
    assert field_docs(_Outer) == {"mode": "The mode.", "items": "Entries.", "inner": "Nested."}
    assert field_docs(_Inner) == {"depth": "How deep. Over two lines."}


def test_a_small_config_renders_one_table_per_section():
    text = render(_Outer)
    assert "## Top level\n\n| key | type | default | what it does |\n|---|---|---|---|\n" in text
    assert '| `mode` | one of a, b | `"a"` | The mode. |\n| `undocumented` | float or null | `null` |  |\n' in text
    assert "## `items[]`\n" in text and "## `inner`\n" in text
    assert "| `depth` | int | `2` | How deep. Over two lines. |" in text
    assert type_text(tuple[str, ...]) == "list of str" and type_text(tuple[float, float]) == "list of 2 float"


def test_every_config_field_has_a_docstring():
    missing = [
        f"{name or 'top level'}.{f.name}"
        for name, cls, _ in _sections(Config, "")
        for f in dataclasses.fields(cls)
        if f.name not in field_docs(cls) and not dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name])
    ]
    assert missing == [], "write a docstring under each of these fields (docs/design.md, habit 4)"


def test_docs_config_md_is_up_to_date():
    assert DOC.exists() and DOC.read_text() == render(), f"docs/config.md is out of date: run `{COMMAND}`"
