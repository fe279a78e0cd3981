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
from grpolab.inference import limit_cpu_threads
from grpolab.models import Reference, count_parameters, load_policy, resolve_autocast, resolve_device
from grpolab.rewards import dry_run, score_batch
from grpolab.rollout.hf import sampler_from_config
from grpolab.run import checkpoint as ckpt
from grpolab.run.guards import BadSteps, GracefulStop
from grpolab.run.logging import RunLogger, peak_memory_mb
from grpolab.run.preflight import build_rewards, check_context, check_model_source, prepare_run_dir
from grpolab.run.progress import Progress
from grpolab.run.run_info import write_run_info
from grpolab.train.batch import LogprobContext, length_by_correctness, rewards_tensor
from grpolab.train.optim import build_optimizer
from grpolab.train.ppo import Critic, rollout_batch_builder
from grpolab.train.process import build_process_supervision
from grpolab.train.step import PolicyLossSpec, update_policy
from grpolab.types import Completion

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    final_step: int
    last_metrics: dict[str, float]
    stopped_by: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the run before train.num_steps, after a checkpoint."""


def train(cfg: Config, *, resume: bool = False) -> TrainResult:
    """Run GRPO (or a variant chosen by cfg.algo) and return where the run was written.

    SIGINT / SIGTERM while it runs: the current step finishes, a checkpoint is saved, and the result
    has ``stopped_by`` set (guards.py). Bad input fails before the model loads where it can.
    """
    with GracefulStop() as stop:
        return _train(cfg, resume=resume, stop=stop)


def _train(cfg: Config, *, resume: bool, stop: GracefulStop) -> TrainResult:
    run_dir = cfg.run_dir
    resume_from = prepare_run_dir(cfg, resume=resume)
    check_model_source(cfg.model)
    rewards = build_rewards(cfg)
    examples, _eval_examples = split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)
    _dry_run(cfg, rewards, examples)
    _seed_everything(cfg.seed)
    baseline_mem_mb = peak_memory_mb(resolve_device(cfg.model))  # before any model loads

    model, tok = load_policy(cfg.model)
    device = resolve_device(cfg.model)
    amp = resolve_autocast(cfg.model, device)
    if device.type == "cpu":
        limit_cpu_threads()  # no more threads than the cores this process may use
    reference = Reference(model, amp) if cfg.algo.needs_reference else None
    prompt_ids = tokenize_prompts(examples, tok, cfg.data)
    check_context(cfg, prompt_ids, model.config)
    process = build_process_supervision(cfg, tok, examples)  # None unless algo.supervision=process

    sampler = sampler_from_config(model, tok, cfg.rollout, autocast_dtype=amp)
    optimizer, scheduler = build_optimizer(model, cfg)
    spec = PolicyLossSpec.from_config(cfg)
    ctx = LogprobContext(tok.pad_token_id, cfg.rollout.temperature, amp, cfg.train.micro_batch_size)
    critic = Critic.from_config(cfg, device, ctx) if cfg.algo.needs_critic else None  # PPO's value model
    make_batch = rollout_batch_builder(cfg, critic)
    data = PromptSampler(len(examples), seed=cfg.seed, shuffle=cfg.data.shuffle)
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed)
    minibatch_gen = torch.Generator().manual_seed(cfg.seed + 1)

    bad_steps = BadSteps(cfg.train.max_bad_steps, run_dir)
    resumable = _Resumable(
        model, tok, optimizer, scheduler, reference, data, sample_gen, minibatch_gen, critic, bad_steps
    )
    start = resumable.restore(resume_from) if resume_from is not None else 0
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    write_run_info(
        cfg,
        policy=model,
        reference=reference,
        critic=critic,
        rewards=rewards,
        baseline_mem_mb=baseline_mem_mb,
        device=device,
    )
    logger = RunLogger(run_dir, tensorboard=cfg.log.tensorboard, resume_step=start if resume_from else None)
    _announce(cfg, model, reference, start)

    metrics: dict[str, float] = {}
    progress = Progress(
        total=cfg.train.num_steps, start=start, enabled=cfg.log.progress, title=cfg.algo.name.upper()
    )
    last_step = start
    for step in range(start + 1, cfg.train.num_steps + 1):
        if stop.requested:  # SIGINT / SIGTERM: the previous step saved a checkpoint
            break
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
        by_step = {} if process is None else {"steps": process.score(completions, repeated)}
        t2 = time.perf_counter()
        batch, metrics = make_batch(
            cfg,
            completions,
            [prompt_ids[i] for i in rows],
            reward_t,
            valid,
            policy=model,
            reference=reference,
            ctx=ctx,
            **by_step,
        )
        t3 = time.perf_counter()
        if critic is None or not critic.warming_up(step):
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
        if critic is not None:
            metrics.update(critic.update(batch))
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
        bad_steps.observe(step, metrics.get("train/skipped_updates", 0.0), model)  # raises to stop the run
        if cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0 and reference is not None:
            reference.reset_to(model)
        every = cfg.log.checkpoint_every
        if step == cfg.train.num_steps or (every and step % every == 0) or stop.requested:
            resumable.save(cfg, step)
        last_step = step
        progress.update(step, reward=metrics["train/reward_mean"], kl=metrics.get("loss/kl"), step_time=t4 - t0)
    progress.close()
    logger.close()
    stopped_by = stop.signum if last_step < cfg.train.num_steps else None
    return TrainResult(run_dir=run_dir, final_step=last_step, last_metrics=metrics, stopped_by=stopped_by)


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
        vals = torch.tensor([v for v in values if v is not None], dtype=torch.float64)
        out[f"train/reward/{name}"] = float(vals.mean()) if len(vals) else math.nan
        out[f"train/reward/{name}_std"] = float(vals.std()) if len(vals) > 1 else 0.0
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
            "num_tokens": int(completions.lengths[i]),
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


@dataclass
class _Resumable:
    """Everything a checkpoint must hold so that a resumed run continues exactly where it stopped."""

    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    reference: Reference | None
    data: PromptSampler
    sample_gen: torch.Generator
    minibatch_gen: torch.Generator
    critic: Critic | None
    bad_steps: BadSteps

    def save(self, cfg: Config, step: int) -> None:
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data": self.data.state_dict(),
            "rng": ckpt.rng_state(),
            "sample_gen": self.sample_gen.get_state(),
            "minibatch_gen": self.minibatch_gen.get_state(),
            "bad_steps": self.bad_steps.state_dict(),
        }
        extra = {}
        if self.reference is not None and cfg.algo.ref_reset_every and step >= cfg.algo.ref_reset_every:
            extra["reference"] = self.reference.frozen_model
        if self.critic is not None:  # PPO: the value model and its optimizer resume with the rest
            extra["value"] = self.critic.model
            state["critic"] = self.critic.state_dict()
        ckpt.save_checkpoint(
            cfg.run_dir,
            step,
            model=self.model,
            tokenizer=self.tokenizer,
            keep_last=cfg.log.keep_last,
            extra_models=extra,
            state=state,
        )

    def restore(self, path: Path) -> int:
        """Load the checkpoint at ``path`` in place; returns its step."""
        ckpt.load_weights_into(self.model, path)
        if self.reference is not None and self.reference.frozen_model is not None:
            ckpt.load_extra(self.reference.frozen_model, path, "reference")
        state = ckpt.load_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.sample_gen.set_state(state["sample_gen"])
        self.minibatch_gen.set_state(state["minibatch_gen"])
        self.bad_steps.load_state_dict(state.get("bad_steps", {}))
        if self.critic is not None:
            if not ckpt.load_extra(self.critic.model, path, "value") or "critic" not in state:
                raise FileNotFoundError(
                    f"checkpoint {path} has no value model (value.safetensors): was it a PPO run?"
                )
            self.critic.load_state_dict(state["critic"])
        log.info("resumed from %s at step %d", path, state["step"])
        return int(state["step"])
