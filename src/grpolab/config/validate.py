"""Checks over every number of a config: finite everywhere, then the ranges root.py does not already check.

``check_numbers(cfg)`` runs from ``Config.__post_init__``, so a config built in Python is checked as
one read from YAML is. The generic walk visits every numeric field of every section (nested specs and
tuples included) and names the dotted key of a NaN or infinity; a NaN compares False with everything,
so without it ``algo.beta=nan`` passed ``beta < 0`` and ran with no KL at all.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

from grpolab.errors import ConfigError

GROUP_ADVANTAGES = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}


def numeric_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every int / float reachable from a config dataclass (bools excluded)."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from numeric_fields(getattr(obj, f.name), f"{prefix}{f.name}.")
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            yield from numeric_fields(v, f"{prefix.rstrip('.')}[{i}].")
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from numeric_fields(v, f"{prefix}{k}.")
    elif isinstance(obj, numbers.Real) and not isinstance(obj, bool):
        yield prefix.rstrip("."), obj


INT_LIMIT = 1 << 63
"""Integers of a config must lie in (-2**63, 2**63): torch's generators and counters are 64-bit."""

SEED_LIMIT = INT_LIMIT - (1 << 16)
"""Room above ``seed`` for the per-rank and per-purpose offsets (seed + rank, seed + 2)."""


def check_finite(cfg: Any) -> None:
    """Every float finite, every int within 64 bits (math.isfinite of a huge int raises OverflowError)."""
    seed = getattr(cfg, "seed", 0)
    if not -SEED_LIMIT < seed < SEED_LIMIT:
        raise ConfigError(f"seed={seed} is too large: give a seed of at most 63 bits (|seed| < 2**63 - 65536)")
    for key, value in numeric_fields(cfg):
        if isinstance(value, int) and not -INT_LIMIT < value < INT_LIMIT:
            raise ConfigError(
                f"config key '{key}' is an integer of {len(str(abs(value)))} digits, beyond 64 bits; give a "
                "smaller number"
            )
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}' is {value!r}; give a finite number")


def _range_checks(cfg: Any) -> list[tuple[bool, str]]:
    m, d, r, a, o, t, e, lg = cfg.model, cfg.data, cfg.rollout, cfg.algo, cfg.optim, cfg.train, cfg.eval, cfg.log
    return [
        (m.lora.r < 1 or m.lora.alpha <= 0, "model.lora.r must be >= 1 and model.lora.alpha > 0"),
        (not 0 <= m.lora.dropout < 1, "model.lora.dropout must be in [0, 1)"),
        (d.size < 1, "data.size must be >= 1"),
        (d.eval_size < 0, "data.eval_size must be >= 0 (0 = no held-out set)"),
        (d.max_prompt_length < 1, "data.max_prompt_length must be >= 1"),
        (
            r.max_batch_sequences is not None and r.max_batch_sequences < 1,
            "rollout.max_batch_sequences must be >= 1, or null for no limit",
        ),
        (a.eps <= 0, "algo.eps must be > 0 (1e-4): it keeps a zero-std group from dividing by zero"),
        (a.ref_reset_every < 0, "algo.ref_reset_every must be >= 0 (0 = never)"),
        (o.weight_decay < 0, "optim.weight_decay must be >= 0"),
        (any(not 0 <= b < 1 for b in o.betas), "optim.betas must both be in [0, 1) (AdamW: 0.9, 0.99)"),
        (o.max_grad_norm < 0, "optim.max_grad_norm must be >= 0 (0 = no clip)"),
        (o.warmup_steps < 0, "optim.warmup_steps must be >= 0"),
        (t.max_no_signal_steps < 0, "train.max_no_signal_steps must be >= 0 (0 = never stop)"),
        (e.every < 0 or e.max_prompts < 0, "eval.every and eval.max_prompts must be >= 0"),
        (e.temperature < 0, "eval.temperature must be >= 0 (0 = greedy)"),
        (lg.samples_every < 0, "log.samples_every must be >= 0 (0 = never)"),
        (cfg.reward.dry_run_examples < 0, "reward.dry_run_examples must be >= 0 (0 = skip)"),
        (cfg.sft.lr <= 0 or cfg.sft.weight_decay < 0, "sft.lr must be > 0 and sft.weight_decay >= 0"),
        (cfg.sft.dev_size < 1, "sft.dev_size must be >= 1"),
    ]


def check_numbers(cfg: Any) -> None:
    """Every number finite, every range sensible, the prompt template known; ConfigError naming the key."""
    check_finite(cfg)
    for bad, message in _range_checks(cfg):
        if bad:
            raise ConfigError(message)
    a, r = cfg.algo, cfg.rollout
    if r.temperature == 0 and a.resolved_advantage in GROUP_ADVANTAGES and r.num_generations > 1:
        raise ConfigError(
            f"rollout.temperature=0 samples greedily, so the {r.num_generations} completions of a group are "
            f"identical and algo '{a.name}' gets zero advantage everywhere: nothing would be learned. "
            "Use a temperature > 0 (1.0 is usual)"
        )
    from grpolab.config.templates import resolve_template  # imports nothing of grpolab's

    try:
        resolve_template(cfg.data.template)
    except ValueError as err:
        raise ConfigError(f"data.template: {err}") from err
