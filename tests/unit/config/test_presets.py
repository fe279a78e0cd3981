"""Each algo.name resolves to its paper's recipe (config/presets.py); explicit settings win."""

import pytest
import yaml

from grpolab.config import ALGO_PRESETS, config_from_dict, dump_config, load_config

# Written from the papers (arXiv ids in config/sections.py), not read back from ALGO_PRESETS:
# name: (advantage, loss_agg, policy_loss, importance_level, kl_in, kl_estimator, beta, clip_low, clip_high,
#        mu, num_minibatches, dynamic_sampling, mask_truncated)
RECIPES = {
    "grpo": ("grpo", "seq-mean-token-mean", "clip", "token", "loss", "k3", 0.04, 0.2, 0.2, 1, 1, False, False),
    "dr_grpo": ("dr_grpo", "seq-mean-token-sum-norm", "clip", "token", "loss", "k3", 0.0, 0.2, 0.2, 1, 1, False, False),
    "dapo": ("grpo", "token-mean", "clip", "token", "loss", "k3", 0.0, 0.2, 0.28, 1, 16, True, True),
    "gspo": ("grpo", "seq-mean-token-mean", "clip", "sequence", "loss", "k3", 0.0, 3e-4, 4e-4, 1, 4, False, False),
    "cispo": ("grpo", "token-mean", "cispo", "token", "loss", "k3", 0.0, 1.0, 4.0, 1, 16, False, False),
    "rloo": ("rloo", "seq-mean-token-sum", "clip", "token", "reward", "k1", 0.05, 0.2, 0.2, 1, 1, False, False),
    "online_rft": ("online_rft", "seq-mean-token-mean", "clip", "token", "loss", "k3", 0.0, 0.2, 0.2, 1, 1, False, False),
    "reinforce_pp": ("reinforce_pp", "token-mean", "clip", "token", "reward", "k1", 0.01, 0.2, 0.2, 1, 2, False, False),
    "reinforce_pp_baseline": (
        "reinforce_pp_baseline", "token-mean", "clip", "token", "loss", "k2", 1e-3, 0.2, 0.2, 1, 1, False, False,
    ),
    "ppo": ("gae", "seq-mean-token-mean", "clip", "token", "reward", "k1", 0.04, 0.2, 0.2, 1, 2, False, False),
}  # fmt: skip
FIELDS = (
    "advantage", "loss_agg", "policy_loss", "importance_level", "kl_in", "kl_estimator", "beta", "clip_low",
    "clip_high", "mu", "num_minibatches", "dynamic_sampling", "mask_truncated",
)  # fmt: skip


def _load(*overrides):
    return load_config(None, ["train.prompts_per_step=16", *overrides])


def test_every_preset_has_a_recipe_and_they_all_differ():
    assert set(RECIPES) == set(ALGO_PRESETS)
    assert len(set(RECIPES.values())) == len(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_preset_resolves_to_its_papers_recipe(name):
    algo = _load(f"algo.name={name}").algo
    assert tuple(getattr(algo, f) for f in FIELDS) == RECIPES[name]


def test_explicit_settings_win_and_the_printed_config_holds_resolved_values():
    cfg = _load("algo.name=dapo", "algo.beta=0.01", "algo.dynamic_sampling=false", "algo.clip_low=0.1")
    a = cfg.algo
    assert (a.beta, a.dynamic_sampling, a.clip_low, a.clip_high) == (0.01, False, 0.1, 0.28)
    printed = yaml.safe_load(dump_config(cfg))["algo"]
    assert all(printed[f] is not None for f in FIELDS)
    assert printed["num_minibatches"] == 16 and printed["beta"] == 0.01
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg  # config.yaml reloads to the same run
    # a symmetric preset clip follows clip_low when only clip_low is set
    assert _load("algo.clip_low=0.1").algo.clip_high == 0.1


def test_reinforce_pp_needs_no_group():
    assert _load("algo.name=reinforce_pp", "rollout.num_generations=1").algo.advantage == "reinforce_pp"


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_presets_resolve(name):
    overrides = [f"algo.name={name}", "train.prompts_per_step=16"]
    cfg = load_config(None, overrides)
    assert cfg.algo.advantage == ALGO_PRESETS[name]["advantage"]
    assert cfg.algo.loss_agg == ALGO_PRESETS[name]["loss_agg"]


def test_explicit_fields_win_over_presets_and_derived_values():
    cfg = load_config(
        None,
        [
            "algo.name=dapo",
            "algo.loss_agg=seq-mean-token-mean",
            "algo.clip_high=0.28",
            "train.prompts_per_step=4",
            "rollout.num_generations=16",
            "algo.mu=2",
            "algo.num_minibatches=1",
        ],
    )
    assert cfg.algo.loss_agg == "seq-mean-token-mean"
    assert cfg.algo.clip_high == 0.28 and cfg.algo.clip_low == 0.2
    assert cfg.derived()["completions_per_step"] == 64
    assert cfg.derived()["optimizer_steps_per_generation"] == 2
