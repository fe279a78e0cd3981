"""tests/unit mirrors src/grpolab: ``tests/unit/<package>/test_<module>.py`` tests ``grpolab/<package>/<module>.py``.

Allowed in a package's folder besides ``test_<module>.py``: ``test_<module>_<aspect>.py`` (a big module's tests
in several files), ``test_init.py`` or ``test_<package>.py`` (the package's ``__init__``), ``conftest.py`` and
helper modules without the ``test_`` prefix. A root module's tests sit in ``tests/unit/test_<module>.py``, beside
the checks that read the whole tree (this one, test_layers.py). Test file names are unique under tests/: pytest
imports each by its bare name (no ``__init__.py`` in the test folders), so a second ``test_base.py`` would not load.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "grpolab"
UNIT = ROOT / "tests" / "unit"


def _folders() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__")


def _modules(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"}


def _names_a_module(stem: str, package: Path) -> bool:
    """``stem`` is a test file's name without ``test_`` and ``.py``."""
    if stem in ("init", package.name):
        return True
    modules = _modules(package)
    return stem in modules or any(stem.startswith(f"{module}_") for module in modules)


def test_every_test_folder_is_a_package_of_the_source():
    strays = [
        str(folder.relative_to(UNIT))
        for folder in _folders()
        if not (SRC / folder.relative_to(UNIT) / "__init__.py").exists()
    ]
    assert not strays, f"tests/unit folders with no package of that name in src/grpolab: {strays}"


def test_every_test_file_in_a_package_folder_names_one_of_its_modules():
    wrong = []
    for folder in _folders():
        package = SRC / folder.relative_to(UNIT)
        if not (package / "__init__.py").exists():
            continue  # reported by the test above
        for path in sorted(folder.glob("test_*.py")):
            if not _names_a_module(path.stem.removeprefix("test_"), package):
                wrong.append(str(path.relative_to(UNIT)))
    assert not wrong, (
        f"test files that name no module of their package (test_<module>.py, test_<module>_<aspect>.py, "
        f"test_init.py or test_<package>.py): {wrong}"
    )


def test_test_file_names_are_unique():
    names = Counter(path.name for path in (ROOT / "tests").rglob("test_*.py"))
    twice = sorted(name for name, count in names.items() if count > 1)
    assert not twice, f"test files of the same name (pytest imports them by name; add an aspect): {twice}"


def _tested_elsewhere() -> dict[str, str]:
    """docs/layout.md, "Where each module is tested": module path (below src/grpolab) -> the test that covers it."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    section = text.split("## Where each module is tested", 1)[1]
    block = section.split("```", 2)[1]
    return {line.split()[0]: line.split()[1] for line in block.splitlines() if line.strip()}


def _has_own_test(module: Path) -> bool:
    folder = UNIT / module.parent.relative_to(SRC)
    return (folder / f"test_{module.stem}.py").exists() or any(folder.glob(f"test_{module.stem}_*.py"))


def test_every_module_has_a_test_file_or_a_line_naming_its_test():
    elsewhere = _tested_elsewhere()
    modules = [m for m in sorted(SRC.rglob("*.py")) if m.name not in ("__init__.py", "__main__.py")]
    untested = [str(m.relative_to(SRC)) for m in modules if not _has_own_test(m) and str(m.relative_to(SRC)) not in elsewhere]
    assert not untested, (
        f"modules with no tests/unit/<package>/test_<module>.py and no line in docs/layout.md (Where each module "
        f"is tested): {untested}"
    )
    stale = [path for path in elsewhere if not (SRC / path).is_file() or _has_own_test(SRC / path)]
    assert not stale, f"lines in docs/layout.md for modules that are gone or have a test file of their own: {stale}"
    missing = {path: test for path, test in elsewhere.items() if not (ROOT / test).is_file()}
    assert not missing, f"tests named in docs/layout.md that do not exist: {missing}"


def test_the_list_of_modules_tested_elsewhere_is_read():
    assert _tested_elsewhere()["commands/demo.py"] == "tests/integration/test_demo.py"
