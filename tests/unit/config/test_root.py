"""The whole run config (config/root.py): a preset's minibatch count fitted to the prompts per step."""

import pytest
import yaml

from grpolab.config import ConfigWarning, config_from_dict, dump_config, load_config


def _text(caught) -> str:
    return "\n".join(str(w.message) for w in caught)


@pytest.mark.parametrize("name", ["dapo", "cispo"])
def test_a_16_minibatch_preset_runs_with_the_default_prompts_per_step(name):
    """16 minibatches cannot split 8 prompts into whole groups: the preset runs 8 and says what to set."""
    with pytest.warns(ConfigWarning) as caught:
        cfg = load_config(None, [f"algo.name={name}"])
    assert cfg.train.prompts_per_step == 8 and cfg.algo.num_minibatches == 8
    assert "set train.prompts_per_step=16 for the paper's 16 updates per rollout" in _text(caught)
    assert load_config(None, [f"algo.name={name}", "train.prompts_per_step=12"]).algo.num_minibatches == 12
    assert load_config(None, [f"algo.name={name}", "train.prompts_per_step=20"]).algo.num_minibatches == 10
    reloaded = config_from_dict(yaml.safe_load(dump_config(cfg)))
    assert reloaded == cfg  # config.yaml holds the count it ran
