"""Every file path that the source, the tests or the docs name exists: a module moved or renamed leaves no
reference pointing at nothing.

In src/grpolab every path counts (relative to the repository, src/, src/grpolab or the naming file). In tests/
and docs/, which also name a run's outputs and other projects' files, the paths that start at a folder of this
repository (tests/, docs/, ...) or at a package of grpolab (config/, rollout/, ...) count.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "grpolab"
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|json|toml|txt))\b")
ELSEWHERE = ("out/", "run_dir/", "eval_base/", "src/open_r1/", "trl/trainer/", "docs/source/")
"""Paths that are not this repository's files: a run's outputs, and other projects' sources and docs (open-r1,
TRL)."""
MOVE_TABLE = "## Where things went in the move"
"""The section of docs/layout.md that names the paths modules had before the move, on purpose."""


def _exists(path: str, naming: Path) -> bool:
    return any((base / path).exists() for base in (ROOT, ROOT / "src", PACKAGE, naming.parent))


def _text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if MOVE_TABLE in text:  # up to the next section
        before, after = text.split(MOVE_TABLE, 1)
        text = before + (after.split("\n## ", 1)[1] if "\n## " in after else "")
    return text


def named_paths() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for module in sorted(PACKAGE.rglob("*.py")):
        for match in PATH.finditer(module.read_text(encoding="utf-8")):
            found.setdefault(match.group(1), []).append(str(module.relative_to(ROOT)))
    return found


def _ours(path: str) -> bool:
    first = path.split("/", 1)[0]
    return first in ("src", "tests", "docs", "benchmarks", "examples", "configs") or (PACKAGE / first).is_dir()


def test_every_path_named_in_the_source_exists():
    missing = {
        path: modules
        for path, modules in named_paths().items()
        if not path.startswith(ELSEWHERE) and not any(_exists(path, ROOT / m) for m in modules)
    }
    assert not missing, f"paths named in src/grpolab that do not exist: {missing}"


def test_every_path_of_this_repository_named_in_tests_and_docs_exists():
    files = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    missing = [
        f"{path} (in {f.relative_to(ROOT)})"
        for f in files
        for path in dict.fromkeys(m.group(1) for m in PATH.finditer(_text(f)))
        if _ours(path) and not path.startswith(ELSEWHERE) and not _exists(path, f)
    ]
    assert not missing, f"paths named in tests/ and docs/ that do not exist: {missing}"


def test_the_scan_finds_paths():
    assert "studies/compare.py" in named_paths() or any(p.endswith("compare.py") for p in named_paths())
