"""Warnings for settings that are valid but do less than a user would expect (nothing fails)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpolab.config.root import Config


class ConfigWarning(UserWarning):
    """A setting that silently does less than it says; the message says what to change."""


def config_advice(cfg: Config) -> list[str]:
    """One line per combination of settings that has no effect, or less than expected."""
    m, r, t = cfg.model, cfg.rollout, cfg.train
    out = []
    if m.dtype == "float16" and m.autocast == "bf16":
        out.append(
            "model.dtype=float16 with model.autocast=bf16: autocast rounds every fp16 weight to bf16 at each "
            "matmul (fewer mantissa bits than fp16). Use model.autocast=none, or model.dtype=bfloat16 / float32."
        )
    if r.max_batch_sequences is not None and r.kv_cache_budget_mb is not None:
        out.append(
            "rollout.kv_cache_budget_mb is ignored while rollout.max_batch_sequences is set: drop one of them."
        )
    longest = cfg.data.max_prompt_length + r.max_completion_length
    if t.max_tokens_per_micro_batch is not None and t.max_tokens_per_micro_batch < longest:
        out.append(
            f"train.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch} is below one row of "
            f"data.max_prompt_length + rollout.max_completion_length = {longest} tokens: such rows run alone, "
            "over the budget. Raise it to at least that, or lower the lengths."
        )
    return out


def warn_config(cfg: Config) -> None:
    for message in config_advice(cfg):
        warnings.warn(message, ConfigWarning, stacklevel=4)
