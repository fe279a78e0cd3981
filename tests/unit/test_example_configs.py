"""Every example config in configs/ loads and validates (no model is loaded)."""

from pathlib import Path

import pytest

from grpolab.config import load_config
from grpolab.rewards import build_reward

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_validates(path):
    cfg = load_config(path)
    assert cfg.model.name_or_path
    for spec in cfg.reward.functions:
        build_reward(spec.name, weight=spec.weight, kwargs=spec.kwargs)


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3
