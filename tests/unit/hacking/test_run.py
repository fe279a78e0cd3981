"""The hacking grid: its runs, their order, and which ones a rerun skips."""

from __future__ import annotations

import json

import pytest

from grpolab.config import ConfigError, dump_config, load_config
from grpolab.commands.hacking import finished, grid_configs


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            "reward.functions=[{name: exact_match}]",
            "reward.gold=[{name: math_accuracy}]",
            "train.num_steps=3",
            f"log.output_dir={tmp_path}",
            "log.run_name=grid",
            *extra,
        ],
    )


def test_grid_is_seed_major_and_each_run_has_its_beta_seed_and_folder(tmp_path):
    configs = grid_configs(_cfg(tmp_path), betas=[0.0, 0.04], seeds=[1, 2])
    assert list(configs) == ["beta0_seed1", "beta0.04_seed1", "beta0_seed2", "beta0.04_seed2"]
    c = configs["beta0.04_seed2"]
    assert (c.algo.beta, c.seed, c.run_dir) == (0.04, 2, tmp_path / "grid" / "beta0.04_seed2")
    assert list(grid_configs(_cfg(tmp_path, "algo.beta=0.1", "seed=5"))) == ["beta0.1_seed5"]
    with pytest.raises(ConfigError, match="distinct"):
        grid_configs(_cfg(tmp_path), betas=[0.0, 0.0])
    with pytest.raises(ConfigError, match="needs reward.gold"):
        grid_configs(_cfg(tmp_path, "reward.gold=[]"))


def test_a_rerun_skips_only_runs_of_the_same_config_that_reached_the_last_step(tmp_path):
    cfg = grid_configs(_cfg(tmp_path), betas=[0.0], seeds=[0])["beta0_seed0"]
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    metrics = cfg.run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    assert not finished(cfg)  # stopped at step 2 of 3
    metrics.write_text(metrics.read_text() + json.dumps({"step": 3}) + "\n")
    assert finished(cfg)
    other = grid_configs(_cfg(tmp_path, "optim.lr=1e-5"), betas=[0.0], seeds=[0])["beta0_seed0"]
    assert not finished(other)  # same folder, another config
