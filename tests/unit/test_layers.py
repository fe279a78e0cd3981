"""The import graph of ``src/grpolab`` goes one way: each layer imports only the layers above it.

Read from the source with ``ast`` (top-level imports and imports inside functions alike; only
``if TYPE_CHECKING:`` blocks are left out, since they never run). The layers and what each holds are
in docs/layout.md; ``LAYERS`` below is the same order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "grpolab"

# Top to bottom: a module may import its own layer's package and the layers before it in this list.
LAYERS: list[tuple[str, ...]] = [
    ("types", "errors", "jsonio", "progress"),
    ("config",),
    ("algo",),
    ("distributed",),
    ("models",),
    ("tasks",),
    ("data",),
    ("sandbox",),
    ("rewards",),
    ("envs",),
    ("rollout",),
    ("training",),
    ("eval",),
    ("runtime",),
    ("commands",),
    ("studies",),
    ("trl",),
    ("cli", "cli_args", "api", "api_args", "api_models", "api_eval", "api_callbacks", "api_rewards", "api_data", "__main__", "__init__"),
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

# Function-local imports of grpolab modules that are allowed, and why (module -> imported modules).
# Only the package's own facade and the command line, which import a verb's module when it runs so that
# `import grpolab` and `grpolab --help` stay fast and free of torch.
LAZY_OK = {"grpolab", "grpolab.cli"}

# Module -> the grpolab modules it may import inside a function, and why.
LAZY_PAIRS = {
    ("grpolab.rewards", "grpolab.rewards.neural"): "imports transformers, only when a reward model is asked for",
    ("grpolab.rewards.step_rewards", "grpolab.rewards.neural"): "the same, for a process reward model",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _unit(module: str) -> str:
    """The layer unit of a module: its top-level package or root module below ``grpolab``."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.depth = 0
        self.found: list[tuple[str, int, bool]] = []  # (imported module, line, inside a function)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "grpolab" or alias.name.startswith("grpolab."):
                self.found.append((alias.name, node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target != "grpolab" and not target.startswith("grpolab."):
            return
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            # `from grpolab import jsonio` imports the module grpolab.jsonio, not the package facade
            is_module = (SRC.parent / Path(*sub.split("."))).with_suffix(".py").exists() or (
                SRC.parent / Path(*sub.split(".")) / "__init__.py"
            ).exists()
            self.found.append((sub if is_module else target, node.lineno, self.depth > 0))


def import_graph() -> list[tuple[str, str, int, bool]]:
    """Every import of a grpolab module in the source: (importer, imported, line, inside a function)."""
    edges = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module(path)
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        edges += [(module, target, line, local) for target, line, local in visitor.found]
    return edges


def test_every_package_has_a_layer():
    units = {_unit(_module(p)) for p in SRC.rglob("*.py")}
    assert units - set(RANK) == set(), "add the new package to LAYERS and to docs/layout.md"


def test_imports_only_go_down():
    climbs = [
        f"{src} line {line} imports {dst} ({_unit(dst)} is below {_unit(src)})"
        for src, dst, line, _ in import_graph()
        if RANK[_unit(dst)] > RANK[_unit(src)]
    ]
    assert climbs == []


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in import_graph():
        if _unit(src) != _unit(dst):
            graph.setdefault(_unit(src), set()).add(_unit(dst))

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in graph.get(a, ()))

    assert [u for u in graph if reaches(u, u, {u})] == []


def test_no_grpolab_import_inside_a_function():
    """A function-local import of a grpolab module hides a cycle from view: only the facade and the CLI
    may defer one (so that `grpolab --help` does not import torch)."""
    local = [f"{src} line {line} imports {dst}" for src, dst, line, inside in import_graph() if inside and src not in LAZY_OK and (src, dst) not in LAZY_PAIRS]
    assert local == []


@pytest.mark.parametrize("name", ["algo", "config", "commands"])
def test_the_graph_reader_sees_imports(name):
    """The reader itself finds real edges (so the tests above cannot pass on an empty graph)."""
    assert any(_unit(src) == name for src, *_ in import_graph())
