"""grpolab claims: its configs and checks (no model loads); the stages run in tests/integration/test_claims.py."""

from __future__ import annotations

import pytest

from grpolab.commands.claims import check_claims, grpo_label, hacking_config, training_configs
from grpolab.config import ClaimsConfig, ConfigError, load_config

BASE = [
    "data.source=arithmetic", "data.size=90", "data.params={digits: 1}", "data.eval_size=8",
    "rollout.num_generations=4", "reward.functions=[{name: exact_match}]", "eval.num_samples=8",
    "claims.group_sizes=[2, 4, 8]", "claims.eval_prompts=4", "optim.lr=1.0e-4",
]


@pytest.fixture
def cfg(tiny_model_dir, tmp_path):
    return load_config(None, [f"model.name_or_path={tiny_model_dir}", f"log.output_dir={tmp_path}", *BASE])


def test_training_runs_share_everything_but_the_algorithm_and_g(cfg, tmp_path):
    runs = training_configs(cfg, tmp_path)
    assert list(runs) == ["grpo", "ppo", "grpo_G2", "grpo_G8"]
    assert [r.rollout.num_generations for r in runs.values()] == [4, 4, 2, 8]
    assert runs["ppo"].algo.name == "ppo" and runs["ppo"].algo.needs_critic
    for run in runs.values():
        assert run.reward.gold == cfg.reward.functions  # the rule reward watched as gold: claim 5's contrast
        assert (run.train, run.data, run.seed, run.optim) == (cfg.train, cfg.data, cfg.seed, cfg.optim)
        assert run.run_dir == tmp_path / run.log.run_name
        assert run.claims == ClaimsConfig()  # a run does not read claims: changing them does not redo it
    assert [grpo_label(cfg, n) for n in ("grpo", "grpo_G2")] == ["G4", "G2"]


def test_the_hacking_runs_train_on_the_reward_model_alone_and_watch_the_rule(cfg, tmp_path):
    hack = hacking_config(
        load_config(None, [f"model.name_or_path={cfg.model.name_or_path}", *BASE, "claims.hacking_lr=3e-4",
                           "claims.hacking_steps=7"]),
        tmp_path / "rm",
    )
    assert [s.name for s in hack.reward.functions] == ["reward_model"]
    assert hack.reward.functions[0].kwargs == {"path": str(tmp_path / "rm")}
    assert [s.name for s in hack.reward.gold] == ["exact_match"]
    assert hack.optim.lr == 3e-4 and hack.train.num_steps == 7


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("claims.group_sizes=[2, 8]", "claims.group_sizes=[2, 8] must hold rollout.num_generations=4"),
        ("claims.eval_prompts=20", "data.eval_size >= claims.eval_prompts (8 < 20)"),
        ("claims.hard_params={digitz: 2}", "claims.hard_params={'digitz': 2} (the harder held-out kind): "),
    ],
)
def test_bad_claims_settings_fail_before_any_model_loads(cfg, tiny_model_dir, override, message):
    bad = load_config(None, [f"model.name_or_path={tiny_model_dir}", *BASE, override])
    with pytest.raises(ConfigError) as err:
        check_claims(bad)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "override", ["claims.group_sizes=[1, 4]", "claims.group_sizes=[4, 4]", "claims.hacking_betas=[-1]", "claims.rm_prompts=1"]
)
def test_out_of_range_claims_keys_are_config_errors(override):
    with pytest.raises(ConfigError, match="claims."):
        load_config(None, [override])


def test_overwrite_deletes_nothing_before_every_check_passed(tiny_model_dir, tmp_path):
    from grpolab.commands.claims import run_claims

    out = tmp_path / "claims"
    (out / "grpo" / "checkpoints" / "step_2").mkdir(parents=True)  # the previous run's
    bad = load_config(None, [f"model.name_or_path={tiny_model_dir}", f"log.output_dir={tmp_path}", "log.run_name=claims",
                             "log.overwrite=true", *BASE, "claims.group_sizes=[2, 8]"])  # fmt: skip
    with pytest.raises(ConfigError, match="must hold rollout.num_generations"):
        run_claims(bad)
    assert (out / "grpo" / "checkpoints" / "step_2").is_dir()
