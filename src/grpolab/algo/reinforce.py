"""REINFORCE++ and REINFORCE++-baseline (Hu et al., arXiv 2501.03262): advantages that vary along T,
whitened over the batch's tokens.

Where the code departs from the paper, and why:
* REINFORCE++ puts the KL (k1, on the sampler's log-probs) into every token's reward as the paper's
  Eq. 9 and OpenRLHF do, with ``gamma`` (1 by default) in the return. Its whitening is
  ``masked_whiten`` (unbiased token variance, eps 1e-8 inside the square root), so a batch whose returns
  are all equal gets advantage 0, not NaN.
* Rows whose reward is not applicable are left out of the whitening statistics and get advantage 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from grpolab.algo.advantages import (
    _centred,
    _check_rewards,
    _check_tokens,
    gae_advantages,
    kl_shaped_token_rewards,
)
from grpolab.algo.masked import masked_whiten

__all__ = ["TOKEN_ESTIMATORS", "TokenEstimator", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages"]


def reinforce_pp_advantages(
    scores: Tensor,
    mask: Tensor,
    *,
    token_kl: Tensor | None = None,
    beta: float = 0.0,
    gamma: float = 1.0,
    whiten_mask: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ token advantages (Hu et al., arXiv 2501.03262, Eqs. 8-10).

    ``r_t = -beta * kl_t`` at every counted token plus the score at the last one; the return
    ``G_t = sum_{k >= t} gamma^(k-t) r_k``; the advantage is ``G`` whitened over every counted token of
    the batch (mean and unbiased std pooled over tokens, so a completion weighs by its length). No
    group: one completion per prompt is enough.

    Args:
        scores: ``[N]`` scalar outcome of each completion.
        mask: ``[N, T]`` bool, True = token counts; every row needs a counted token.
        token_kl: ``[N, T]`` per-token KL estimate (k1 = log pi_old - log pi_ref in the paper), or None.
        beta: KL coefficient.
        gamma: discount of the return (the paper: 1).
        whiten_mask: ``[N, T]`` bool, the tokens the whitening statistics pool and the result keeps
            (default: ``mask``); rows whose reward is not applicable are left out here.

    Returns:
        ``[N, T]``, 0 outside ``whiten_mask``; computed without gradient.
    """
    kl = torch.zeros_like(mask, dtype=scores.dtype) if token_kl is None else token_kl
    token_rewards = kl_shaped_token_rewards(scores, kl, torch.zeros_like(kl), mask, beta=beta)
    returns, _ = gae_advantages(token_rewards, torch.zeros_like(token_rewards), mask, gamma=gamma, lam=1.0)
    return masked_whiten(returns, mask if whiten_mask is None else whiten_mask)


def reinforce_pp_baseline_advantages(rewards: Tensor, mask: Tensor, valid: Tensor | None = None) -> Tensor:
    """REINFORCE++-baseline token advantages (arXiv 2501.03262; verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``).

    Subtract each group's mean reward, give every token of completion i that value, then whiten over
    every counted token of the batch: mean and unbiased variance pooled over tokens (a long completion
    weighs more), the token mean subtracted again, eps 1e-8 inside the square root. The re-centring
    means a group whose rewards are all equal does NOT get exactly 0, as in the paper and verl.

    Args:
        rewards: ``[P, G]`` float.
        mask: ``[N, T]`` bool with ``N = P * G`` (prompt-major), True = token counts.
        valid: ``[P, G]`` bool, False = reward not applicable: left out of every statistic, advantage 0.

    Returns:
        ``[N, T]``, 0 outside the mask and on rows that are not valid.
    """
    valid = _check_rewards(rewards, valid)
    _check_tokens(mask)
    if mask.shape[0] != rewards.numel():
        raise ValueError(f"mask has {mask.shape[0]} rows but rewards {tuple(rewards.shape)} give N={rewards.numel()}")
    counted = mask & valid.reshape(-1, 1).to(mask.device)
    centred = _centred(rewards, valid, dim=1).reshape(-1, 1).to(mask.device)  # [N, 1]
    return masked_whiten(centred.expand(mask.shape).contiguous(), counted)


class TokenEstimator(Protocol):
    """``(rewards [P, G], valid [P, G], mask [N, T], token_kl [N, T] | None, *, beta, gamma) -> [N, T]``."""

    def __call__(
        self, rewards: Tensor, valid: Tensor, mask: Tensor, token_kl: Tensor | None, *, beta: float, gamma: float
    ) -> Tensor: ...


def _reinforce_pp(
    rewards: Tensor, valid: Tensor, mask: Tensor, token_kl: Tensor | None, *, beta: float, gamma: float
) -> Tensor:
    counted = mask & valid.reshape(-1, 1).to(mask.device)
    scores = torch.where(valid, rewards, torch.zeros_like(rewards)).reshape(-1).to(mask.device)
    return reinforce_pp_advantages(scores, mask, token_kl=token_kl, beta=beta, gamma=gamma, whiten_mask=counted)


def _reinforce_pp_baseline(
    rewards: Tensor, valid: Tensor, mask: Tensor, token_kl: Tensor | None, *, beta: float, gamma: float
) -> Tensor:
    return reinforce_pp_baseline_advantages(rewards, mask, valid)


TOKEN_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
}
"""Estimators whose advantage varies along T, all ``(rewards [P, G], valid, mask [N, T], token_kl, *, beta,
gamma) -> [N, T]``. ``token_kl`` (the per-token KL for the reward) is used by "reinforce_pp" only."""
