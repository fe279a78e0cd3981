"""Reading a config (config/loading.py): YAML files and dotted overrides, keys and types checked, TRL
names, YAML numbers read as written, and every example config in configs/."""

from pathlib import Path

import pytest

from grpolab.config import ConfigError, config_from_dict, dump_config, load_config
from grpolab.rewards import build_reward

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.yaml"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.los_agg=token-mean"], "unknown config key 'algo.los_agg'; did you mean 'algo.loss_agg'?"),
        (["algo.loss_agg=token_mean"], "did you mean 'token-mean'?"),
        (["algo.name=grpoo"], "did you mean 'grpo'?"),
        (["train.prompts_per_step=many"], "'train.prompts_per_step' must be int, got 'many'"),
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


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_validates(path):
    cfg = load_config(path)
    assert cfg.model.name_or_path
    for spec in cfg.reward.functions:
        build_reward(spec.name, weight=spec.weight, kwargs=spec.kwargs)


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("train.num_steps=010", ("train", "num_steps"), 10),  # YAML 1.1 read 8 (octal)
        ("train.num_steps=0o10", ("train", "num_steps"), 8),  # an explicit base still works
        ("train.num_steps=0x10", ("train", "num_steps"), 16),
        ("train.num_steps=1_000", ("train", "num_steps"), 1000),
        ("seed=-007", ("seed",), -7),
        ("optim.lr=1e-5", ("optim", "lr"), 1e-5),
        ("log.run_name=1:30", ("log", "run_name"), "1:30"),  # YAML 1.1 read 90 (sexagesimal)
    ],
)
def test_yaml_numbers_read_as_written(override, key, value):
    cfg = load_config(None, [override])
    got = cfg
    for part in key:
        got = getattr(got, part)
    assert got == value and type(got) is type(value)


def test_yaml_integers_in_a_file_and_merge_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "train: {num_steps: 010, prompts_per_step: 04}\n"
        "reward:\n"
        "  functions:\n"
        "    - &em {name: exact_match, weight: 2.0}\n"
        "    - {<<: *em, alias: em_half, weight: 0.5}\n"
    )
    cfg = load_config(path)
    assert (cfg.train.num_steps, cfg.train.prompts_per_step) == (10, 4)
    first, second = cfg.reward.functions
    assert (first.name, first.weight, first.alias) == ("exact_match", 2.0, None)
    assert (second.name, second.weight, second.alias) == ("exact_match", 0.5, "em_half")  # explicit key wins
    path.write_text("algo: {beta: 0.1, beta: 0.2}\n")
    with pytest.raises(ConfigError, match="key 'beta' is given twice"):  # duplicates are still refused
        load_config(path)
