"""GDPO: group reward-decoupled normalisation for several rewards (arXiv 2601.05242; TRL 1.16
``multi_objective_aggregation="normalize_then_sum"``).

GRPO normalises the weighted SUM of the reward functions within each group, so a function with a large
spread drowns the others and different reward combinations collapse onto the same advantage. GDPO
normalises each function within its group first, sums the normalised values with the weights, and whitens
that sum over the batch:

    n_k = (r_k - mean_g r_k) / (std_g r_k + eps),   s = sum_k w_k n_k,   A = (s - mean_B s) / (std_B s + eps)

Departures from TRL, and why (the same as grpolab's GRPO, grpolab.algo.advantages): a function's values
that are not applicable (``valid`` False; TRL's None/NaN) are left out of its statistics and add 0 to
``s``; a group in which a function has fewer than two counted values, or equal ones, gets 0 from it exactly
(TRL: NaN, which its nansum also makes 0); a completion with no applicable function gets advantage 0 and
stays out of the batch statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpolab.algo.advantages import Std, _centred, _check_choice, _scaled, _std

__all__ = ["COMPONENT_ESTIMATORS", "gdpo_advantages"]


def gdpo_advantages(
    values: Tensor, valid: Tensor, weights: Tensor, *, std: Std = "unbiased", eps: float = 1e-4
) -> Tensor:
    """GDPO's advantages from each reward function's values.

    Args:
        values: ``[P, G, K]`` float, function k's unweighted reward of completion g of prompt p.
        valid: ``[P, G, K]`` bool, False = function k does not apply there.
        weights: ``[K]`` the functions' weights (reward.functions[i].weight; TRL reward_weights).
        std: ``"unbiased"`` (Bessel, TRL) or ``"population"``, for both normalisations.
        eps: added to both stds (TRL: 1e-4).

    Returns:
        ``[P, G]`` advantages; 0 where no function applies.
    """
    if values.dim() != 3 or not values.is_floating_point():
        raise ValueError(f"values must be a float [P, G, K] tensor, got {values.dtype} {tuple(values.shape)}")
    if valid.dtype != torch.bool or valid.shape != values.shape:
        raise ValueError(f"valid must be bool and shaped like values {tuple(values.shape)}, got {valid.dtype} {tuple(valid.shape)}")
    if weights.shape != values.shape[2:]:
        raise ValueError(f"weights must be [K] = ({values.shape[2]},), got {tuple(weights.shape)}")
    _check_choice("std", std, ("unbiased", "population"))
    centred = _centred(values, valid, dim=1)  # [P, G, K]
    normalised = _scaled(centred, _std(centred, valid, std, dim=1).unsqueeze(1), eps)
    summed = (normalised * weights.to(values.dtype)).sum(-1)  # invalid entries are 0 already
    scored = valid.any(-1)  # [P, G]
    flat, keep = summed.reshape(1, -1), scored.reshape(1, -1)
    batch_centred = _centred(flat, keep, dim=1)
    return _scaled(batch_centred, _std(batch_centred, keep, std, dim=None), eps).reshape_as(summed)


COMPONENT_ESTIMATORS: dict[str, Callable[..., Tensor]] = {"gdpo": gdpo_advantages}
"""Estimators that read each reward function apart, all ``(values [P, G, K], valid [P, G, K], weights [K], *,
std, eps) -> [P, G]`` (the outcome estimators of grpolab.algo.advantages read the weighted sum only)."""
