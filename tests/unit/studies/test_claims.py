"""grpolab claims: its configs and checks (no model loads); the stages run in tests/integration/test_claims_cli.py."""

from __future__ import annotations

import os

import pytest

from grpolab.config import ClaimsConfig, ConfigError, load_config
from grpolab.studies.claims import check_claims, hacking_config, training_configs
from grpolab.studies.claims_data import g_run, run_name, seeds
from grpolab.studies.claims_start import warm_start_config

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
        ("claims.hacking_proxy={name: judge, kwargs: {template: 'no answer shown', base_url: 'http://127.0.0.1:9/v1', model: j}}",
         "claims.hacking_proxy[0] (name 'judge'): a judge template must show the answer"),
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


def test_overwrite_deletes_nothing_before_every_check_passed(tiny_model_dir, tmp_path):
    from grpolab.studies.claims import run_claims

    out = tmp_path / "claims"
    (out / "grpo" / "checkpoints" / "step_2").mkdir(parents=True)  # the previous run's
    bad = load_config(None, [f"model.name_or_path={tiny_model_dir}", f"log.output_dir={tmp_path}", "log.run_name=claims",
                             "log.overwrite=true", *BASE, "claims.group_sizes=[2, 8]"])  # fmt: skip
    with pytest.raises(ConfigError, match="must hold rollout.num_generations"):
        run_claims(bad)
    assert (out / "grpo" / "checkpoints" / "step_2").is_dir()


def _retrained(folder):
    """The checkpoint written again at the same path: new bytes, a later modification time (set, not slept for)."""
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    weights.write_bytes(b"retrained")
    os.utime(weights, ns=(before + 10**9, before + 10**9))


def test_a_model_retrained_upstream_is_evaluated_again_not_read_back(cfg, tmp_path, monkeypatch):
    """After optim.lr changed, the GRPO model was retrained into the same checkpoints/step_N, and its evaluations
    and KL were read back from the old one: the stamp now records the weights read."""
    from grpolab.studies import claims_stages

    measured = []

    def evaluate(cfg, models, labels, out_dir, progress):
        measured.append(models[0])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "eval.json").write_text("[]")
        return ["measured"]

    monkeypatch.setattr(claims_stages, "evaluate", evaluate)
    monkeypatch.setattr(claims_stages, "in_child", lambda what, fn, *args: fn(*args))  # the patch reaches no spawned child
    monkeypatch.setattr(claims_stages, "load_evals", lambda path: [f"eval.json after {len(measured)} evaluations"])
    model = tmp_path / "grpo" / "checkpoints" / "step_2"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"trained")
    folder = tmp_path / "eval" / "A_GRPO"
    assert claims_stages.stage_eval(cfg, str(model), "GRPO", folder) == "eval.json after 1 evaluations"
    assert claims_stages.stage_eval(cfg, str(model), "GRPO", folder) == "eval.json after 1 evaluations"  # the same weights
    _retrained(model)
    assert claims_stages.stage_eval(cfg, str(model), "GRPO", folder) == "eval.json after 2 evaluations"
    assert measured == [str(model), str(model)]


def test_the_runs_on_a_retrained_reward_model_are_trained_again(cfg, tmp_path, monkeypatch):
    from grpolab.studies import claims
    from grpolab.studies.claims_report import ClaimsData
    from grpolab.studies.hacking import HackingResult, grid_configs

    seen = []
    monkeypatch.setattr(claims, "hacking", lambda hack, betas, seeds, title: seen.append(hack) or HackingResult(tmp_path, {}))
    rm = tmp_path / "claims_rm"
    rm.mkdir()
    (rm / "model.safetensors").write_bytes(b"reward model")
    data = ClaimsData(cfg=cfg, start_model=cfg.model.name_or_path)
    [run] = grid_configs(claims.hacking_config(cfg, rm), cfg.claims.hacking_betas, [cfg.seed]).values()

    def trained():  # what a finished (or stopped) run leaves for hacking() to read back (or resume)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.yaml").write_text("the run's config")

    trained()
    claims._hacking_runs(cfg, data, rm)
    assert not (run.run_dir / "config.yaml").exists()  # no stamp yet: not read back
    assert seen[-1].log.overwrite  # claims' own runs: a changed setting trains them again, no refusal
    trained()
    claims._hacking_runs(cfg, data, rm)
    assert (run.run_dir / "config.yaml").exists()  # the same reward model: read back
    _retrained(rm)
    claims._hacking_runs(cfg, data, rm)
    assert not (run.run_dir / "config.yaml").exists()


def test_advice_to_resume_becomes_advice_claims_takes():
    from grpolab.errors import TrainingError
    from grpolab.studies.claims_stages import ClaimsError, claims_advice

    advice = r"--resume optim.lr=<lower> \[in grpolab claims, which takes no --resume: change the setting in the claims"
    with pytest.raises(ClaimsError, match=advice), claims_advice():
        raise TrainingError("weights became NaN; resume with grpolab train --resume optim.lr=<lower>")
    with pytest.raises(ConfigError, match="^other$"), claims_advice():
        raise ConfigError("other")


def test_a_training_stage_is_read_back_only_from_the_same_starting_weights(cfg, tmp_path, monkeypatch):
    from grpolab.studies import claims
    from grpolab.studies.compare import AlgoRun

    trained = []

    def train_in_child(run_cfg, out):
        trained.append(run_cfg.log.run_name)
        (run_cfg.run_dir / "checkpoints" / "step_2").mkdir(parents=True, exist_ok=True)
        (run_cfg.run_dir / "run_info.json").write_text("{}")
        return AlgoRun(run_cfg.log.run_name, run_cfg.run_dir, 1.5, {}, [])

    monkeypatch.setattr(claims, "train_in_child", train_in_child)
    monkeypatch.setattr(claims, "finished", lambda run_cfg: True)  # its config and metrics: the same run
    name = claims.run_name("grpo", cfg.seed)
    run = claims.training_configs(cfg, tmp_path)[name]
    claims._train(run, tmp_path, "start@1")
    assert claims._train(run, tmp_path, "start@1").wall_s == 1.5 and trained == [name]  # read back
    claims._train(run, tmp_path, "start@2")  # the starting model changed at the same path
    assert trained == [name, name]


JUDGE = "{name: judge, kwargs: {base_url: 'http://127.0.0.1:9/v1', model: j, template: 'Grade {completion}'}}"


def test_a_judge_as_claim_5s_proxy_replaces_the_reward_model(cfg, tmp_path, monkeypatch):
    from grpolab.studies import claims
    from grpolab.studies.claims_report import ClaimsData
    from grpolab.studies.hacking import HackingResult

    judged = load_config(None, [f"model.name_or_path={cfg.model.name_or_path}", f"log.output_dir={tmp_path}", *BASE,
                                f"claims.hacking_proxy={JUDGE}"])  # fmt: skip
    check_claims(judged)
    hack = hacking_config(judged, tmp_path / "rm")
    assert [s.name for s in hack.reward.functions] == ["judge"] and hack.reward.functions[0].kwargs["model"] == "j"
    assert [s.name for s in hack.reward.gold] == ["exact_match"]  # the rule reward watches the judge
    assert claims.proxy_label(judged) == "judge" and claims.proxy_label(cfg) == "reward model"

    def no_reward_model(*args):
        raise AssertionError("no reward model is trained when claims.hacking_proxy is set")

    run_dir = tmp_path / "hack_run"
    monkeypatch.setattr(claims, "_reward_model", no_reward_model)
    monkeypatch.setattr(claims, "hacking", lambda hack, betas, seeds, title: HackingResult(tmp_path, {"beta0_seed0": run_dir}))
    monkeypatch.setattr(claims, "_final", lambda path: str(path))
    monkeypatch.setattr(claims, "_kl", lambda *args: {"kl": 1.0})
    data = ClaimsData(cfg=judged, start_model=judged.model.name_or_path)
    claims._hacking(judged, judged, data)
    assert data.hacking_runs["judge, beta0_seed0"] == str(run_dir)
    assert data.kl["GRPO (judge, beta0_seed0)"] == {"kl": 1.0}
