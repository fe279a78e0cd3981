"""Never silently wrong in the config: YAML integers read as written, merge keys work, huge seeds are
refused. (The JSON, reward and prompt-order cases are in test_jsonio.py, runtime/test_logging.py,
rewards/test_base.py and test_data.py.)"""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError, load_config


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


def test_huge_integers_and_seeds_are_config_errors():
    with pytest.raises(ConfigError, match="seed=100000000000000000000 is too large"):
        load_config(None, ["seed=100000000000000000000"])
    with pytest.raises(ConfigError, match=r"config key 'train.num_steps' is an integer of 30 digits"):
        load_config(None, ["train.num_steps=" + "9" * 30])
    assert load_config(None, ["seed=9223372036854000000"]).seed == 9223372036854000000  # 63 bits still fit
