import pytest

from grpolab.config import ALGO_PRESETS, ConfigError, config_from_dict, dump_config, load_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.los_agg=token-mean"], "unknown config key 'algo.los_agg'; did you mean 'algo.loss_agg'?"),
        (["algo.loss_agg=token_mean"], "did you mean 'token-mean'?"),
        (["algo.name=grpoo"], "did you mean 'grpo'?"),
        (["rollout.num_generations=1"], "needs at least 2 per prompt"),
        (["train.prompts_per_step=many"], "'train.prompts_per_step' must be int, got 'many'"),
        (["algo.num_minibatches=3"], "make train.prompts_per_step (8) divisible by algo.num_minibatches"),
        (["algo.beta=-1"], "algo.beta must be >= 0"),
        (["rollout.top_p=0"], "rollout.top_p must be in (0, 1]"),
        (["algo.dual_clip=0.5"], "algo.dual_clip must be > 1"),
        (["algo.advantage=gae"], "needs a value model"),
        (["model=3"], "config key 'model' must be a mapping"),
        (["nonsense"], "must look like section.key=value"),
        (["optim.betas=[0.9]"], "needs 2 values, got 1"),
    ],
)
def test_bad_configs_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name_or_path: m\nalgo:\n  beta: 0.1\noptim:\n  lr: 1e-5\n")
    cfg = load_config(path, ["algo.beta=0.0", "reward.functions=[{name: exact_match, weight: 2}]"])
    assert cfg.algo.beta == 0.0 and cfg.optim.lr == 1e-5  # YAML reads 1e-5 as a string; coerced
    assert cfg.reward.functions[0].name == "exact_match" and cfg.reward.functions[0].weight == 2.0
    assert not cfg.algo.needs_reference
    again = config_from_dict(__import__("yaml").safe_load(dump_config(cfg)))
    assert again == cfg


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_presets_resolve(name):
    overrides = [f"algo.name={name}", "train.prompts_per_step=16"]
    cfg = load_config(None, overrides)
    assert cfg.algo.resolved_advantage == ALGO_PRESETS[name]["advantage"]
    assert cfg.algo.resolved_loss_agg == ALGO_PRESETS[name]["loss_agg"]


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
    assert cfg.algo.resolved_loss_agg == "seq-mean-token-mean"
    assert cfg.algo.resolved_clip_high == 0.28 and cfg.algo.clip_low == 0.2
    assert cfg.derived()["completions_per_step"] == 64
    assert cfg.derived()["optimizer_steps_per_generation"] == 2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.epsilon=0.2", "TRL's epsilon is the ratio clip: algo.clip_low (epsilon_high: algo.clip_high)"),
        ("train.max_steps=10", "TRL's max_steps is grpolab's train.num_steps"),
        ("optim.learning_rate=1e-6", "TRL's learning_rate is grpolab's optim.lr"),
        ("algo.loss_type=dapo", "TRL's loss_type is grpolab's algo.loss_agg"),
        ("algo.num_iterations=2", "TRL's num_iterations is grpolab's algo.mu"),
    ],
)
def test_an_unknown_key_that_is_a_trl_name_gets_the_grpolab_name(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "did you mean" not in str(err.value)  # not algo.eps / train.max_bad_steps


def test_a_reward_module_beside_the_config_imports_without_pythonpath(tmp_path, monkeypatch):
    import sys

    from grpolab.rewards import build_reward
    from grpolab.types import Completion, Example

    monkeypatch.setattr(sys, "path", list(sys.path))  # undone after the test
    (tmp_path / "beside_config_rewards.py").write_text(
        "def brevity(completions, **kwargs):\n    return [-len(c) / 10 for c in completions]\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  functions: [{name: 'beside_config_rewards:brevity'}]\n")
    cfg = load_config(config)
    reward = build_reward(cfg.reward.functions[0].name)
    assert reward.reward([Completion(text="abcd", num_tokens=4)], [Example(prompt="p")]) == [-0.4]
    assert sys.path[-1] == str(tmp_path)  # appended: installed packages keep precedence
