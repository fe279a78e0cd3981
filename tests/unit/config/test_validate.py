"""The config number walk (config/validate.py)."""

from __future__ import annotations

import pytest

from grpolab.config import Config, ConfigError, OptimConfig, RewardConfig, RewardSpec
from grpolab.config.validate import numeric_fields


def test_every_number_of_the_config_is_walked_nested_ones_included():
    cfg = Config(reward=RewardConfig(functions=(RewardSpec("a", 2.0), RewardSpec("b", 0.5))))
    found = dict(numeric_fields(cfg))
    assert found["reward.functions[1].weight"] == 0.5 and found["optim.betas[0]"] == 0.9
    assert "log.tensorboard" not in found  # bools are not numbers here
    with pytest.raises(ConfigError, match=r"'reward.functions\[1\].weight' is inf"):
        Config(reward=RewardConfig(functions=(RewardSpec("a"), RewardSpec("b", float("inf")))))
    with pytest.raises(ConfigError, match="'optim.lr' is nan"):
        Config(optim=OptimConfig(lr=float("nan")))
