"""The hacking grid: its runs, their order, and which ones a rerun skips."""

from __future__ import annotations

import json

import pytest

from grpolab.config import ConfigError, dump_config, load_config
from grpolab.studies.hacking import finished, grid_configs


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


def test_a_stopped_run_continues_another_config_is_replaced_only_with_overwrite(tmp_path, monkeypatch):
    """The same command again: a run a signal stopped is resumed; checkpoints of another config are refused with
    advice this verb takes (log.overwrite, not train's --resume), and replaced with it."""
    import signal

    from grpolab.commands.train import TrainResult
    from grpolab.studies import hacking as hacking_mod
    from grpolab.studies.compare import CompareStopped

    calls = []

    def train(cfg, *, resume=False):
        calls.append((cfg.log.run_name, resume))
        return TrainResult(cfg.run_dir, 2, {}, stopped_by=signal.SIGTERM)

    monkeypatch.setattr(hacking_mod, "train", train)
    grid = _cfg(tmp_path)
    with pytest.raises(CompareStopped) as stopped:
        hacking_mod.hacking(grid, betas=[0.0, 0.04], seeds=[0])
    assert (stopped.value.signum, stopped.value.algo, stopped.value.skipped) == (signal.SIGTERM, "beta0_seed0", ["beta0.04_seed0"])
    assert calls == [("beta0_seed0", False)]

    cfg = grid_configs(grid, betas=[0.0], seeds=[0])["beta0_seed0"]
    (cfg.run_dir / "checkpoints" / "step_2").mkdir(parents=True)  # what the stopped run saved
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    with pytest.raises(CompareStopped):
        hacking_mod.hacking(grid, betas=[0.0], seeds=[0])
    assert calls[-1] == ("beta0_seed0", True)  # resumed

    changed = _cfg(tmp_path, "optim.lr=1e-5")
    with pytest.raises(ConfigError, match="set log.overwrite=true to train it again") as refused:
        hacking_mod.hacking(changed, betas=[0.0], seeds=[0])
    assert "--resume" not in str(refused.value)
    with pytest.raises(CompareStopped):
        hacking_mod.hacking(_cfg(tmp_path, "optim.lr=1e-5", "log.overwrite=true"), betas=[0.0], seeds=[0])
    assert calls[-1] == ("beta0_seed0", False)  # started over (train deletes the old checkpoints itself)
