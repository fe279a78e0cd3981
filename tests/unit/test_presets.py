"""Each algo.name resolves to its paper's recipe; explicit settings win; inert settings are flagged."""

import logging

import pytest
import yaml

from grpolab.config import ALGO_PRESETS, config_from_dict, dump_config, inert_settings, load_config

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


@pytest.mark.parametrize("name", ["dapo", "cispo"])
def test_a_16_minibatch_preset_runs_with_the_default_prompts_per_step(name, caplog):
    """16 minibatches cannot split 8 prompts into whole groups: the preset runs 8 and says what to set."""
    with caplog.at_level(logging.WARNING, logger="grpolab.config"):
        cfg = load_config(None, [f"algo.name={name}"])
    assert cfg.train.prompts_per_step == 8 and cfg.algo.num_minibatches == 8
    assert "set train.prompts_per_step=16 for the paper's 16 updates per rollout" in caplog.text
    assert load_config(None, [f"algo.name={name}", "train.prompts_per_step=12"]).algo.num_minibatches == 12
    assert load_config(None, [f"algo.name={name}", "train.prompts_per_step=20"]).algo.num_minibatches == 10
    reloaded = config_from_dict(yaml.safe_load(dump_config(cfg)))
    assert reloaded == cfg  # config.yaml holds the count it ran


def test_an_explicit_minibatch_count_is_never_changed():
    with pytest.raises(Exception, match=r"or set algo.num_minibatches \(the 'dapo' preset uses 16\)"):
        load_config(None, ["algo.name=dapo", "algo.num_minibatches=16"])


def test_inert_clip_settings_are_warned_at_load(caplog):
    with caplog.at_level(logging.WARNING, logger="grpolab.config"):
        cfg = _load("algo.name=dapo", "algo.num_minibatches=1")
    assert "the ratio clip with Clip-Higher (algo.clip_low=0.2, algo.clip_high=0.28) cannot act" in caplog.text
    messages = inert_settings(_load("algo.name=grpo", "algo.dual_clip=3.0", "algo.importance_level=sequence"))
    assert any("dual clip" in m for m in messages) and any("GSPO's sequence-level clip" in m for m in messages)
    assert any("CISPO" in m for m in inert_settings(_load("algo.name=cispo", "algo.num_minibatches=1")))
    # the presets that move the policy within a batch warn about nothing; neither does plain GRPO
    for name in ("dapo", "gspo", "cispo", "grpo", "dr_grpo"):
        assert inert_settings(_load(f"algo.name={name}")) == [], name
    assert cfg.algo.ratio_is_one


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.clip_low=0.1"], "so the symmetric ratio clip (algo.clip_low=algo.clip_high=0.1) cannot act"),
        (["algo.name=gspo", "algo.num_minibatches=1"], "so GSPO's sequence-level clip (algo.clip_low=0.0003, "
         "algo.clip_high=0.0004) cannot act"),
        (["algo.name=ppo", "algo.num_minibatches=1"], "so the value clip (algo.value_clip=0.2: the value model"),
        (["algo.max_sampling_rounds=3"], "algo.max_sampling_rounds=3 has no effect without dynamic sampling"),
        (["algo.rollout_correction_cap=5"], "algo.rollout_correction_cap=5.0 have no effect with algo.rollout_correction=none"),
        (["algo.rollout_correction_level=sequence"], "algo.rollout_correction_level=sequence have no effect"),
        (["algo.name=dapo", "algo.kl_estimator=k2"], "algo.kl_estimator=k2 has no effect with algo.beta=0"),
    ],
)
def test_each_inert_setting_is_named_by_its_own_key(overrides, message):
    messages = inert_settings(_load(*overrides))
    assert any(message in m for m in messages), messages
    assert not any("Clip-Higher" in m for m in messages if "GSPO" in message)  # GSPO's clip is not Clip-Higher


def test_presets_with_a_clip_update_in_minibatches_so_it_acts():
    for name in ("reinforce_pp", "ppo"):
        cfg = _load(f"algo.name={name}")
        assert not cfg.algo.ratio_is_one and inert_settings(cfg) == [], name
    cfg = _load("algo.name=grpo", "algo.kl_in=reward", "algo.kl_estimator=k2")
    assert inert_settings(cfg) == []  # the KL in the reward uses the estimator now (training/batch.py)


def test_gspo_with_token_mean_is_warned():
    messages = inert_settings(_load("algo.name=gspo", "algo.loss_agg=token-mean"))
    assert any("seq-mean-token-mean" in m for m in messages)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.name=dapo", "rollout.num_generations=1"], "needs at least 2 per prompt"),
        (["algo.max_sampling_rounds=0"], "algo.max_sampling_rounds must be >= 1"),
        (["algo.rollout_correction=tis", "algo.rollout_correction_cap=0"], "rollout_correction_cap must be > 0"),
        (["algo.entropy_coef=-0.1"], "algo.entropy_coef must be >= 0"),
        (["algo.name=cispo", "algo.importance_level=sequence"], "algo.importance_level=token"),
    ],
)
def test_new_fields_are_checked(overrides, message):
    with pytest.raises(Exception, match=message):
        _load(*overrides)


def test_reinforce_pp_needs_no_group():
    assert _load("algo.name=reinforce_pp", "rollout.num_generations=1").algo.advantage == "reinforce_pp"
