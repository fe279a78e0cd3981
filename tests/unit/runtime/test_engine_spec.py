"""runtime/engine_spec.py: the config read once into what a generation engine reads; rollout/ never sees the Config."""

from __future__ import annotations

import ast
from pathlib import Path

from grpolab.config import load_config
from grpolab.rollout.base import EngineSpec
from grpolab.runtime.engine_spec import engine_spec

BASE = ["rollout.max_completion_length=8", "data.max_prompt_length=16", "seed=7"]
SRC = Path(__file__).resolve().parents[3] / "src" / "grpolab"


def test_the_spec_holds_the_sections_and_limits_an_engine_reads():
    cfg = load_config(None, [*BASE, "rollout.engine=vllm", "vllm.max_num_seqs=3"])
    spec = engine_spec(cfg)
    assert isinstance(spec, EngineSpec)
    assert spec.model is cfg.model and spec.rollout is cfg.rollout and spec.section is cfg.vllm
    assert (spec.seed, spec.max_prompt_length, spec.max_episode_tokens) == (7, 16, 0)
    assert spec.section.max_num_seqs == 3 and spec.longest_sequence == 16 + 8


def test_hf_has_no_section_and_an_environment_adds_its_episode():
    spec = engine_spec(load_config(None, [*BASE, "env.name=calculator", "env.max_episode_tokens=40"]))
    assert spec.section is None  # the hf record names no section
    assert spec.max_episode_tokens == 40 and spec.longest_sequence == 16 + 40 + 8
    unused = engine_spec(load_config(None, [*BASE, "env.max_episode_tokens=40"]))  # no env.name: no episode
    assert unused.max_episode_tokens == 0 and unused.longest_sequence == 16 + 8


def _root_config_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("grpolab.config")
        and any(alias.name == "Config" for alias in node.names)
    ]


def test_nothing_in_rollout_imports_the_root_config():
    found = [hit for path in sorted((SRC / "rollout").rglob("*.py")) for hit in _root_config_imports(path)]
    assert not found, f"rollout/ reads the root Config (take an EngineSpec or a section): {found}"
    assert _root_config_imports(SRC / "runtime" / "engine_spec.py")  # the scan sees the import where there is one
