"""Every file path that a docstring or comment in src/grpolab names exists: a module moved or renamed leaves
no reference pointing at nothing (paths relative to the repository, src/, src/grpolab or the naming file)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "grpolab"
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|json|toml|txt))\b")
ELSEWHERE = ("out/", "run_dir/", "eval_base/", "src/open_r1/", "trl/trainer/")
"""Paths that are not this repository's files: a run's outputs, and other projects' sources (open-r1, TRL)."""


def named_paths() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for module in sorted(PACKAGE.rglob("*.py")):
        for match in PATH.finditer(module.read_text(encoding="utf-8")):
            found.setdefault(match.group(1), []).append(str(module.relative_to(ROOT)))
    return found


def test_every_path_named_in_the_source_exists():
    missing = {
        path: modules
        for path, modules in named_paths().items()
        if not path.startswith(ELSEWHERE)
        and not any((base / path).exists() for base in (ROOT, ROOT / "src", PACKAGE))
        and not any((ROOT / m).parent.joinpath(path).exists() for m in modules)
    }
    assert not missing, f"paths named in src/grpolab that do not exist: {missing}"


def test_the_scan_finds_paths():
    assert "studies/compare.py" in named_paths() or any(p.endswith("compare.py") for p in named_paths())
