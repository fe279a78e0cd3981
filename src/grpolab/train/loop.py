"""The GRPO training loop: sample a group per prompt, score, compute advantages, update, log, checkpoint.

Read top to bottom, ``train`` is DeepSeekMath Algorithm 1's inner loop (one outer iteration):
pi_old <- pi_theta; sample G outputs per question; reward; group-relative advantages; mu updates.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpolab.config import Config, dump_config
from grpolab.data import PromptSampler, load_examples, split_eval, tokenize_prompts
from grpolab.models import Reference, count_parameters, load_policy, resolve_autocast, resolve_device
from grpolab.rewards import build_reward, dry_run, score_batch
from grpolab.rollout.hf import HFSampler
from grpolab.train import checkpoint as ckpt
from grpolab.train.batch import (
    LogprobContext,
    build_rollout_batch,
    length_by_correctness,
    outcome_estimator,
    rewards_tensor,
)
from grpolab.train.logging import RunLogger, peak_memory_mb
from grpolab.train.optim import build_optimizer
from grpolab.train.progress import Progress
from grpolab.train.step import PolicyLossSpec, update_policy
from grpolab.types import Completion

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    final_step: int
    last_metrics: dict[str, float]


def train(cfg: Config, *, resume: bool = False) -> TrainResult:
    """Run GRPO (or a variant chosen by cfg.algo) and return where the run was written."""
    run_dir = cfg.run_dir
    resume_from = ckpt.latest_checkpoint(run_dir) if resume else None
    if resume and resume_from is None:
        log.warning("--resume: no checkpoint in %s, starting from step 0", run_dir)
    _seed_everything(cfg.seed)

    model, tok = load_policy(cfg.model)
    device = resolve_device(cfg.model)
    amp = resolve_autocast(cfg.model, device)
    reference = Reference(model) if cfg.algo.needs_reference else None
    examples, _eval_examples = split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)
    prompt_ids = tokenize_prompts(examples, tok, cfg.data)
    rewards = [build_reward(s.name, weight=s.weight, kwargs=s.kwargs) for s in cfg.reward.functions]
    if not rewards:
        raise ValueError("reward.functions is empty: name at least one reward, e.g. [{name: math_accuracy}]")
    _dry_run(cfg, rewards, examples)

    sampler = HFSampler(
        model,
        tok,
        max_completion_length=cfg.rollout.max_completion_length,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        autocast_dtype=amp,
        max_batch_sequences=cfg.rollout.max_batch_sequences,
    )
    optimizer, scheduler = build_optimizer(model, cfg)
    spec = PolicyLossSpec.from_config(cfg)
    estimator = outcome_estimator(cfg)
    ctx = LogprobContext(tok.pad_token_id, cfg.rollout.temperature, amp, cfg.train.micro_batch_size)
    data = PromptSampler(len(examples), seed=cfg.seed, shuffle=cfg.data.shuffle)
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed)
    minibatch_gen = torch.Generator().manual_seed(cfg.seed + 1)

    start = 0
    if resume_from is not None:
        start = _restore(resume_from, model, optimizer, scheduler, reference, data, sample_gen, minibatch_gen)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    logger = RunLogger(run_dir, tensorboard=cfg.log.tensorboard, resume_step=start if resume_from else None)
    _announce(cfg, model, reference, start)

    metrics: dict[str, float] = {}
    progress = Progress(total=cfg.train.num_steps, start=start, enabled=cfg.log.progress, title="GRPO")
    for step in range(start + 1, cfg.train.num_steps + 1):
        t0 = time.perf_counter()
        rows = data.next(cfg.train.prompts_per_step)
        batch_examples = [examples[i] for i in rows]
        completions = sampler.sample(
            [prompt_ids[i] for i in rows], num_generations=cfg.rollout.num_generations, generator=sample_gen
        )
        t1 = time.perf_counter()
        repeated = [e for e in batch_examples for _ in range(completions.num_generations)]
        scores = score_batch(rewards, completions.items(), repeated, timeout_s=cfg.reward.timeout_s)
        reward_t, valid = rewards_tensor(scores.total, len(rows), completions.num_generations)
        t2 = time.perf_counter()
        batch, metrics = build_rollout_batch(
            cfg,
            completions,
            [prompt_ids[i] for i in rows],
            reward_t,
            valid,
            estimator=estimator,
            policy=model,
            reference=reference,
            ctx=ctx,
        )
        t3 = time.perf_counter()
        metrics.update(
            update_policy(
                model,
                optimizer,
                scheduler,
                batch,
                cfg,
                spec,
                pad_id=tok.pad_token_id,
                autocast_dtype=amp,
                generator=minibatch_gen,
            )
        )
        t4 = time.perf_counter()
        metrics.update(length_by_correctness(completions, reward_t))
        metrics.update(_component_means(scores.components))
        metrics.update(
            {
                "sys/time_generation_s": t1 - t0,
                "sys/time_scoring_s": t2 - t1,
                "sys/time_reference_s": t3 - t2,
                "sys/time_training_s": t4 - t3,
                "sys/step_time_s": t4 - t0,
                "sys/peak_mem_mb": peak_memory_mb(device),
                "sys/samples_seen": step * cfg.completions_per_step,
            }
        )
        logger.log(step, metrics)
        if cfg.log.samples_every and step % cfg.log.samples_every == 0:
            logger.samples(step, _sample_rows(batch_examples, completions, scores.total, batch.advantages))
        if cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0 and reference is not None:
            reference.reset_to(model)
        if step == cfg.train.num_steps or (cfg.log.checkpoint_every and step % cfg.log.checkpoint_every == 0):
            _save(cfg, step, model, tok, optimizer, scheduler, reference, data, sample_gen, minibatch_gen)
        progress.update(step, reward=metrics["train/reward_mean"], step_time=t4 - t0)
    progress.close()
    logger.close()
    return TrainResult(run_dir=run_dir, final_step=cfg.train.num_steps, last_metrics=metrics)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _dry_run(cfg: Config, rewards, examples) -> None:
    """Check every reward on a few examples (reference answers and an empty completion) before training."""
    k = min(cfg.reward.dry_run_examples, len(examples))
    if k == 0:
        return
    picked = examples[:k]
    comps = [Completion(text=e.answer or "", num_tokens=max(len(e.answer or ""), 1)) for e in picked]
    comps.append(Completion(text="", num_tokens=1))
    dry_run(rewards, comps, [*picked, picked[0]], timeout_s=cfg.reward.timeout_s)


def _component_means(components: dict[str, list[float | None]]) -> dict[str, float]:
    out = {}
    for name, values in components.items():
        vals = [v for v in values if v is not None]
        out[f"train/reward/{name}"] = sum(vals) / len(vals) if vals else math.nan
    return out


def _sample_rows(examples, completions, totals, advantages) -> list[dict[str, Any]]:
    g = completions.num_generations
    return [
        {
            "prompt": examples[i // g].prompt,
            "completion": completions.texts[i],
            "reward": totals[i],
            "advantage": float(advantages[i, 0]) if advantages.shape[1] else 0.0,
            "finish_reason": completions.finish_reasons[i],
        }
        for i in range(completions.num_sequences)
    ]


def _announce(cfg: Config, model, reference, start: int) -> None:
    info = {
        **cfg.derived(),
        "policy_parameters": count_parameters(model),
        "trainable_parameters": count_parameters(model, trainable_only=True),
        "reference": "none (beta=0)" if reference is None else "frozen copy or adapter-disabled base",
        "start_step": start,
    }
    log.info("grpolab train: %s", json.dumps(info))


def _state(optimizer, scheduler, data, sample_gen, minibatch_gen, step: int) -> dict[str, Any]:
    return {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data": data.state_dict(),
        "rng": ckpt.rng_state(),
        "sample_gen": sample_gen.get_state(),
        "minibatch_gen": minibatch_gen.get_state(),
    }


def _save(cfg, step, model, tok, optimizer, scheduler, reference, data, sample_gen, minibatch_gen) -> None:
    extra = {}
    if reference is not None and cfg.algo.ref_reset_every and step >= cfg.algo.ref_reset_every:
        extra["reference"] = reference.frozen_model
    ckpt.save_checkpoint(
        cfg.run_dir,
        step,
        model=model,
        tokenizer=tok,
        keep_last=cfg.log.keep_last,
        extra_models=extra,
        state=_state(optimizer, scheduler, data, sample_gen, minibatch_gen, step),
    )


def _restore(path, model, optimizer, scheduler, reference, data, sample_gen, minibatch_gen) -> int:
    ckpt.load_weights_into(model, path)
    if reference is not None and reference.frozen_model is not None:
        ckpt.load_extra(reference.frozen_model, path, "reference")
    state = ckpt.load_state(path)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    data.load_state_dict(state["data"])
    ckpt.set_rng_state(state["rng"])
    sample_gen.set_state(state["sample_gen"])
    minibatch_gen.set_state(state["minibatch_gen"])
    log.info("resumed from %s at step %d", path, state["step"])
    return int(state["step"])
