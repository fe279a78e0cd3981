"""The settings a user wrote are kept, and every derived config is resolved from them (config/resolve.py,
``derive`` in config/loading.py): switching algo.name gives the new preset wherever the user left a field
unset, and keeps every value the user set."""

from __future__ import annotations

import dataclasses

import pytest

from grpolab.config import (
    ALGO_PRESETS,
    ConfigError,
    config_from_dict,
    derive,
    dump_config,
    load_config,
    user_settings,
)
from grpolab.config.resolve import fill_preset, fit_minibatches, resolve_settings
from grpolab.config.view import render_view

BASE = ["train.prompts_per_step=16", "rollout.num_generations=4"]


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_switching_the_algorithm_equals_a_fresh_load(name):
    derived = derive(load_config(None, [*BASE, "algo.name=grpo"]), {"algo.name": name})
    fresh = load_config(None, [*BASE, f"algo.name={name}"])
    assert derived == fresh
    assert derived.algo == fresh.algo  # the section the old compare got wrong (beta, clips, minibatches)


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_a_value_the_user_set_survives_the_switch(name):
    user = [*BASE, "algo.beta=0.02", "algo.mu=2", "algo.clip_low=0.1", "optim.lr=3e-4"]
    derived = derive(load_config(None, [*user, "algo.name=grpo"]), {"algo.name": name})
    assert derived == load_config(None, [*user, f"algo.name={name}"])
    a = derived.algo
    assert (a.beta, a.mu, a.clip_low, derived.optim.lr) == (0.02, 2, 0.1, 3e-4)
    assert a.advantage == ALGO_PRESETS[name]["advantage"] and a.num_minibatches == ALGO_PRESETS[name]["num_minibatches"]


def test_the_issues_table_dapo_from_grpo():
    """The fields the old compare kept from GRPO under DAPO's name, each now DAPO's."""
    a = derive(load_config(None, BASE), {"algo.name": "dapo"}).algo
    assert (a.beta, a.clip_high, a.num_minibatches, a.mask_truncated, a.dynamic_sampling) == (0.0, 0.28, 16, True, True)


def test_deriving_twice_keeps_the_first_change():
    cfg = derive(derive(load_config(None, BASE), {"algo.name": "ppo"}), {"optim.lr": 1e-3})
    assert cfg.algo.name == "ppo" and cfg.optim.lr == 1e-3 and cfg.algo.num_minibatches == 2


def test_a_config_changed_after_it_was_built_cannot_be_derived():
    cfg = load_config(None, BASE)
    changed = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, beta=0.5))
    assert user_settings(changed) is None
    with pytest.raises(ConfigError, match="no longer matches the settings"):
        derive(changed, {"algo.name": "dapo"})


def test_settings_are_what_the_user_wrote_and_not_a_config_key():
    cfg = load_config(None, [*BASE, "algo.name=gspo", "algo.beta=0.01"])
    assert cfg.settings == {"train": {"prompts_per_step": 16}, "rollout": {"num_generations": 4},
                            "algo": {"name": "gspo", "beta": 0.01}}
    assert "settings" not in dump_config(cfg)
    assert config_from_dict(cfg.settings) == cfg
    with pytest.raises(ConfigError, match="unknown config key 'settings'"):
        load_config(None, ["settings.x=1"])
    assert cfg.from_preset("algo.clip_low") and not cfg.from_preset("algo.beta")


def test_fill_preset_by_hand():
    filled, keys = fill_preset({"name": "dapo", "beta": None, "clip_low": 0.1})
    assert filled["beta"] == 0.0 and filled["clip_low"] == 0.1 and filled["clip_high"] == 0.28
    assert "beta" in keys and "clip_low" not in keys
    sym, _ = fill_preset({"name": "grpo", "clip_low": 0.1})
    assert sym["clip_high"] == 0.1  # a symmetric preset clip follows the user's clip_low


def test_a_fitted_minibatch_count_is_the_presets_only():
    algo = {"num_minibatches": 16}
    assert fit_minibatches(algo, {"prompts_per_step": 12}, frozenset({"num_minibatches"}))
    assert algo["num_minibatches"] == 12
    mine = {"num_minibatches": 16}
    assert fit_minibatches(mine, {"prompts_per_step": 12}, frozenset()) == [] and mine["num_minibatches"] == 16
    resolved, notes = resolve_settings({"algo": {"name": "cispo"}, "train": {"prompts_per_step": 20}})
    assert resolved["algo"]["num_minibatches"] == 10 and len(notes) == 1


def test_grpolab_config_names_the_preset_values():
    text = render_view(load_config(None, [*BASE, "algo.name=dapo", "algo.beta=0.01"]))
    assert "  beta: 0.01\n" in text
    assert "  clip_high: 0.28  # algo.name=dapo preset\n" in text
    assert "  num_minibatches: 16  # algo.name=dapo preset\n" in text
