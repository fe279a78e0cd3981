"""``grpolab claims``: the seeds' claims (DeepSeekMath, DeepSeek-R1) measured on one model, one report.

Every experiment shares the config's model, task, prompts and train.num_steps; ``claims:`` names what differs
(configs/smollm2_claims.yaml; docs/claims.md says how the real run is sized). Stages, in order:

0. With ``claims.warm_start``: ``grpolab sft`` on the task's answer format until format errors are rare
   (studies/claims_start.py); the warm-started model is the starting model of every stage below, and the
   original model's Pass@K / Maj@K on the task's own prompts are measured too (the format finding).
1. The starting model's Pass@K / Maj@K (eval.num_samples, e.g. 64) on ``claims.eval_prompts`` held-out
   prompts of each kind (the config's task, and ``claims.hard_params``), graded by the task's rewards and by
   eval.blind_grader, and its greedy accuracy on all of the task's held-out prompts of each seed.
2. ``grpolab train`` in a subprocess each (its peak memory its own, studies/compare.py), once per seed of
   ``claims.seeds``: GRPO at rollout.num_generations, PPO with a critic of the policy's size, and GRPO at each
   other G of ``claims.group_sizes``; every run logs the rule reward as reward.gold too (the contrast of claim 5).
3. Greedy accuracy of each G's final model (claim 2); Pass@K / Maj@K of the first seed's GRPO model (claim 4).
4. k1, k3 and the exact KL on the GRPO model's samples against the starting model (claim 3), sampled by the
   hf engine whatever rollout.engine, so that the samples are exactly pi.
5. Preference pairs from the starting model's own samples, labelled by the rule reward; ``train-rm``
   from the starting model (a new one-output head); GRPO on that reward model alone, the rule reward as
   reward.gold, for each ``claims.hacking_betas`` (studies/hacking.py); its KL measured as in 4. With
   ``claims.hacking_proxy`` (a judge, docs/rewards.md) the runs train on that proxy instead, and no reward
   model is trained.
6. ``claims.md`` with a section, figure and verdict per claim (studies/claims_report.py).

A stage whose result is on disk for the same config, made from the same weights (a retrained model upstream
is another model: its evaluations and KL are measured again), is read back, not redone, so an interrupted run
continues where it stopped (``grpolab claims`` again); ``log.overwrite=true`` starts over.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from grpolab import jsonio
from grpolab.commands.train_rm import PreferencePair, train_reward_model, write_pairs
from grpolab.config import Config, ConfigError, config_to_dict, derive
from grpolab.config.view import config_view
from grpolab.data import DataError, load_examples, split_eval, tokenize_prompts
from grpolab.eval.kl import measure_kl
from grpolab.eval.runner import blind_grader
from grpolab.models.sources import local_source
from grpolab.rewards import build_rewards
from grpolab.rollout.base import without_failures
from grpolab.rollout.engines import build_sampler
from grpolab.runtime.assemble import load_model, split_examples
from grpolab.runtime.checkpoint import latest_checkpoint, weights_id
from grpolab.runtime.engine_spec import engine_spec
from grpolab.runtime.eval_spec import build_grader, kl_sampler
from grpolab.runtime.logging import read_metrics
from grpolab.runtime.preflight import check_model_source
from grpolab.studies.child import in_child
from grpolab.studies.claims_data import ClaimsData, g_run, grpo_name, run_name, seeds
from grpolab.studies.claims_report import write_claims_report
from grpolab.studies.claims_stages import ClaimsError as ClaimsError  # the verb's error, importable from here
from grpolab.studies.claims_stages import claims_advice, stage_eval, stage_text, stamp, stamped, timed
from grpolab.studies.claims_start import check_warm_start, warm_start
from grpolab.studies.compare import AlgoRun, algo_config, summarise, train_in_child
from grpolab.studies.hacking import HackingResult, finished, grid_configs, hacking

log = logging.getLogger(__name__)


def check_claims(cfg: Config) -> None:
    """Every check that needs no model, before the first stage: a bad key fails in seconds."""
    c = cfg.claims
    if cfg.rollout.num_generations not in c.group_sizes:
        raise ConfigError(
            f"claims.group_sizes={list(c.group_sizes)} must hold rollout.num_generations="
            f"{cfg.rollout.num_generations} (its run is claim 1's GRPO run)"
        )
    if cfg.eval.num_samples < 2 or cfg.data.eval_size < c.eval_prompts:
        raise ConfigError(
            f"claims needs eval.num_samples >= 2 (e.g. 64) and data.eval_size >= claims.eval_prompts "
            f"({cfg.data.eval_size} < {c.eval_prompts})"
        )
    if not cfg.reward.functions:
        raise ConfigError("claims needs reward.functions: the rule reward that grades and labels the pairs")
    if cfg.eval.blind_grader is None:
        raise ConfigError(
            "claims needs eval.blind_grader (e.g. answer_anywhere): claim 4 is judged where format is not what "
            "decides a sample, with the rule reward's curves reported beside"
        )
    check_warm_start(cfg)
    check_model_source(cfg.model)
    build_rewards(cfg.reward.functions)
    if c.hacking_proxy is not None:
        build_rewards([c.hacking_proxy], key="claims.hacking_proxy")
    blind_grader(cfg.eval.blind_grader)
    for seed in seeds(cfg):  # each seed draws its own problems
        split_eval(load_examples(cfg.data, seed=seed), cfg.data.eval_size)
    if c.hard_params:
        try:
            split_eval(load_examples(hard_data(cfg).data, seed=cfg.seed), cfg.data.eval_size)
        except DataError as err:
            raise ConfigError(f"claims.hard_params={dict(c.hard_params)} (the harder held-out kind): {err}") from err
    training_configs(cfg, cfg.run_dir)  # each run's config is built, so checked
    grid_configs(hacking_config(cfg, Path("reward_model")), c.hacking_betas, [cfg.seed])


def hard_data(cfg: Config) -> Config:
    return derive(cfg, {"data.params": dict(cfg.claims.hard_params)})


def _gold(cfg: Config) -> list[dict[str, Any]]:
    """reward.gold as settings: the config's gold reward, or its rule reward when it names none."""
    return config_to_dict(cfg.reward.gold or cfg.reward.functions)


def experiments(cfg: Config) -> dict[str, dict[str, Any]]:
    """Claims 1 and 2 by name: GRPO (rollout.num_generations), PPO, GRPO at the other G (algo, changes)."""
    runs: dict[str, dict[str, Any]] = {"grpo": {"algo.name": "grpo"}, "ppo": {"algo.name": "ppo"}}
    for g in cfg.claims.group_sizes:
        if g != cfg.rollout.num_generations:
            runs[grpo_name(g)] = {"algo.name": "grpo", "rollout.num_generations": g}
    return runs


def training_configs(cfg: Config, out: Path) -> dict[str, Config]:
    """Every experiment of ``experiments`` at every seed, seed-major, named by run_name; the rule reward as gold.
    Each is derived from the user's settings with algo.name switched (compare.algo_config), so PPO runs its
    own preset wherever the user left a field unset."""
    base = derive(cfg, {"reward.gold": _gold(cfg), "log.checkpoint_every": 0, "log.keep_last": 1, "claims": {}})
    runs = {}
    for seed in seeds(cfg):
        for name, changes in experiments(cfg).items():
            changes = {**changes, "seed": seed, "log.run_name": run_name(name, seed)}
            runs[run_name(name, seed)] = algo_config(base, changes.pop("algo.name"), out, changes)
    return runs


def hacking_config(cfg: Config, rm_dir: Path) -> Config:
    """Claim 5: GRPO on the reward model (or claims.hacking_proxy) alone, the rule reward as gold, from the
    starting model."""
    c = cfg.claims
    out = cfg.run_dir / "hacking"
    proxy = config_to_dict(c.hacking_proxy) if c.hacking_proxy else {"name": "reward_model", "kwargs": {"path": str(rm_dir)}}
    return derive(
        cfg,
        {
            "claims": {},
            "reward.functions": [proxy],
            "reward.gold": _gold(cfg),
            "optim.lr": c.hacking_lr or cfg.optim.lr,
            "train.num_steps": c.hacking_steps or cfg.train.num_steps,
            "log.output_dir": str(out.parent),
            "log.run_name": out.name,
            "log.checkpoint_every": 0,
            "log.overwrite": True,  # claims' own runs: a changed setting retrains them (studies/claims.py, _hacking)
        },
    )


def run_claims(cfg: Config) -> tuple[Path, ClaimsData]:
    """Run every stage (module docstring) and write the report; returns (claims.md, its data)."""
    check_claims(cfg)
    out = cfg.run_dir
    if cfg.log.overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    data = ClaimsData(cfg=cfg, start_model=local_source(cfg.model.name_or_path))
    start = _starting_model(cfg, data)
    for name, run_cfg in training_configs(start, out).items():
        with timed(data, f"train {name}"), claims_advice():
            data.runs[name] = _summary(_train(run_cfg, out, weights_id(data.start_model)))
    for seed in seeds(cfg):
        for g in sorted(cfg.claims.group_sizes):
            name = g_run(cfg, g, seed)
            with timed(data, f"greedy eval {name}"):
                _greedy(derive(start, {"seed": seed}), data, _final(out / name), f"G{g}_s{seed}")
    grpo = _final(out / run_name("grpo", cfg.seed))
    with timed(data, "evaluate the GRPO model"):
        _evaluate_kinds(start, data, grpo, "GRPO")
    exact = derive(start, {"rollout.engine": "hf"})  # claim 3 samples exactly pi: the trainer's own decoder
    with timed(data, "KL of the GRPO model"):
        data.kl["GRPO (rule reward)"] = _kl(exact, data.start_model, grpo, out / "kl" / "grpo.json")
    with claims_advice():
        _hacking(start, exact, data)
    report = write_claims_report(out, data)
    return report, data


def _starting_model(cfg: Config, data: ClaimsData) -> Config:
    """Stage 0 and 1: the warm start (claims.warm_start) and the starting model's evaluations; returns the
    config every later stage starts from (model.name_or_path the warm-started model, or cfg)."""
    start = cfg
    if cfg.claims.warm_start:
        with timed(data, "warm start"):
            start, data.warm_start = in_child("claims' warm start", warm_start, cfg)
        data.original_model, data.start_model = data.start_model, start.model.name_or_path
        with timed(data, "evaluate the original model"):  # the format finding, on the task's kind only: its
            _evaluate_kinds(cfg, data, data.original_model, "original", hard=False)  # long replies cost the most
    with timed(data, "evaluate the starting model"):
        _evaluate_kinds(start, data, data.start_model, "base")
        for seed in seeds(cfg):
            _greedy(derive(start, {"seed": seed}), data, data.start_model, f"base_s{seed}")
    return start


def proxy_label(cfg: Config) -> str:
    """What claim 5's runs train on, in the report: "reward model", or claims.hacking_proxy's name."""
    proxy = cfg.claims.hacking_proxy
    return "reward model" if proxy is None else (proxy.alias or proxy.name)


def _hacking(start: Config, exact: Config, data: ClaimsData) -> None:
    """Claim 5: the reward model from the starting model's samples (or claims.hacking_proxy), GRPO on it alone,
    the KL of each run."""
    out, label = start.run_dir, proxy_label(start)
    rm_dir = out / "reward_model"
    if start.claims.hacking_proxy is None:
        with timed(data, "reward model"):
            rm_dir = _reward_model(start, data)
    with timed(data, f"GRPO on the {label}"):
        result = _hacking_runs(start, data, rm_dir)
    for name, run_dir in result.run_dirs.items():
        data.hacking_runs[f"{label}, {name}"] = str(run_dir)
        with timed(data, f"KL of {name}"):
            data.kl[f"GRPO ({label}, {name})"] = _kl(
                exact, data.start_model, _final(run_dir), out / "kl" / f"rm_{name}.json"
            )
    data.hacking_runs["rule reward (contrast)"] = str(out / run_name("grpo", start.seed))


def _evaluate_kinds(cfg: Config, data: ClaimsData, model: str, label: str, *, hard: bool = True) -> None:
    """Claim 4: Pass@K / Maj@K on claims.eval_prompts prompts of each kind (A: the task, B: hard_params, unless
    ``hard`` is False)."""
    ev = {"eval.max_prompts": cfg.claims.eval_prompts, "eval.greedy": True}
    kinds = {"A": derive(cfg, ev)}
    if cfg.claims.hard_params and hard:
        kinds["B"] = derive(cfg, {**ev, "data.params": dict(cfg.claims.hard_params)})
    for kind, kind_cfg in kinds.items():
        data.evals[f"{kind}/{label}"] = stage_eval(kind_cfg, model, label, cfg.run_dir / "eval" / f"{kind}_{label}")


def _greedy(cfg: Config, data: ClaimsData, model: str, label: str) -> None:
    """Claim 2: greedy accuracy on every held-out prompt of the task (one sample each, for the record)."""
    ev = {"eval.num_samples": 1, "eval.ks": [1], "eval.greedy": True, "eval.max_prompts": 0}
    data.evals[f"greedy/{label}"] = stage_eval(derive(cfg, ev), model, label, cfg.run_dir / "eval" / f"greedy_{label}")


def _train(run_cfg: Config, out: Path, start: str) -> AlgoRun:
    """A finished run of this exact config (overwrite included: it is what the child saved) from the same starting
    weights (``start``: their weights_id) is read back."""
    run_cfg = derive(run_cfg, {"log.overwrite": True})
    wall_file = out / f"{run_cfg.log.run_name}.wall_s"
    done = finished(run_cfg) and wall_file.is_file() and latest_checkpoint(run_cfg.run_dir) is not None
    if done and stamped(run_cfg.run_dir, start):
        info = json.loads((run_cfg.run_dir / "run_info.json").read_text())
        return AlgoRun(run_cfg.log.run_name, run_cfg.run_dir, float(wall_file.read_text()), info, read_metrics(run_cfg.run_dir))
    run = train_in_child(run_cfg, out)
    wall_file.write_text(f"{run.wall_s}\n")
    stamp(run_cfg.run_dir, start)
    return run


def _hacking_runs(cfg: Config, data: ClaimsData, rm_dir: Path) -> HackingResult:
    """Claim 5's runs. They are claims' own, so a changed setting retrains them (log.overwrite); runs trained
    from other weights (a retrained reward model, another starting model) are neither read back nor resumed."""
    hack = hacking_config(cfg, rm_dir)
    proxy = config_to_dict(cfg.claims.hacking_proxy) if cfg.claims.hacking_proxy else weights_id(str(rm_dir))
    text = yaml.safe_dump({"start": weights_id(data.start_model), "reward_model": proxy})
    if not stamped(hack.run_dir, text):
        for run_cfg in grid_configs(hack, cfg.claims.hacking_betas, [cfg.seed]).values():
            (run_cfg.run_dir / "config.yaml").unlink(missing_ok=True)  # so not finished, not resumed: trained again
    title = f"claims: GRPO on a reward model made from {data.start_model}"
    if cfg.claims.hacking_proxy is not None:
        title = f"claims: GRPO from {data.start_model} on the proxy {proxy_label(cfg)}"
    result = hacking(hack, cfg.claims.hacking_betas, [cfg.seed], title=title)
    stamp(hack.run_dir, text)
    return result


def _summary(run: AlgoRun) -> dict[str, Any]:
    return {**summarise(run), "rows": run.metrics}


def _final(run_dir: Path) -> str:
    """The checkpoint of a run's last step (train saves it whatever log.checkpoint_every)."""
    final = latest_checkpoint(Path(run_dir))
    if final is None:
        raise ConfigError(f"{run_dir} holds no checkpoint: did its training finish?")
    return str(final)


def _kl(cfg: Config, start: str, policy_path: str, path: Path) -> dict[str, float]:
    """Claim 3 on one trained policy: k1, k3 and the exact KL against the starting model."""
    c = cfg.claims
    text = stage_text(cfg, weights_id(start), weights_id(policy_path), c.kl_prompts, c.kl_samples, "exact moments")
    if stamped(path.parent / path.stem, text) and path.is_file():
        return json.loads(path.read_text())
    measured = in_child(f"claims' KL of {policy_path}", _measure_kl, cfg, start, policy_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonio.write_whole(path, jsonio.dumps(measured, indent=1) + "\n")
    stamp(path.parent / path.stem, text)
    return measured


def _measure_kl(cfg: Config, start: str, policy_path: str) -> dict[str, float]:
    torch.manual_seed(cfg.seed)
    policy, tok = load_model(dataclasses.replace(cfg.model, name_or_path=policy_path))
    reference, _ = load_model(dataclasses.replace(cfg.model, name_or_path=start))
    _, held_out = split_examples(cfg)
    prompts = tokenize_prompts(held_out[: cfg.claims.kl_prompts], tok, cfg.data)
    return measure_kl(
        policy.eval(), reference.eval(), kl_sampler(cfg, policy, tok), prompts, num_generations=cfg.claims.kl_samples,
        seed=cfg.seed,
    ).to_json()


def preference_pairs(cfg: Config, model_path: str) -> tuple[list[PreferencePair], dict[str, Any]]:
    """Claim 5's comparisons: the starting model's own samples of claims.rm_prompts training prompts (G each,
    at rollout.temperature), each (right, wrong) couple of one prompt a pair, at most rm_pairs_per_prompt."""
    train_examples, _ = split_examples(cfg)
    examples = train_examples[: cfg.claims.rm_prompts]
    torch.manual_seed(cfg.seed)
    model, tok = load_model(dataclasses.replace(cfg.model, name_or_path=model_path))
    grader = build_grader(cfg)
    sampler = build_sampler(engine_spec(cfg), policy=model.eval(), tokenizer=tok, autocast_dtype=None)
    g = cfg.rollout.num_generations
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)
    prompt_ids = tokenize_prompts(examples, tok, cfg.data)
    pairs, with_both, right = [], 0, 0
    try:
        for start in range(0, len(examples), cfg.eval.prompts_per_batch):
            batch = examples[start : start + cfg.eval.prompts_per_batch]
            comps = without_failures(
                sampler.sample(prompt_ids[start : start + len(batch)], num_generations=g, generator=generator), "claims eval"
            )
            correct, _ = grader.grade(comps, batch)
            right += sum(correct)
            for p, example in enumerate(batch):
                texts, ok = comps.texts[p * g : (p + 1) * g], correct[p * g : (p + 1) * g]
                good = list(dict.fromkeys(t for t, c in zip(texts, ok, strict=True) if c))
                bad = list(dict.fromkeys(t for t, c in zip(texts, ok, strict=True) if not c))
                if good and bad:  # distinct couples: the longer list's index runs over distinct texts
                    with_both += 1
                    n = min(cfg.claims.rm_pairs_per_prompt, max(len(good), len(bad)))
                    pairs += [PreferencePair(example.prompt, good[i % len(good)], bad[i % len(bad)]) for i in range(n)]
    finally:
        sampler.close()
    stats = {"prompts": len(examples), "samples": len(examples) * g, "right_share": right / (len(examples) * g),
             "prompts_with_both": with_both, "pairs": len(pairs)}
    return pairs, stats


def _reward_model(cfg: Config, data: ClaimsData) -> Path:
    """Pairs from the starting model's samples, then train-rm from the starting model."""
    folder = cfg.run_dir / "reward_model"
    rm_full = derive(
        cfg,
        {
            "reward_model.base_model": data.start_model,
            "reward_model.data_path": str(cfg.run_dir / "rm_pairs.jsonl"),
            "reward_model.output_dir": str(folder),
        },
    )
    stats_path = cfg.run_dir / "rm_pairs.json"
    c = cfg.claims
    text = stage_text(cfg, config_view(rm_full, "train-rm"), weights_id(data.start_model), c.rm_prompts, c.rm_pairs_per_prompt)
    if stamped(cfg.run_dir / "rm_stamp", text) and (folder / "eval.json").is_file() and stats_path.is_file():
        data.reward_model = json.loads(stats_path.read_text())
        return folder
    pairs, stats = in_child("claims' preference pairs", preference_pairs, cfg, data.start_model)
    if len({p.prompt for p in pairs}) < 2:
        raise ConfigError(
            f"claims: only {stats['prompts_with_both']} of {stats['prompts']} prompts had a right and a wrong sample "
            "of the starting model; raise claims.rm_prompts or rollout.num_generations"
        )
    write_pairs(rm_full.reward_model.data_path, pairs)
    result = in_child("claims' reward model", train_reward_model, rm_full)
    stats |= {"history": result.history, "path": str(folder)}
    jsonio.write_whole(stats_path, jsonio.dumps(stats, indent=1) + "\n")
    stamp(cfg.run_dir / "rm_stamp", text)
    data.reward_model = stats
    return folder
