"""The GRPO training loop, DeepSeekMath Algorithm 1 (arXiv 2402.03300), one outer iteration.

``assemble`` (runtime/assemble.py) reads the config into a run: models, reference, rewards, data, sampler,
optimizer, resume point. Each step then follows the paper: sample G outputs per question with pi_old
(the sampler holds pi_theta's weights: pi_old <- pi_theta); compute their rewards; group-relative
advantages (or PPO's GAE with the critic); mu updates of pi_theta; the sampler takes the new weights;
log; checkpoint. The reference is reset to pi_theta every ``algo.ref_reset_every`` steps (the paper's
outer loop; DeepSeek-R1 resets every 400).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpolab.config import Config
from grpolab.distributed import dist, parallel
from grpolab.progress import Progress
from grpolab.rewards import WeightedReward
from grpolab.runtime.assemble import Models, Run, assemble, session
from grpolab.runtime.guards import GracefulStop, SamplerGap, sampling_guard
from grpolab.runtime.judges import close_judges
from grpolab.runtime.logging import PhaseMemory
from grpolab.training.ahead import AheadSampling, AheadSource, staleness_metrics
from grpolab.training.batch import length_by_reward, reward_parts, step_tokens
from grpolab.training.sampling import StepGroups, sample_step
from grpolab.training.step import update_policy
from grpolab.types import Example

log = logging.getLogger(__name__)

AfterStep = Callable[[int, dict[str, float]], bool]
"""``after_step(step, metrics) -> stop``: see ``train``."""


@dataclass
class TrainResult:
    run_dir: Path
    final_step: int
    last_metrics: dict[str, float]
    stopped_by: int | None = None
    """The signal (SIGINT, SIGTERM, SIGHUP) that stopped the run before train.num_steps, after a checkpoint."""
    start_step: int = 0
    """The last step done before this call: the resumed checkpoint's, 0 for a fresh run."""


def train(
    cfg: Config,
    *,
    resume: bool = False,
    rewards: Sequence[WeightedReward] | None = None,
    examples: Sequence[Example] | None = None,
    models: Models | None = None,
    after_step: AfterStep | None = None,
) -> TrainResult:
    """Run GRPO (or a variant chosen by cfg.algo) and return where the run was written.

    ``rewards`` / ``examples`` / ``models``: already built, in place of what ``cfg.reward.functions`` /
    ``cfg.data`` / ``cfg.model`` would build (runtime/assemble.py). SIGINT / SIGTERM while it runs: the current step finishes, a
    checkpoint is saved, and the result has ``stopped_by`` set (guards.py). Bad input fails before the
    model loads where it can. ``after_step(step, metrics)``, called once a step is logged (the Python API's
    callbacks and periodic evaluation), returning True ends the run after that step, with a checkpoint.
    """
    with GracefulStop() as stop, session(cfg):
        run = assemble(cfg, resume=resume, rewards=rewards, examples=examples, models=models)
        try:
            return _loop(run, stop, after_step)
        finally:
            run.sampler.close()
            run.reward_hooks.detach()
            close_judges(run.judges)


def _loop(run: Run, stop: GracefulStop, after_step: AfterStep | None) -> TrainResult:
    cfg = run.cfg
    ahead = None
    if cfg.rollout.mode == "server" and cfg.rollout.max_staleness > 0 and run.start < cfg.train.num_steps:
        # the next k steps' groups are sampled while this one trains (training/ahead.py)
        source = AheadSource(
            spec=run.sampling, sampler=run.sampler, rewards=run.rewards, examples=run.examples, prompt_ids=run.prompt_ids,
            prompt_order=run.prompt_order, generator=run.sampling_generator,
        )  # fmt: skip
        ahead = AheadSampling(
            source, first_step=run.start + 1, last_step=cfg.train.num_steps, max_staleness=cfg.rollout.max_staleness,
            sync_timeout_s=cfg.rollout.sync_timeout_s,
        )
    try:
        return _steps(run, stop, ahead, after_step)
    finally:
        if ahead is not None:
            ahead.close()


def _steps(run: Run, stop: GracefulStop, ahead: AheadSampling | None, after_step: AfterStep | None) -> TrainResult:
    cfg, metrics, last_step = run.cfg, {}, run.start
    title = cfg.algo.name.upper()
    progress = Progress(total=cfg.train.num_steps, start=run.start, enabled=cfg.log.progress and dist.is_main(), title=title)
    gap = SamplerGap(cfg.rollout.max_logprob_gap, cfg.run_dir)
    memory = PhaseMemory(run.device)
    for step in range(run.start + 1, cfg.train.num_steps + 1):
        if dist.any_rank(stop.requested):  # SIGINT / SIGTERM: the previous step saved a checkpoint
            break
        step_started = time.perf_counter()
        run.reward_hooks.begin_step(step)  # a TRL reward's trainer_state.global_step: the steps done
        waits: dict[str, float] = {}
        with memory.phase("rollout"), sampling_guard(cfg.model.name_or_path, step, cfg.run_dir):  # NaN logits: one line
            if ahead is not None:
                drawn, waits = ahead.take(step)
            else:
                drawn = sample_step(  # sample G outputs per prompt and reward them (DAPO's rounds: training/sampling.py)
                    run.sampling, sampler=run.sampler, rewards=run.rewards, data=run.prompt_order, examples=run.examples,
                    prompt_ids=run.prompt_ids, generator=run.sampling_generator,
                )  # fmt: skip
        lag = staleness_metrics(drawn, run.sampler)  # before this step's sync moves the trainer's version
        batch_examples = [run.examples[i] for i in drawn.rows]
        with memory.phase("reference"):
            batch_started, (batch, metrics) = _advantages(run, drawn, batch_examples)
        update_started = time.perf_counter()
        with memory.phase("train"):
            metrics.update(_update(run, batch, step, ahead))  # mu passes; then the sampler takes the new weights
        update_done = time.perf_counter()
        metrics.update(length_by_reward(drawn.completions, drawn.rewards, drawn.valid))
        run.resumable.num_tokens += int(dist.all_reduce_sum(float(step_tokens(drawn.completions))))
        metrics.update(_component_means(drawn.scores.components))
        metrics.update(drawn.metrics)
        metrics.update(lag)
        metrics.update(waits)
        metrics.update(
            {
                "sys/time_reference_s": update_started - batch_started,
                "sys/time_training_s": update_done - update_started,
                "sys/step_time_s": update_done - step_started,
                **memory.metrics(),  # peak allocated / reserved per phase on CUDA (runtime/logging.py)
                # dynamic sampling's rounds too; with k > 0 not the steps drawn ahead (training/ahead.py)
                "sys/samples_seen": (ahead.prompts_drawn(step) if ahead else run.prompt_order.drawn)
                * cfg.rollout.num_generations,
            }
        )
        metrics.update(_logged_by_rewards(run.reward_hooks.take_metrics(), metrics))  # TRL's log_metric
        metrics = dist.reduce_metrics(metrics)
        metrics["num_tokens"] = float(run.resumable.num_tokens)  # already summed over the ranks
        run.logger.log(step, metrics)
        extra = run.reward_hooks.take_extra()  # TRL's log_extra columns
        if cfg.log.samples_every and step % cfg.log.samples_every == 0:
            rows_out = _sample_rows(batch_examples, drawn.completions, drawn.scores, batch.advantages)
            run.logger.samples(step, run.gold.annotate(_with_columns(rows_out, extra)))
        run.bad_steps.observe(step, metrics.get("train/skipped_updates", 0.0), run.policy)  # raises to stop the run
        run.no_signal.observe(step, metrics)  # raises after train.max_no_signal_steps steps without signal
        gap.observe(step, metrics)  # raises when the sampler drifts from the policy (rollout.max_logprob_gap)
        if cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0 and run.reference is not None:
            run.reference.reset_to(parallel.unwrap(run.policy), cfg.algo.ref_mixup_alpha)  # pi_ref <- pi_theta (mixed)
        asked_to_stop = after_step is not None and dist.any_rank(bool(after_step(step, dict(metrics))))  # every rank stops
        every = cfg.log.checkpoint_every
        if step == cfg.train.num_steps or (every and step % every == 0) or asked_to_stop or dist.any_rank(stop.requested):
            with ahead.checkpoint_state(step + 1) if ahead is not None else contextlib.nullcontext():
                run.resumable.save(cfg, step)  # with k > 0: the draw state before the batches in flight
        last_step = step
        progress.update(step, reward=metrics["reward"], kl=metrics.get("kl"), step_time=update_done - step_started)
        if asked_to_stop:
            break
    progress.close()
    run.logger.close()
    stopped_by = stop.signum if last_step < cfg.train.num_steps else None
    return TrainResult(
        run_dir=cfg.run_dir, final_step=last_step, last_metrics=metrics, stopped_by=stopped_by, start_step=run.start
    )


def _advantages(run: Run, drawn: StepGroups, batch_examples: list[Example]):
    """(start time of the batch, (RolloutBatch, metrics)): the advantages of the sampled groups (group-relative,
    or PPO's GAE), the reference's log-probs, and the gold rewards and KL measured on them. Process
    supervision's step scores come first, outside the timed part."""
    completions = drawn.completions
    repeated = [e for e in batch_examples for _ in range(completions.num_generations)]
    by_step = {} if run.process_supervision is None else {"steps": run.process_supervision.score(completions, repeated, drawn.rewards, drawn.valid)}
    batch_started = time.perf_counter()
    parts = reward_parts(drawn.scores.components, {r.name: r.weight for r in run.rewards}, drawn.rewards.shape)
    batch, metrics = run.build_batch(
        completions, [run.prompt_ids[i] for i in drawn.rows], drawn.rewards, drawn.valid,
        policy=run.policy, reference=run.reference, parts=parts, **by_step,
    )  # fmt: skip
    metrics.update(run.gold.measure(completions, repeated, batch))  # logged, never trained on
    return batch_started, (batch, metrics)


def _update(run: Run, batch, step: int, ahead: AheadSampling | None = None) -> dict[str, float]:
    """mu passes of the policy update (none while PPO's critic warms up), then the sampler takes the new
    weights (with k > 0: once step + k's groups are drawn); PPO's critic update after the policy's."""
    metrics: dict[str, float] = {}
    if run.critic is None or not run.critic.warming_up(step):
        metrics.update(update_policy(
            run.policy, run.optimizer, run.scheduler, batch, run.update, generator=run.minibatch_generator,
            entropy_control=run.entropy_control,
        ))  # fmt: skip
        if ahead is not None:
            metrics["sys/time_sync_wait_s"] = ahead.before_sync(step)
        sync_started = time.perf_counter()
        run.sampler.update_weights(run.policy)
        metrics["sys/time_weight_sync_s"] = time.perf_counter() - sync_started  # vllm: gather, merge, load; hf: nothing
        metrics["sys/weight_sync_bytes"] = float(run.sampler.last_sync_bytes)  # in the engine's dtypes; hf: 0
    if ahead is not None:
        ahead.synced_once()  # a step done (while PPO's critic warms up, with the same weights)
    if run.critic is not None:
        metrics.update(run.critic.update(batch))
    return metrics


def _component_means(components: dict[str, list[float | None]]) -> dict[str, float]:
    out = {}
    for name, values in components.items():
        vals = torch.tensor([v for v in values if v is not None], dtype=torch.float64)
        out[f"rewards/{name}/mean"] = float(vals.mean()) if len(vals) else math.nan  # TRL's names
        out[f"rewards/{name}/std"] = float(vals.std()) if len(vals) > 1 else 0.0
    return out


def _logged_by_rewards(logged: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    """A reward's ``log_metric`` values under their names; a name grpolab logs itself gets ``log_metric/``."""
    return {(f"log_metric/{k}" if k in metrics else k): v for k, v in logged.items()}


def _with_columns(rows: list[dict[str, Any]], columns: dict[str, list]) -> list[dict[str, Any]]:
    """A reward's ``log_extra`` columns joined to the step's sample rows, one value per completion; a column
    of another length (logged over several sampling rounds, or by two rewards) is left out, with a warning."""
    for name, values in columns.items():
        if len(values) != len(rows):
            log.warning("log_extra column %r has %d values for the step's %d completions: not written to "
                        "samples.jsonl", name, len(values), len(rows))  # fmt: skip
            continue
        key = f"log_extra/{name}" if name in rows[0] else name
        for row, value in zip(rows, values, strict=True):
            row[key] = value
    return rows


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
