"""Valid settings that do less than they say: one sentence each with the fix, warned as a ``ConfigWarning`` when
a Config is built (``warn_config``, called from ``Config.__post_init__`` after the checks of config/checks.py)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from grpolab.config.algo_section import AlgoConfig
from grpolab.config.checks import ConfigWarning
from grpolab.config.server_checks import field_default

if TYPE_CHECKING:
    from grpolab.config.root import Config


def inert_settings(cfg: Config) -> list[str]:
    """Settings that are valid but have no effect, or less than expected: one sentence each with the fix.

    ``Config`` warns each as a ``ConfigWarning`` when it is built (``warn_config``). A preset's own values
    are flagged only where the preset cannot make them act either (DeepSeekMath's GRPO clip at mu=1 is the
    paper's recipe, not the user's choice); a value the user chose is flagged.
    """
    m, r, t, a = cfg.model, cfg.rollout, cfg.train, cfg.algo
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
    if a.ratio_is_one:
        out += [_RATIO_IS_ONE.format(what=what) for what in _inert_clips(a)]
    if not a.dynamic_sampling and a.max_sampling_rounds != field_default(AlgoConfig, "max_sampling_rounds"):
        out.append(
            f"algo.max_sampling_rounds={a.max_sampling_rounds} has no effect without dynamic sampling: set "
            "algo.dynamic_sampling=true (DAPO) or leave it out"
        )
    if a.rollout_correction == "none":
        changed = [
            f"algo.{k}={getattr(a, k)}"
            for k in ("rollout_correction_level", "rollout_correction_cap")
            if getattr(a, k) != field_default(AlgoConfig, k)
        ]
        if changed:
            out.append(
                f"{' and '.join(changed)} have no effect with algo.rollout_correction=none: set "
                "algo.rollout_correction=tis (or mis) to correct the sampler / trainer mismatch"
            )
    out += _inert_soft_losses(a)
    if a.loss_agg != "batch-token-mean" and a.loss_agg_batch_rows is not None:
        out.append(f"algo.loss_agg_batch_rows={a.loss_agg_batch_rows} has no effect unless algo.loss_agg=batch-token-mean")
    adaptive = [f"algo.{k}={getattr(a, k):g}" for k in _ADAPTIVE_KEYS if getattr(a, k) != field_default(AlgoConfig, k)]
    if adaptive and not a.entropy_adaptive:
        out.append(f"{' and '.join(adaptive)} have no effect unless algo.entropy_adaptive=true")
    if a.beta == 0 and a.kl_estimator != a.preset["kl_estimator"]:
        out.append(f"algo.kl_estimator={a.kl_estimator} has no effect with algo.beta=0 (no KL term): set algo.beta > 0")
    if a.importance_level == "sequence" and a.loss_agg in _TOKEN_SUMS:
        out.append(
            f"algo.importance_level=sequence (GSPO) with algo.loss_agg={a.loss_agg} ({_TOKEN_SUMS[a.loss_agg]}) sums "
            "per-token contributions, which effectively weights each sequence by its completion length instead of "
            "optimizing the per-sequence objective; GSPO's averages over sequences: set algo.loss_agg=seq-mean-token-mean"
        )
    return out


_ADAPTIVE_KEYS = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
_TOKEN_SUMS = {
    "token-mean": "TRL's dapo / cispo",
    "batch-token-mean": "TRL's bnpo",
    "seq-mean-token-sum-norm": "TRL's dr_grpo",
    "seq-mean-token-sum": "a sum over each sequence's tokens",
}
"""The aggregations in which a long sequence counts more (TRL warns alike for its loss types)."""

_RATIO_IS_ONE = (
    "algo.mu=1 and algo.num_minibatches=1 make the importance ratio exactly 1 (the policy does not move "
    "before its batch is used up), so {what} cannot act; set algo.num_minibatches > 1 or algo.mu > 1 "
    "(DAPO: 16 minibatches, GSPO: 4)"
)



_SOFT_LOSS_KEYS = {
    "sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
    "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
}


def _inert_soft_losses(a: AlgoConfig) -> list[str]:
    """SAPO's / VESPO's coefficients without that loss, and the clip range with it."""
    out = []
    for loss, keys in _SOFT_LOSS_KEYS.items():
        changed = [f"algo.{k}={getattr(a, k):g}" for k in keys if getattr(a, k) != field_default(AlgoConfig, k)]
        if a.policy_loss != loss and changed:
            out.append(f"{' and '.join(changed)} have no effect unless algo.policy_loss={loss}")
    if a.policy_loss in _SOFT_LOSS_KEYS and _clips_chosen(a):
        out.append(
            f"algo.clip_low={a.clip_low:g} and algo.clip_high={a.clip_high:g} have no effect with "
            f"algo.policy_loss={a.policy_loss} (no hard clip): tune algo.{_SOFT_LOSS_KEYS[a.policy_loss][0]} and the "
            "others of its kind instead"
        )
    return out


def _clips_chosen(a: AlgoConfig) -> bool:
    """The clip range is not the preset's: the user chose it."""
    return a.clip_low != a.preset["clip_low"] or a.clip_high != a.preset.get("clip_high", a.preset["clip_low"])


def _inert_clips(a: AlgoConfig) -> list[str]:
    """What a ratio of exactly 1 leaves inert, each named by its own setting."""
    out = []
    clips = f"algo.clip_low={a.clip_low:g}, algo.clip_high={a.clip_high:g}"
    chosen = _clips_chosen(a)
    if a.policy_loss == "sapo":
        out.append("SAPO's soft gate (algo.sapo_temperature_pos / _neg: at ratio 1 it passes the plain policy gradient)")
    elif a.policy_loss == "vespo":
        out.append("VESPO's gamma weight (algo.vespo_*: phi(1) = 1; only the rollout-correction weights move w)")
    elif a.policy_loss == "cispo":
        out.append(f"CISPO's IS-weight clip ({clips}; it is REINFORCE with token-mean here)")
    elif a.importance_level == "sequence":
        out.append(f"GSPO's sequence-level clip ({clips})")
    elif a.clip_high != a.clip_low:
        out.append(f"the ratio clip with Clip-Higher ({clips})")
    elif chosen:
        out.append(f"the symmetric ratio clip (algo.clip_low=algo.clip_high={a.clip_low:g})")
    if a.policy_loss == "clip" and a.dual_clip is not None:
        out.append(f"the dual clip (algo.dual_clip={a.dual_clip:g})")
    if a.needs_critic and a.value_clip is not None:
        out.append(f"the value clip (algo.value_clip={a.value_clip:g}: the value model does not move either)")
    return out


def warn_config(cfg: Config) -> None:
    """Every ``inert_settings`` line, each a ConfigWarning.

    Called from ``Config.__post_init__``; stacklevel 4 names the line that built the Config. Python shows
    a warning once per place and message, so a config rebuilt with ``derive`` says it once."""
    for message in inert_settings(cfg):
        warnings.warn(message, ConfigWarning, stacklevel=4)
