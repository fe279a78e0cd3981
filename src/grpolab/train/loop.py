"""The GRPO training loop: sample a group per prompt, score, compute advantages, update, log, checkpoint.

Read top to bottom, ``train`` is DeepSeekMath Algorithm 1's inner loop (one outer iteration):
pi_old <- pi_theta; sample G outputs per question; reward; group-relative advantages; mu updates.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpolab.config import Config, ConfigError, config_to_dict, dump_config
from grpolab.data import PromptSampler, load_examples, split_eval, tokenize_prompts
from grpolab.envs.setup import environment_from_config, episode_sampler
from grpolab.inference import limit_cpu_threads
from grpolab.models import Reference, count_parameters, load_policy, resolve_autocast, resolve_device
from grpolab.rewards import dry_run
from grpolab.rollout.hf import sampler_from_config
from grpolab.run import checkpoint as ckpt
from grpolab.run import dist, parallel, sharded
from grpolab.run.guards import BadSteps, GracefulStop, NoSignal
from grpolab.run.lock import hold_run_dir
from grpolab.run.logging import RunLogger, peak_memory_mb
from grpolab.run.preflight import (
    build_rewards,
    check_context,
    check_model_source,
    clear_previous_run,
    prepare_run_dir,
)
from grpolab.run.progress import Progress
from grpolab.run.resume import record_resume
from grpolab.run.run_info import write_run_info
from grpolab.run.trackers import check_trackers
from grpolab.train.batch import LogprobContext, length_by_correctness
from grpolab.train.gold import GoldMonitor, build_gold_rewards
from grpolab.train.optim import apply_optim_config, build_optimizer
from grpolab.train.ppo import Critic, rollout_batch_builder
from grpolab.train.process import build_process_supervision
from grpolab.train.sampling import sample_step
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
    with GracefulStop() as stop, dist.session(resolve_device(cfg.model).type), _run_dir_lock(cfg):
        return _train(cfg, resume=resume, stop=stop)


def _run_dir_lock(cfg: Config):
    """One writer per run dir (run/lock.py): under torchrun the rank that writes it, rank 0, holds it."""
    return hold_run_dir(cfg.run_dir) if dist.is_main() else contextlib.nullcontext()


def _train(cfg: Config, *, resume: bool, stop: GracefulStop) -> TrainResult:
    run_dir = cfg.run_dir
    mode = parallel.resolve_parallel(cfg.train.parallel, dist.world().size)
    dist.check_divisible(cfg.train.prompts_per_step)
    # rank 0 checks the run dir (checkpoint verified, config changes checked) and tells the others
    point = dist.broadcast_object(prepare_run_dir(cfg, resume=resume) if dist.is_main() else None)
    resume_from = point.path if point is not None else None
    check_model_source(cfg.model)
    rewards = build_rewards(cfg)
    make_env = environment_from_config(cfg.env)  # None: one completion per prompt (docs/multiturn.md)
    check_trackers(cfg.log.trackers)
    gold_rewards = build_gold_rewards(cfg)  # logged, never in the advantages (train/gold.py)
    examples, _eval_examples = split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)
    _dry_run(cfg, rewards, examples)
    _dry_run(cfg, gold_rewards, examples)
    _seed_everything(cfg.seed)
    baseline_mem_mb = peak_memory_mb(resolve_device(cfg.model))  # before any model loads

    model, tok = load_policy(cfg.model)
    device = resolve_device(cfg.model)
    amp = resolve_autocast(cfg.model, device)
    if device.type == "cpu":
        limit_cpu_threads()  # no more threads than the cores this process may use
    reference = Reference(model, amp) if cfg.algo.needs_reference else None
    fsdp_compute = torch.bfloat16 if cfg.model.dtype == "bfloat16" else None
    reference = parallel.wrap_reference(reference, mode, fsdp_compute)
    plain, model = model, parallel.wrap(model, mode, device, compute_dtype=fsdp_compute)  # before the optimizer
    parallel.log_layout(mode)
    prompt_ids = tokenize_prompts(examples, tok, cfg.data, make_env)
    check_context(cfg, prompt_ids, plain.config)
    process = build_process_supervision(cfg, tok, examples)  # None unless algo.supervision=process

    sharded_weights = parallel.is_sharded(model)  # no low-precision copy of sharded weights
    sampler = sampler_from_config(plain, tok, cfg.rollout, autocast_dtype=amp, cast_weights=False if sharded_weights else None)
    sampler = parallel.sampler_for(sampler, model)
    sampler = episode_sampler(sampler, tok, make_env, cfg.env)  # multi-turn episodes when env.name is set
    optimizer, scheduler = build_optimizer(model, cfg)
    spec = PolicyLossSpec.from_config(cfg)
    ctx = LogprobContext(
        tok.pad_token_id, cfg.rollout.temperature, amp, cfg.train.micro_batch_size, cfg.train.max_tokens_per_micro_batch
    )
    critic = Critic.from_config(cfg, device, ctx) if cfg.algo.needs_critic else None  # PPO's value model
    make_batch = rollout_batch_builder(cfg, critic)
    gold = GoldMonitor.from_config(cfg, gold_rewards, plain, reference, ctx, amp)
    data = PromptSampler(len(examples), seed=cfg.seed, shuffle=cfg.data.shuffle)
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed + dist.world().rank)  # each rank its own
    minibatch_gen = torch.Generator().manual_seed(cfg.seed + 1)

    bad_steps = BadSteps(cfg.train.max_bad_steps, run_dir)
    no_signal = NoSignal.from_config(cfg)  # zero-std / no-valid-reward steps in a row (run/guards.py)
    resumable = _Resumable(
        model, tok, optimizer, scheduler, reference, data, sample_gen, minibatch_gen, critic, bad_steps, no_signal
    )
    start = resumable.restore(resume_from, cfg) if resume_from is not None else 0
    if dist.is_main() and point is not None:
        record_resume(cfg, point, start)
    elif dist.is_main():
        clear_previous_run(cfg)  # log.overwrite: only now, every check passed
    run_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_main():
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
    logger = RunLogger(
        run_dir,
        resume_step=start if resume_from else None,
        report_to=cfg.log.trackers,
        project=cfg.log.project,
        run_name=cfg.log.run_name,
        config=config_to_dict(cfg),
    )
    _announce(cfg, model, reference, gold, start)

    metrics: dict[str, float] = {}
    progress = Progress(
        total=cfg.train.num_steps, start=start, enabled=cfg.log.progress and dist.is_main(), title=cfg.algo.name.upper()
    )
    last_step = start
    for step in range(start + 1, cfg.train.num_steps + 1):
        if dist.any_rank(stop.requested):  # SIGINT / SIGTERM: the previous step saved a checkpoint
            break
        t0 = time.perf_counter()
        drawn = sample_step(  # one round, or DAPO's dynamic-sampling rounds (train/sampling.py)
            cfg, sampler=sampler, rewards=rewards, data=data, examples=examples, prompt_ids=prompt_ids,
            generator=sample_gen,
        )  # fmt: skip
        rows, completions, scores = drawn.rows, drawn.completions, drawn.scores
        reward_t, valid = drawn.rewards, drawn.valid
        batch_examples = [examples[i] for i in rows]
        repeated = [e for e in batch_examples for _ in range(completions.num_generations)]
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
        metrics.update(gold.measure(completions, repeated, batch))
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
        metrics.update(drawn.metrics)
        metrics.update(
            {
                "sys/time_reference_s": t3 - t2,
                "sys/time_training_s": t4 - t3,
                "sys/step_time_s": t4 - t0,
                "sys/peak_mem_mb": peak_memory_mb(device),
                "sys/samples_seen": data.drawn * cfg.rollout.num_generations,  # dynamic sampling's rounds too
            }
        )
        metrics = dist.reduce_metrics(metrics)
        logger.log(step, metrics)
        if cfg.log.samples_every and step % cfg.log.samples_every == 0:
            rows_out = _sample_rows(batch_examples, completions, scores, batch.advantages)
            logger.samples(step, gold.annotate(rows_out))
        bad_steps.observe(step, metrics.get("train/skipped_updates", 0.0), model)  # raises to stop the run
        no_signal.observe(step, metrics)  # raises after train.max_no_signal_steps steps without signal
        if cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0 and reference is not None:
            reference.reset_to(parallel.unwrap(model))
        every = cfg.log.checkpoint_every
        if step == cfg.train.num_steps or (every and step % every == 0) or dist.any_rank(stop.requested):
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


def _sample_rows(examples, completions, scores, advantages) -> list[dict[str, Any]]:
    g = completions.num_generations
    return [
        {
            "prompt": examples[i // g].prompt,
            "completion": completions.texts[i],
            "reward": scores.total[i],
            **{f"reward/{name}": values[i] for name, values in scores.components.items()},
            "advantage": float(advantages[i, 0]) if advantages.shape[1] else 0.0,
            "finish_reason": completions.finish_reasons[i],
            "num_tokens": int(completions.lengths[i]),
        }
        for i in range(completions.num_sequences)
    ]


def _announce(cfg: Config, model, reference, gold: GoldMonitor, start: int) -> None:
    kind = "frozen copy or adapter-disabled base"  # with beta=0, loaded only to measure train/kl_seq (gold.py)
    described = kind if reference is not None else f"{kind}, measuring the KL only (beta=0)" if gold.active else "none (beta=0)"
    info = {
        **cfg.derived(),
        "policy_parameters": count_parameters(model),
        "trainable_parameters": count_parameters(model, trainable_only=True),
        "reference": described,
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
    no_signal: NoSignal

    @property
    def sharded(self) -> bool:
        """Several processes, or FSDP: DCP checkpoints written by every rank (run/sharded.py)."""
        return dist.world().size > 1 or parallel.is_sharded(self.model)

    def _dcp_parts(self, cfg: Config, step: int):
        models = {"model": self.model}
        optimizers = {"optimizer": (self.model, self.optimizer)}
        reset = cfg.algo.ref_reset_every
        if self.reference is not None and self.reference.frozen_model is not None and reset and step >= reset:
            models["reference"] = self.reference.frozen_model
        if self.critic is not None:
            models["value"] = self.critic.model
            optimizers["value_optimizer"] = (self.critic.model, self.critic.optimizer)
        return models, optimizers

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
            "no_signal": self.no_signal.state_dict(),
        }
        if self.sharded:
            state.pop("optimizer")
            if self.critic is not None:
                state["critic"] = {k: v for k, v in self.critic.state_dict().items() if k != "optimizer"}
            models, optimizers = self._dcp_parts(cfg, step)
            sharded.save(
                cfg.run_dir, step, models=models, optimizers=optimizers, state=state,
                tokenizer=self.tokenizer, keep_last=cfg.log.keep_last,
            )
            return
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
            files={"config.yaml": dump_config(cfg)},  # what this checkpoint was trained with (run/resume.py)
        )

    def restore(self, path: Path, cfg: Config) -> int:
        """Load the checkpoint at ``path`` in place; returns its step. cfg's learning rate then applies."""
        if self.sharded:
            if not sharded.is_sharded_checkpoint(path):
                raise ConfigError(f"{path} is a one-process checkpoint; this job runs {dist.world().size} processes: resume it without torchrun")
            models, optimizers = self._dcp_parts(cfg, sharded.saved_step(path))
            state = sharded.load(path, models=models, optimizers=optimizers)
        else:
            ckpt.load_weights_into(self.model, path)
            if self.reference is not None and self.reference.frozen_model is not None:
                ckpt.load_extra(self.reference.frozen_model, path, "reference")
            state = ckpt.load_state(path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optim_config(self.optimizer, self.scheduler, cfg)  # --resume optim.lr=... takes effect
        self.data.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.sample_gen.set_state(state["sample_gen"])
        self.minibatch_gen.set_state(state["minibatch_gen"])
        self.bad_steps.load_state_dict(state.get("bad_steps", {}))
        self.no_signal.load_state_dict(state.get("no_signal", {}))
        if self.critic is not None and self.sharded:
            self.critic.load_state_dict({**state["critic"], "optimizer": self.critic.optimizer.state_dict()})
        elif self.critic is not None:
            if not ckpt.load_extra(self.critic.model, path, "value") or "critic" not in state:
                raise ConfigError(
                    f"checkpoint {path} has no value model (value.safetensors): it was not a PPO run, so "
                    f"algo.name={cfg.algo.name} cannot resume it; resume with the run's own algo.name"
                )
            self.critic.load_state_dict(state["critic"])
        if self.critic is not None:
            value_lr = cfg.algo.value_lr or cfg.optim.lr
            apply_optim_config(self.critic.optimizer, self.critic.scheduler, cfg, lr=value_lr)
        log.info("resumed from %s at step %d", path, state["step"])
        return int(state["step"])
