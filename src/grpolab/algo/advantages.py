"""Advantage estimators: outcome (GRPO and relatives), process (GRPO+PS) and GAE (PPO).

Rewards are ``[P, G]`` (row p = prompt, column g = completion), and token tensors are ``[N, T]`` with
``N = P * G`` in prompt-major order (row ``p * G + g``). Outcome advantages stay ``[P, G]``; the trainer
flattens them and broadcasts them over the tokens of each completion.

Where the code departs from the papers, and why:
* DeepSeekMath (arXiv 2402.03300) does not say which std it uses. ``std="unbiased"`` (Bessel, the
  default) matches TRL and verl; ``std="population"`` matches nano-aha-moment. The std gets ``+ eps``
  (TRL: 1e-4) rather than the paper's bare division, so a zero-std group does not divide by zero.
* A group whose counted rewards are all equal gets advantage exactly 0 (checked explicitly), instead of
  the rounding residue ``(r - mean(r)) / eps`` that floating-point means can leave.
* ``valid`` lets a reward say "not applicable": such entries are left out of every statistic and get
  advantage 0; a group with fewer than two counted entries gets 0 (verl instead gives a group of size
  1 mean 0 and std 1, i.e. the raw reward).
* ``scale="batch"`` (estimator "batch_std") divides by the std of the group-centred values over the
  batch's SEQUENCES, each completion weighing once. It is not REINFORCE++-baseline, which whitens
  over the batch's TOKENS (each completion weighs by its length) and re-centres
  (``grpolab.algo.reinforce.reinforce_pp_baseline_advantages``); on ragged lengths the two differ by up to ~27%. TRL's
  ``scale_rewards="batch"`` divides by the std of the raw rewards instead (``scale="batch_reward"``,
  estimator "batch_reward_std"); the three agree only when every group has the same mean and every
  completion the same length.
* ``gae_advantages`` does not whiten (callers do, with ``masked_whiten``), so the function can be
  checked against the textbook recursion. Positions outside the mask are skipped: the "next state"
  of a token is the next counted token, and the value after the last counted token is 0.
* Online RFT (``OUTCOME_ESTIMATORS["online_rft"]``) takes a completion as correct when its reward is
  above ``RFT_CORRECT_THRESHOLD = 0.5`` (right for 0/1 and for -1/+1 rewards, and for an accuracy reward
  plus a small format bonus).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import torch
from torch import Tensor

from grpolab.algo.kl import kl_k1
from grpolab.algo.masked import masked_mean, masked_sum

__all__ = [
    "OUTCOME_ESTIMATORS",
    "RFT_CORRECT_THRESHOLD",
    "OutcomeEstimator",
    "gae_advantages",
    "grpo_advantages",
    "grpo_process_advantages",
    "kl_shaped_token_rewards",
    "rft_advantages",
    "rloo_advantages",
]

Scale = Literal["group", "batch", "batch_reward", "none"]
Std = Literal["unbiased", "population"]
RFT_CORRECT_THRESHOLD = 0.5


def _check_rewards(rewards: Tensor, valid: Tensor | None, name: str = "rewards") -> Tensor:
    """Validate ``[P, G]`` rewards and return the ``valid`` mask (all True when None)."""
    if rewards.dim() != 2:
        raise ValueError(f"{name} must be [P, G], got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got dtype {rewards.dtype}")
    if valid is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if valid.dtype != torch.bool or valid.shape != rewards.shape:
        raise ValueError(
            f"valid must be a bool tensor shaped like {name} {tuple(rewards.shape)}, "
            f"got {valid.dtype} {tuple(valid.shape)}"
        )
    return valid


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _all_equal(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """True where the counted entries along ``dim`` are all equal (or there are fewer than two)."""
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    hi = torch.where(mask, x, -inf).amax(dim)
    lo = torch.where(mask, x, inf).amin(dim)
    return (hi <= lo) | (mask.sum(dim) < 2)


def _centred(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """``x - mean`` along ``dim`` over counted entries; exactly 0 for equal groups and outside the mask."""
    mean = masked_mean(x, mask, dim=dim).unsqueeze(dim)
    keep = mask & ~_all_equal(x, mask, dim).unsqueeze(dim)
    return torch.where(keep, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))


def _std(centred: Tensor, mask: Tensor, std: Std, dim: int | None) -> Tensor:
    """Std of already-centred values over counted entries (0 when too few)."""
    n = mask.sum() if dim is None else mask.sum(dim)
    n = n.to(centred.dtype)
    denom = n - 1 if std == "unbiased" else n
    sq = masked_sum(centred**2, mask, dim)
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq)).sqrt()


def _scaled(centred: Tensor, std: Tensor, eps: float) -> Tensor:
    """``centred / (std + eps)``; where the std is 0, ``centred`` is 0 too and stays 0 (even with eps=0)."""
    denom = std + eps
    return centred / torch.where(denom > 0, denom, torch.ones_like(denom))


def grpo_advantages(
    rewards: Tensor,
    *,
    scale: Scale = "group",
    std: Std = "unbiased",
    eps: float = 1e-4,
    valid: Tensor | None = None,
) -> Tensor:
    """Group-relative outcome advantages (DeepSeekMath Sec. 4.1.2, arXiv 2402.03300).

    * ``scale="group"``: ``(r - mean_g) / (std_g + eps)`` (GRPO).
    * ``scale="batch"``: ``(r - mean_g) / (std of all group-centred values in the batch + eps)``, each
      completion counted once (group mean, batch std; compare "Lite PPO", arXiv 2508.08221). For
      REINFORCE++-baseline's token-weighted form see ``reinforce_pp_baseline_advantages``.
    * ``scale="batch_reward"``: ``(r - mean_g) / (std of the batch's rewards + eps)``, the std of the
      rewards themselves (TRL ``scale_rewards="batch"``, citing Lite PPO).
    * ``scale="none"``: ``r - mean_g`` (Dr. GRPO, arXiv 2503.20783).

    Args:
        rewards: ``[P, G]`` float.
        scale: which std divides the centred rewards.
        std: ``"unbiased"`` (Bessel, TRL/verl) or ``"population"``.
        eps: added to the std.
        valid: ``[P, G]`` bool, False = reward not applicable: excluded from the statistics, advantage 0.

    Returns:
        ``[P, G]`` advantages; exactly 0 for invalid entries, groups with equal rewards and groups with
        fewer than two valid entries.
    """
    valid = _check_rewards(rewards, valid)
    _check_choice("scale", scale, ("group", "batch", "batch_reward", "none"))
    _check_choice("std", std, ("unbiased", "population"))
    centred = _centred(rewards, valid, dim=1)
    if scale == "none":
        return centred
    if scale == "group":
        return _scaled(centred, _std(centred, valid, std, dim=1).unsqueeze(1), eps)
    if scale == "batch_reward":
        batch_centred = _centred(rewards.reshape(1, -1), valid.reshape(1, -1), dim=1)
        return _scaled(centred, _std(batch_centred, valid.reshape(1, -1), std, dim=None), eps)
    return _scaled(centred, _std(centred, valid, std, dim=None), eps)


def rloo_advantages(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """Leave-one-out advantages (RLOO, Ahmadian et al., arXiv 2402.14740).

    ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean(r))`` over the ``n`` valid entries of a group.

    Args:
        rewards: ``[P, G]`` float.
        valid: ``[P, G]`` bool, False = not applicable (excluded, advantage 0).

    Returns:
        ``[P, G]``; 0 for invalid entries and groups with fewer than two valid entries.
    """
    valid = _check_rewards(rewards, valid)
    n = valid.sum(1, keepdim=True).to(rewards.dtype)
    return _centred(rewards, valid, dim=1) * (n / (n - 1).clamp(min=1))


def rft_advantages(correct: Tensor) -> Tensor:
    """Rejection-sampling fine-tuning gradient coefficient ``I(o)`` (DeepSeekMath Sec. 5.2.1, Eq. 10).

    1 for a correct completion, 0 otherwise: RFT and online RFT never push down wrong answers.

    Args:
        correct: ``[P, G]`` bool.

    Returns:
        ``[P, G]`` float32.
    """
    if correct.dim() != 2 or correct.dtype != torch.bool:
        raise ValueError(f"correct must be a bool [P, G] tensor, got {correct.dtype} {tuple(correct.shape)}")
    return correct.float()


class OutcomeEstimator(Protocol):
    """``(rewards [P, G], valid [P, G] bool, *, std, eps) -> advantages [P, G]``."""

    def __call__(self, rewards: Tensor, valid: Tensor, *, std: Std = ..., eps: float = ...) -> Tensor: ...


def _grpo(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    return grpo_advantages(rewards, scale="group", std=std, eps=eps, valid=valid)


def _dr_grpo(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    return grpo_advantages(rewards, scale="none", std=std, eps=eps, valid=valid)


def _batch_std(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    return grpo_advantages(rewards, scale="batch", std=std, eps=eps, valid=valid)


def _batch_reward_std(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    return grpo_advantages(rewards, scale="batch_reward", std=std, eps=eps, valid=valid)


def _rloo(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    return rloo_advantages(rewards, valid)


def _online_rft(rewards: Tensor, valid: Tensor, *, std: Std = "unbiased", eps: float = 1e-4) -> Tensor:
    valid = _check_rewards(rewards, valid)
    return rft_advantages((rewards > RFT_CORRECT_THRESHOLD) & valid).to(rewards.dtype)


OUTCOME_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "rloo": _rloo,
    "online_rft": _online_rft,
    "batch_std": _batch_std,
    "batch_reward_std": _batch_reward_std,
}
"""Outcome estimators by name, all ``(rewards [P, G], valid [P, G] bool, *, std, eps) -> [P, G]``.

``std`` ("unbiased" | "population") and ``eps`` are used by "grpo", "batch_std" and "batch_reward_std" and
accepted but ignored by the others, so a trainer can pass the same keywords to whichever it picked.
"""


def grpo_process_advantages(
    step_rewards: Tensor,
    step_end_mask: Tensor,
    completion_mask: Tensor,
    *,
    num_generations: int,
    std: Std = "unbiased",
    eps: float = 1e-4,
) -> Tensor:
    """Process-supervision advantages (DeepSeekMath Sec. 4.1.3, arXiv 2402.03300).

    Each step's reward sits at its end token. Rewards are normalised over all steps of all G outputs of a
    prompt (rows ``p*G .. p*G+G-1``); a token's advantage is the sum of the normalised rewards of the
    steps that end at or after it.

    Args:
        step_rewards: ``[N, T]`` float; read only where ``step_end_mask`` is True.
        step_end_mask: ``[N, T]`` bool, True at the last token of each step; must lie inside
            ``completion_mask``.
        completion_mask: ``[N, T]`` bool, True = token counts.
        num_generations: G; ``N`` must be a multiple of it.
        std: ``"unbiased"`` or ``"population"`` (the paper's worked numbers use population).
        eps: added to the std.

    Returns:
        ``[N, T]`` token advantages, 0 where ``completion_mask`` is False.
    """
    _check_choice("std", std, ("unbiased", "population"))
    if step_rewards.dim() != 2 or not step_rewards.is_floating_point():
        raise ValueError(f"step_rewards must be a float [N, T] tensor, got {tuple(step_rewards.shape)}")
    for name, m in (("step_end_mask", step_end_mask), ("completion_mask", completion_mask)):
        if m.dtype != torch.bool or m.shape != step_rewards.shape:
            raise ValueError(
                f"{name} must be bool and shaped like step_rewards {tuple(step_rewards.shape)}, "
                f"got {m.dtype} {tuple(m.shape)}"
            )
    n, t = step_rewards.shape
    if num_generations < 1 or n % num_generations:
        raise ValueError(f"N={n} rows is not a multiple of num_generations={num_generations}")
    if (step_end_mask & ~completion_mask).any():
        raise ValueError("step_end_mask marks a step end outside completion_mask")
    per_prompt = step_rewards.reshape(-1, num_generations * t)  # [P, G*T]
    ends = step_end_mask.reshape(-1, num_generations * t)
    centred = _centred(per_prompt, ends, dim=1)
    normed = _scaled(centred, _std(centred, ends, std, dim=1).unsqueeze(1), eps).reshape(n, t)
    to_go = normed.flip(-1).cumsum(-1).flip(-1)
    return torch.where(completion_mask, to_go, torch.zeros((), dtype=to_go.dtype, device=to_go.device))


def _check_tokens(mask: Tensor, **tensors: Tensor) -> None:
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool [N, T] tensor, got {mask.dtype} {tuple(mask.shape)}")
    for name, x in tensors.items():
        if x.shape != mask.shape:
            raise ValueError(f"{name} must be [N, T] = {tuple(mask.shape)}, got {tuple(x.shape)}")


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al., arXiv 1506.02438), as PPO uses it for LLMs.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``, with ``V = 0``
    after the last counted token. ``t+1`` is the next counted position (masked positions are skipped).

    Args:
        token_rewards: ``[N, T]`` float (e.g. from ``kl_shaped_token_rewards``).
        values: ``[N, T]`` value predictions ``V(s_t)``.
        mask: ``[N, T]`` bool, True = token counts.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(advantages [N, T], returns [N, T])`` with ``returns = advantages + values``, both 0 outside the
        mask. Not whitened; computed without gradient.
    """
    _check_tokens(mask, token_rewards=token_rewards, values=values)
    token_rewards, values = token_rewards.detach(), values.detach()
    zeros = torch.zeros_like(values[:, 0])
    next_value, next_adv = zeros, zeros
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = mask[:, t]
        advantages[:, t] = torch.where(m, adv, zeros)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv, next_adv)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def kl_shaped_token_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    beta: float,
    kl_fn: Callable[[Tensor, Tensor], Tensor] = kl_k1,
) -> Tensor:
    """Per-token PPO rewards with the KL penalty folded in (DeepSeekMath Eq. 2, arXiv 2402.03300; TRL).

    ``r_t = -beta * kl_t`` at every counted token, ``kl_t = kl_fn(logprobs, ref_logprobs)`` (k1 =
    ``logprobs_t - ref_logprobs_t`` by default, the paper's; algo.kl_estimator picks another, as verl's
    kl_penalty), plus the sequence score at the last counted token. Computed without gradient.

    Args:
        scores: ``[N]`` scalar outcome of each completion.
        logprobs: ``[N, T]`` log-probs under the sampling policy.
        ref_logprobs: ``[N, T]`` log-probs under the reference policy.
        mask: ``[N, T]`` bool, True = token counts; every row needs at least one counted token.
        beta: KL coefficient.
        kl_fn: the per-token KL estimator (grpolab.algo.kl.KL_ESTIMATORS).

    Returns:
        ``[N, T]`` token rewards, 0 outside the mask.
    """
    _check_tokens(mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    if scores.shape != mask.shape[:1]:
        raise ValueError(f"scores must be [N] = ({mask.shape[0]},), got {tuple(scores.shape)}")
    if not mask.any(-1).all():
        raise ValueError("a row of mask has no counted token, so its score has nowhere to go")
    kl = kl_fn(logprobs, ref_logprobs).detach()
    rewards = torch.where(mask, -beta * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).amax(-1)  # [N]
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores.detach().to(rewards.dtype)
    return rewards

