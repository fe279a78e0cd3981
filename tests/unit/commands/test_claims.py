"""grpolab claims: its configs and checks (no model loads); the stages run in tests/integration/test_claims.py."""

from __future__ import annotations

import pytest

from grpolab.commands.claims import check_claims, hacking_config, training_configs
from grpolab.commands.claims_data import g_run, run_name, seeds
from grpolab.commands.claims_start import warm_start_config
from grpolab.config import ClaimsConfig, ConfigError, load_config

BASE = [
    "data.source=arithmetic", "data.size=90", "data.params={digits: 1}", "data.eval_size=8",
    "rollout.num_generations=4", "reward.functions=[{name: exact_match}]", "eval.num_samples=8",
    "claims.group_sizes=[2, 4, 8]", "claims.eval_prompts=4", "optim.lr=1.0e-4", "eval.blind_grader=answer_anywhere",
]


@pytest.fixture
def cfg(tiny_model_dir, tmp_path):
    return load_config(None, [f"model.name_or_path={tiny_model_dir}", f"log.output_dir={tmp_path}", *BASE])


def test_training_runs_share_everything_but_the_algorithm_and_g(cfg, tmp_path):
    runs = training_configs(cfg, tmp_path)
    assert list(runs) == ["grpo_s0", "ppo_s0", "grpo_G2_s0", "grpo_G8_s0"]
    assert [r.rollout.num_generations for r in runs.values()] == [4, 4, 2, 8]
    assert runs["ppo_s0"].algo.name == "ppo" and runs["ppo_s0"].algo.needs_critic
    for run in runs.values():
        assert run.reward.gold == cfg.reward.functions  # the rule reward watched as gold: claim 5's contrast
        assert (run.train, run.data, run.seed, run.optim) == (cfg.train, cfg.data, cfg.seed, cfg.optim)
        assert run.run_dir == tmp_path / run.log.run_name
        assert run.claims == ClaimsConfig()  # a run does not read claims: changing them does not redo it
    assert [g_run(cfg, g, 0) for g in (2, 4)] == ["grpo_G2_s0", "grpo_s0"]  # claim 2's G=4 is claim 1's GRPO run


def test_each_seed_trains_every_run_seed_major(tiny_model_dir, tmp_path):
    cfg = load_config(None, [f"model.name_or_path={tiny_model_dir}", *BASE, "seed=5", "claims.seeds=3",
                             "claims.group_sizes=[2, 4]"])
    runs = training_configs(cfg, tmp_path)
    assert seeds(cfg) == [5, 6, 7] and list(runs)[:3] == ["grpo_s5", "ppo_s5", "grpo_G2_s5"]
    assert sorted(runs) == sorted(run_name(n, s) for n in ("grpo", "ppo", "grpo_G2") for s in (5, 6, 7))
    assert [runs[run_name("ppo", s)].seed for s in (5, 6, 7)] == [5, 6, 7]
    assert {r.optim for r in runs.values()} == {cfg.optim}


def test_the_warm_start_folder_names_what_it_reads(cfg, tmp_path):
    """A changed SFT setting trains a new model in a new folder (later stages, stamped with the folder, redo);
    a setting the SFT does not read leaves it."""
    common = [f"model.name_or_path={cfg.model.name_or_path}", f"log.output_dir={tmp_path}", *BASE]
    folder = warm_start_config(load_config(None, common)).sft_dir
    assert folder.parent == tmp_path / "run" and folder.name.startswith("warm_start_")
    assert warm_start_config(load_config(None, [*common, "train.num_steps=99", "claims.seeds=2"])).sft_dir == folder
    for changed in ("sft.lr=3e-4", "sft.target_format_errors=0.2", "eval.blind_grader=null", "seed=1"):
        assert warm_start_config(load_config(None, [*common, changed])).sft_dir != folder, changed


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
        ("eval.blind_grader=null", "claims needs eval.blind_grader (e.g. answer_anywhere)"),
        ("eval.blind_grader=nope", "eval.blind_grader='nope': unknown reward"),
        ("claims.warm_start=true", "claims.warm_start needs sft.target_format_errors"),
    ],
)
def test_bad_claims_settings_fail_before_any_model_loads(cfg, tiny_model_dir, override, message):
    bad = load_config(None, [f"model.name_or_path={tiny_model_dir}", *BASE, override])
    with pytest.raises(ConfigError) as err:
        check_claims(bad)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "override",
    ["claims.group_sizes=[1, 4]", "claims.group_sizes=[4, 4]", "claims.hacking_betas=[-1]", "claims.rm_prompts=1",
     "claims.seeds=0"],
)
def test_out_of_range_claims_keys_are_config_errors(override):
    with pytest.raises(ConfigError, match="claims."):
        load_config(None, [override])


@pytest.mark.parametrize("user", [[], ["algo.mu=2", "algo.beta=0.02"]])
def test_each_training_run_is_its_algorithms_fresh_load(tiny_model_dir, tmp_path, user):
    """PPO runs PPO's preset (2 minibatches) where the user left a field unset, and keeps what the user set."""
    common = [f"model.name_or_path={tiny_model_dir}", f"log.output_dir={tmp_path}", *BASE, *user]
    runs = training_configs(load_config(None, common), tmp_path)
    for name, algo in (("grpo_s0", "grpo"), ("ppo_s0", "ppo"), ("grpo_G2_s0", "grpo")):
        assert runs[name].algo == load_config(None, [*common, f"algo.name={algo}"]).algo, name
    assert runs["ppo_s0"].algo.num_minibatches == 2
    if user:
        assert {(r.algo.mu, r.algo.beta) for r in runs.values()} == {(2, 0.02)}
