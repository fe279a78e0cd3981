"""docs/layout.md is true: the packages and root modules it lists are the ones under src/grpolab, and its
layer table is the order tests/unit/test_layers.py enforces."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "grpolab"
DOC = ROOT / "docs" / "layout.md"


def listed() -> list[str]:
    """The entries of the ``src/grpolab/`` tree in the doc: ``name/`` for a folder, ``name.py`` for a module."""
    block = DOC.read_text().split("```\nsrc/grpolab/\n", 1)[1].split("```", 1)[0]
    names = []
    for line in block.splitlines():
        if not line.startswith("  "):  # the next top-level entry (tests/, examples/, ...) ends the tree
            break
        match = re.match(r"  (\S+?/|\S+?\.py)\s+\S", line)
        assert match, f"docs/layout.md: {line!r} is not `  name/  what it holds` or `  name.py  what it holds`"
        names.append(match.group(1))
    return names


def actual() -> set[str]:
    """Every package (a folder with __init__.py) and root module of src/grpolab."""
    packages = {f"{p.parent.name}/" for p in SRC.glob("*/__init__.py")}
    return packages | {p.name for p in SRC.glob("*.py")}


def test_the_parser_reads_the_tree():
    names = listed()
    assert {"algo/", "runtime/", "types.py", "__init__.py"} <= set(names)
    assert len(names) == len(set(names)), "an entry is listed twice"


def test_every_listed_entry_exists():
    missing = [name for name in listed() if not (SRC / name.rstrip("/")).exists()]
    assert missing == [], "docs/layout.md lists what src/grpolab does not hold"


def test_every_package_and_root_module_is_listed():
    unlisted = sorted(actual() - set(listed()))
    assert unlisted == [], "add these to docs/layout.md, one line each"


def test_the_layer_table_is_the_enforced_order():
    spec = importlib.util.spec_from_file_location("layers", Path(__file__).with_name("test_layers.py"))
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    section = DOC.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    table = [tuple(re.findall(r"`([^`]+)`", row.split("|")[2])) for row in rows]
    assert table == layers.LAYERS
