"""Per-token KL estimators k1, k2, k3 (Schulman 2020, "Approximating KL divergence").

All take ``logprobs`` (current policy pi) and ``ref_logprobs`` (reference) of the sampled tokens and
return a per-token estimate of KL(pi || ref) with the same shape; callers aggregate with a mask.

What each one's gradient does when it is used as a LOSS on on-policy samples (docs/algorithms.md 1.2; Tang &
Munos, arXiv 2506.09477):
* k1 = log(pi/ref): zero expected gradient, since E_pi[grad log pi] = 0. As a loss it regularises
  nothing on average; it only adds noise.
* k2 = 0.5 * log(pi/ref)^2: its gradient is the gradient of the reverse KL, KL(pi || ref).
* k3 = ref/pi - log(ref/pi) - 1 (DeepSeekMath Eq. 4, arXiv 2402.03300; the GRPO KL loss): its gradient
  is E_pi[(1 - ref/pi) grad log pi] = grad KL(ref || pi), the FORWARD KL, not the reverse KL the
  GRPO objective names.
* k1 placed in the REWARD (PPO, DeepSeekMath Eq. 2; ``kl_shaped_token_rewards``) gives the unbiased
  reverse-KL gradient through the policy-gradient estimator. The others may be placed there too
  (``algo.kl_estimator``, as verl's ``kl_penalty`` in ``apply_kl_penalty``): the reward then
  penalises a biased estimate (k2, abs) or k3's.
* abs = |log(pi/ref)| (verl's "abs"): no paper; kept for parity with verl.

Departures from the paper, and why:
* k3 clamps ``ref_logprobs - logprobs`` to [-20, 20] before the exp (as verl's "low_var_kl"), so one
  token whose reference probability is vanishing cannot overflow to inf; the clamped log-ratio is used in
  both terms, which keeps k3 >= 0. The gradient is 0 beyond the clamp. verl also clamps the result to
  [-10, 10]; that is not done here, and TRL does neither.
* k3 is computed as ``expm1(x) - x`` rather than ``exp(x) - x - 1``: the same value, but it does not
  round to a tiny negative number when pi is close to ref.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "LOG_RATIO_CLAMP", "kl_abs", "kl_k1", "kl_k2", "kl_k3"]

LOG_RATIO_CLAMP = 20.0


def _log_ratio(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have the same shape [N, T], "
            f"got {tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)}"
        )
    return logprobs - ref_logprobs


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log pi - log ref (Schulman 2020; the per-token KL of DeepSeekMath Eq. 2, arXiv 2402.03300).

    Args:
        logprobs: ``[N, T]``.
        ref_logprobs: ``[N, T]``.

    Returns:
        ``[N, T]``, unbiased for KL(pi || ref) but can be negative.
    """
    return _log_ratio(logprobs, ref_logprobs)


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = 0.5 * (log pi - log ref)^2 (Schulman 2020). ``[N, T]`` in, ``[N, T]`` out, >= 0."""
    return 0.5 * _log_ratio(logprobs, ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = ref/pi - log(ref/pi) - 1 (Schulman 2020; DeepSeekMath Eq. 4, arXiv 2402.03300).

    Args:
        logprobs: ``[N, T]``.
        ref_logprobs: ``[N, T]``.

    Returns:
        ``[N, T]``, >= 0 and exactly 0 where pi = ref. The log-ratio is clamped to +-``LOG_RATIO_CLAMP``.
    """
    x = (-_log_ratio(logprobs, ref_logprobs)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(x) - x


def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """|log pi - log ref| (verl's "abs" kl_penalty). ``[N, T]`` in, ``[N, T]`` out, >= 0; biased, as k2 is."""
    return _log_ratio(logprobs, ref_logprobs).abs()


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "abs": kl_abs,
}
"""Per-token KL estimators by name, all ``(logprobs [N, T], ref_logprobs [N, T]) -> [N, T]``. verl's
``kl_penalty`` names: kl = k1, mse = k2, low_var_kl = k3, abs = abs. Used in the loss (algo.kl_in=loss)
or in the reward (algo.kl_in=reward: RLOO, REINFORCE++, PPO), as verl's apply_kl_penalty does."""
