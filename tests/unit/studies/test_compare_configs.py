"""grpolab compare's configs: each algorithm is the config ``grpolab train`` would run with algo.name set on
the same settings (the runs themselves are in tests/integration/test_compare.py)."""

from __future__ import annotations

import typing

import pytest

from grpolab.config import AlgoName, ConfigError, load_config
from grpolab.studies.compare import algo_config, validate_algos
from grpolab.studies.hacking import grid_configs

USER = ["train.prompts_per_step=16", "rollout.num_generations=4", "algo.mu=2", "optim.lr=2e-4"]
ALGOS = typing.get_args(AlgoName)


@pytest.mark.parametrize("start", ["grpo", "dapo"])
def test_every_algorithm_is_its_fresh_load(start, tmp_path):
    cfg = load_config(None, [*USER, f"algo.name={start}", f"log.output_dir={tmp_path}", "log.run_name=cmp"])
    configs = validate_algos(cfg, ALGOS)
    for name, derived in configs.items():
        fresh = load_config(
            None,
            [*USER, f"algo.name={name}", f"log.output_dir={tmp_path / 'cmp'}", f"log.run_name={name}",
             "log.progress=false"],
        )
        assert derived == fresh, name
        assert derived.algo.mu == 2 and derived.optim.lr == 2e-4  # the user's settings survive


def test_ppo_runs_its_presets_minibatches(tmp_path):
    cfg = load_config(None, [*USER, f"log.output_dir={tmp_path}"])
    assert algo_config(cfg, "ppo", tmp_path).algo.num_minibatches == 2
    assert algo_config(cfg, "gspo", tmp_path).algo.importance_level == "sequence"


def test_unknown_and_repeated_algorithms_are_refused(tmp_path):
    cfg = load_config(None, USER)
    with pytest.raises(ConfigError, match="unknown algorithm 'grpoo'"):
        validate_algos(cfg, ["grpo", "grpoo"])
    with pytest.raises(ConfigError, match="distinct"):
        validate_algos(cfg, ["grpo", "grpo"])


def test_hacking_grid_changes_beta_and_seed_only(tmp_path):
    cfg = load_config(None, [*USER, "algo.name=dapo", "reward.gold=[{name: exact_match}]", f"log.output_dir={tmp_path}"])
    grid = grid_configs(cfg, [0.0, 0.1], [0, 3])
    for run in grid.values():
        assert run.algo.clip_high == 0.28 and run.algo.num_minibatches == 16  # DAPO's, not reset
        assert run.optim == cfg.optim and run.algo.mu == 2
    assert sorted((r.algo.beta, r.seed) for r in grid.values()) == [(0.0, 0), (0.0, 3), (0.1, 0), (0.1, 3)]
