"""The config read into what an evaluation needs (eval/runner.py, eval/kl.py): nothing in eval/ reads the config.

``build_grader`` builds the rewards that grade (with the same checks and messages as train), ``eval_spec`` reads the
eval section, and ``sampler_maker`` / ``kl_sampler`` build a model's samplers with the engine of
rollout.engine, from its ``engine_spec`` (runtime/engine_spec.py), as training builds it.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from grpolab.config import Config
from grpolab.eval.runner import EvalSpec, Grader, MakeSampler, blind_grader, default_ks
from grpolab.models.loading import resolve_autocast
from grpolab.rewards import build_rewards
from grpolab.rollout.base import EngineSpec, Sampler
from grpolab.rollout.engines import build_sampler
from grpolab.runtime.engine_spec import engine_spec
from grpolab.training.gold import build_gold_rewards

__all__ = ["build_grader", "eval_spec", "kl_sampler", "sampler_maker"]


def build_grader(cfg: Config) -> Grader:
    """reward.functions (correct: a total above eval.correct_threshold), reward.gold and eval.blind_grader, built
    with train's checks: a bad entry is one line naming its key."""
    rewards = build_rewards(cfg.reward.functions)
    return Grader(
        rewards, cfg.eval.correct_threshold, cfg.reward.timeout_s, build_gold_rewards(cfg.reward.gold),
        blind_grader(cfg.eval.blind_grader),
    )  # fmt: skip


def eval_spec(cfg: Config) -> EvalSpec:
    """The eval section, its K resolved (eval.ks, else 1, 2, 4, ... up to eval.num_samples)."""
    e = cfg.eval
    return EvalSpec(
        num_samples=e.num_samples, ks=tuple(e.ks or default_ks(e.num_samples)), temperature=e.temperature,
        prompts_per_batch=e.prompts_per_batch, greedy=e.greedy, seed=cfg.seed, blind_grader=e.blind_grader,
    )  # fmt: skip


def sampler_maker(cfg: Config, model: torch.nn.Module, tokenizer) -> MakeSampler:
    """temperature -> the sampler of rollout.engine over ``model``, under model.autocast resolved for its device."""
    amp = resolve_autocast(cfg.model, next(model.parameters()).device)
    return functools.partial(_sampler, engine_spec(cfg), model, tokenizer, amp)


def _sampler(spec: EngineSpec, model, tokenizer, amp: torch.dtype | None, temperature: float) -> Sampler:
    return build_sampler(spec, policy=model, tokenizer=tokenizer, autocast_dtype=amp, temperature=temperature)


def kl_sampler(cfg: Config, policy: torch.nn.Module, tokenizer) -> Sampler:
    """The sampler of eval/kl.py ``measure_kl``: rollout.engine over ``policy`` sampling it exactly (T=1, no top-p,
    top-k, min-p or repetition penalty, full precision), whatever the config's rollout settings."""
    spec = engine_spec(cfg)
    rollout = dataclasses.replace(spec.rollout, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)
    exact = dataclasses.replace(spec, rollout=rollout)
    return build_sampler(exact, policy=policy, tokenizer=tokenizer, autocast_dtype=None, temperature=1.0)
