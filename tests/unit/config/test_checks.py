"""The checks of a config (config/checks.py): finite numbers, the range table, the checks across fields
(each error names the key and the fix), and the settings that do less than they say (ConfigWarning)."""

import pytest

from grpolab.config import (
    Config,
    ConfigError,
    ConfigWarning,
    OptimConfig,
    RewardConfig,
    RewardSpec,
    inert_settings,
    load_config,
)
from grpolab.config.checks import numeric_fields


def _load(*overrides):
    return load_config(None, ["train.prompts_per_step=16", *overrides])


def _text(caught) -> str:
    return "\n".join(str(w.message) for w in caught)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.num_generations=1"], "needs at least 2 per prompt"),
        (["algo.num_minibatches=3"], "make train.prompts_per_step (8) divisible by algo.num_minibatches"),
        (["algo.beta=-1"], "algo.beta must be >= 0"),
        (["rollout.top_p=0"], "rollout.top_p must be in (0, 1]"),
        (["algo.dual_clip=0.5"], "algo.dual_clip must be > 1"),
        (["algo.advantage=gae"], "needs a value model"),
        (["train.max_failed_group_share=1.5"], "train.max_failed_group_share must be in [0, 1]"),
        (["train.max_failed_group_share=-0.1"], "train.max_failed_group_share must be in [0, 1]"),
        (["reward.max_retries=-1"], "reward.max_retries must be >= 0 (0 = no retry)"),
        (["env.max_retries=-1"], "env.max_retries must be >= 0 (0 = no retry)"),
    ],
)
def test_bad_configs_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_huge_integers_and_seeds_are_config_errors():
    with pytest.raises(ConfigError, match="seed=100000000000000000000 is too large"):
        load_config(None, ["seed=100000000000000000000"])
    with pytest.raises(ConfigError, match=r"config key 'train.num_steps' is an integer of 30 digits"):
        load_config(None, ["train.num_steps=" + "9" * 30])
    assert load_config(None, ["seed=9223372036854000000"]).seed == 9223372036854000000  # 63 bits still fit


def test_an_explicit_minibatch_count_is_never_changed():
    with pytest.raises(Exception, match=r"or set algo.num_minibatches \(the 'dapo' preset uses 16\)"):
        load_config(None, ["algo.name=dapo", "algo.num_minibatches=16"])


def test_inert_clip_settings_are_warned_at_load():
    with pytest.warns(ConfigWarning) as caught:
        cfg = _load("algo.name=dapo", "algo.num_minibatches=1")
    assert "the ratio clip with Clip-Higher (algo.clip_low=0.2, algo.clip_high=0.28) cannot act" in _text(caught)
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
        (["algo.sapo_temperature_neg=2"], "algo.sapo_temperature_neg=2 have no effect unless algo.policy_loss=sapo"),
        (["algo.vespo_k_pos=1"], "algo.vespo_k_pos=1 have no effect unless algo.policy_loss=vespo"),
        (["algo.policy_loss=sapo", "algo.clip_high=0.28", "algo.mu=2"], "have no effect with algo.policy_loss=sapo"),
        (["algo.policy_loss=sapo"], "so SAPO's soft gate (algo.sapo_temperature_pos / _neg"),
        (["algo.policy_loss=vespo"], "so VESPO's gamma weight (algo.vespo_*"),
        (["algo.loss_agg_batch_rows=4"], "algo.loss_agg_batch_rows=4 has no effect unless algo.loss_agg=batch-token-mean"),
        (["algo.entropy_target=3"], "algo.entropy_target=3 have no effect unless algo.entropy_adaptive=true"),
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


@pytest.mark.parametrize(
    ("agg", "warned"),
    [("token-mean", True), ("seq-mean-token-sum-norm", True), ("seq-mean-token-sum", True), ("seq-mean-token-mean", False),
     ("batch-token-mean", True)],
)
def test_gspo_with_a_loss_that_sums_tokens_is_warned_in_trls_words(agg, warned):
    """TRL warns for its dapo / dr_grpo / bnpo / cispo losses with importance_sampling_level='sequence'."""
    rows = ["algo.loss_agg_batch_rows=2"] if agg == "batch-token-mean" else []
    messages = inert_settings(_load("algo.name=gspo", f"algo.loss_agg={agg}", *rows))
    said = [m for m in messages if "weights each sequence by its completion length" in m]
    assert len(said) == int(warned)
    if warned:
        assert f"algo.loss_agg={agg}" in said[0] and "set algo.loss_agg=seq-mean-token-mean" in said[0]


def test_cispo_at_sequence_level_runs_and_is_warned_as_trl_warns():
    """TRL's loss_type=cispo with importance_sampling_level='sequence': a warning, and it runs (algo/losses.py)."""
    messages = inert_settings(_load("algo.name=cispo", "algo.importance_level=sequence", "algo.num_minibatches=2"))
    assert any("weights each sequence by its completion length" in m for m in messages)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.name=dapo", "rollout.num_generations=1"], "needs at least 2 per prompt"),
        (["algo.max_sampling_rounds=0"], "algo.max_sampling_rounds must be >= 1"),
        (["algo.rollout_correction=tis", "algo.rollout_correction_cap=0"], "rollout_correction_cap must be > 0"),
        (["algo.entropy_coef=-0.1"], "algo.entropy_coef must be >= 0"),
        (["algo.name=cispo", "algo.dual_clip=3"], "algo.policy_loss=cispo clips an IS weight"),
        (["algo.off_policy_mask_threshold=-0.1"], r"algo.off_policy_mask_threshold must be >= 0"),
        (["algo.top_entropy_quantile=1.5"], r"algo.top_entropy_quantile must be in \[0, 1\]"),
        (["algo.policy_loss=sapo", "algo.sapo_temperature_neg=0"], "algo.sapo_temperature_neg must be > 0"),
        (["algo.policy_loss=sapo", "algo.dual_clip=3"], "algo.policy_loss=sapo has no hard clip"),
        (["algo.policy_loss=vespo", "algo.importance_level=sequence"], "algo.policy_loss=vespo builds its own"),
        (["algo.policy_loss=vespo", "algo.vespo_k_neg=-1"], "algo.vespo_k_pos, _lambda_pos, _k_neg and _lambda_neg"),
        (["algo.advantage=gdpo", "algo.kl_in=reward"], "algo.advantage=gdpo normalises each reward function apart"),
        (["rollout.min_p=1.5"], r"rollout.min_p must be in \[0, 1\]"),
        (["rollout.repetition_penalty=0"], "rollout.repetition_penalty must be > 0"),
        (["algo.loss_agg=batch-token-mean"], "needs algo.loss_agg_batch_rows >= 1"),
        (["algo.entropy_adaptive=true", "algo.entropy_coef=2"], "algo.entropy_coef <= algo.entropy_coef_max"),
        (["algo.entropy_adaptive=true", "algo.entropy_coef_delta=0"], "algo.entropy_coef_delta must be > 0"),
        (["model.lora.enabled=true", "model.lora.target_modules=[]"], "model.lora adapts nothing"),
        (["model.lora.enabled=true", "model.lora.target_parameters=[mlp.experts.down_proj]", "train.parallel=fsdp"],
         "model.lora.target_parameters with train.parallel=fsdp is not supported"),
        (["model.compile=true", "train.parallel=fsdp"], "model.compile=true with train.parallel=fsdp is not supported yet"),
        (["model.compile=true", "train.sequence_parallel=2"],
         "model.compile=true with train.sequence_parallel=2 is not supported yet: set model.compile=false"),
    ],
)  # fmt: skip
def test_new_fields_are_checked(overrides, message):
    with pytest.raises(Exception, match=message):
        _load(*overrides)


def test_every_number_of_the_config_is_walked_nested_ones_included():
    cfg = Config(reward=RewardConfig(functions=(RewardSpec("a", 2.0), RewardSpec("b", 0.5))))
    found = dict(numeric_fields(cfg))
    assert found["reward.functions[1].weight"] == 0.5 and found["optim.betas[0]"] == 0.9
    assert "log.tensorboard" not in found  # bools are not numbers here
    with pytest.raises(ConfigError, match=r"'reward.functions\[1\].weight' is inf"):
        Config(reward=RewardConfig(functions=(RewardSpec("a"), RewardSpec("b", float("inf")))))
    with pytest.raises(ConfigError, match="'optim.lr' is nan"):
        Config(optim=OptimConfig(lr=float("nan")))


@pytest.mark.parametrize("name", ["", ".", "..", " ", "a/b", "../x", "a\\b"])
def test_a_run_name_that_is_not_a_plain_folder_name_is_refused(name):
    """The run directory is output_dir/run_name, and log.overwrite deletes in it: "" or "." was output_dir itself."""
    with pytest.raises(ConfigError, match=r"log.run_name=.* is not a folder name: .*put the parent folder in log.output_dir"):
        load_config(None, [f"log.run_name={name!r}", "log.overwrite=true"])
