"""What shapes the distribution the hf engine draws from: top-k, top-p, min-p and the repetition penalty.

None of them touches the log-probs: the sampler records ``log_softmax(logits / T)`` over the full vocabulary,
as the trainer computes them (and TRL), so the ratio is exactly 1 at the first update whatever the filters.
Each follows transformers' ``generate`` (its TopK, TopP, MinP warpers after the temperature, and
RepetitionPenaltyLogitsProcessor before it), which tests/unit/rollout/test_filters.py checks against.

Departure, and why: the repetition penalty counts the prompt's own tokens and the tokens sampled so far, never
the left padding of a batched prompt (transformers penalises the pad id too when it pads), so a row's draw does
not depend on which prompts share its batch; vLLM does the same.
"""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["draw_tokens", "filter_logits", "mass_before", "penalise_repeats", "seen_tokens", "tokens_at"]


def filter_logits(logits: torch.Tensor, *, top_k: int, top_p: float, min_p: float = 0.0) -> torch.Tensor:
    """[n, V] logits with tokens outside the top-k, then the top-p nucleus, then those below ``min_p`` times
    the most likely token's probability set to -inf (transformers' order: TopK, TopP, MinP warpers).

    Returns ``logits`` itself when no filter is on. The most likely token is always kept.
    """
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        fixed = probs.is_cuda and torch.are_deterministic_algorithms_enabled()
        drop_sorted = mass_before(probs, fixed=fixed) >= top_p  # mass strictly before a token already >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if min_p > 0:
        # p_i >= min_p * p_max  <=>  l_i - l_max >= log(min_p): the softmax's normaliser cancels
        top = logits.amax(-1, keepdim=True)
        logits = logits.masked_fill(logits - top < math.log(min_p), float("-inf"))
    return logits


def mass_before(probs: torch.Tensor, *, fixed: bool = False) -> torch.Tensor:
    """[n, V] sorted probabilities -> the mass strictly before each. ``fixed``: summed in int64 fixed point
    (steps of 2^-52, finer than float32's own rounding of these sums), for train.deterministic on CUDA,
    where torch has no deterministic float cumsum (it raises); an integer sum is exact, so deterministic."""
    if not fixed:
        return probs.cumsum(-1) - probs
    units = (probs.double() * 2.0**52).round().long()
    return ((units.cumsum(-1) - units).double() / 2.0**52).to(probs.dtype)


def draw_tokens(
    probs: torch.Tensor, generator: torch.Generator | None = None, rows: torch.Tensor | None = None, total: int = 0
) -> torch.Tensor:
    """One token per row of [n, V] probabilities (unnormalised, each row's sum > 0), drawn by the inverse of
    the row's CDF at one uniform number: what torch.multinomial(probs, 1) draws, from another random stream.
    multinomial draws V exponential numbers per row (the Gumbel trick) on the generator, serially on a CPU:
    measured 20 ms a decode step for 16 rows of SmolLM2's 49,152 tokens on one core, a fifth of the step.

    ``rows`` [n]: which of ``total`` rows these are (a decode that dropped its finished rows): a uniform is
    drawn for each of the ``total``, and row ``rows[i]``'s is used, so the stream is the same either way."""
    count = probs.shape[0] if rows is None else total
    u = torch.rand((count, 1), dtype=torch.float64, device=probs.device, generator=generator)
    return tokens_at(probs, u if rows is None else u[rows])


CDF_BLOCK = 1024
"""Most vocabulary entries per block of the two-level inverse CDF (``tokens_at``)."""


def tokens_at(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[n] tokens where the CDF of each row of ``probs`` [n, V] first exceeds ``u`` [n, 1] (in [0, 1)) times the
    row's total; a token of probability 0 is never drawn.

    In two levels: the row's blocks of ``block_size(V)`` entries are summed in fp32 (an error of ~1e-7 of a
    block's mass) and their CDF is taken in float64, which picks the block; then that block's own CDF in float64
    picks the token. A whole-row float64 CDF costs a float64 copy and a serial scan of every entry: 35 ms a step
    for 32 rows of a 151,936-token vocabulary on one core, against ~1 ms. On CUDA under train.deterministic the
    whole row is summed in exact int64 fixed point instead (torch has no deterministic float cumsum there)."""
    if probs.is_cuda and torch.are_deterministic_algorithms_enabled():
        cdf = (probs.double() * 2.0**52).round().long().cumsum(-1).double()
        return torch.searchsorted(cdf, _below(u * cdf[:, -1:], cdf[:, -1:]), right=True).squeeze(-1)
    n, vocab = probs.shape
    size = block_size(vocab)
    rows = probs.reshape(n, vocab // size, size)
    masses = rows.sum(-1).double()  # [n, blocks]
    cdf = masses.cumsum(-1)
    point = _below(u * cdf[:, -1:], cdf[:, -1:])
    # the first block whose CDF exceeds the point: one with mass, since a massless block does not raise the CDF
    block = torch.searchsorted(cdf, point, right=True)  # [n, 1]
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)  # <= point, by the search
    chosen = rows.gather(1, block[:, :, None].expand(n, 1, size)).squeeze(1)  # [n, size]
    inner = torch.searchsorted(before + chosen.double().cumsum(-1), point, right=True)
    # the block's float64 mass may fall short of its fp32 sum, leaving the point past its end: the last token
    # with mass takes it (never a token of probability 0, whose CDF step is flat)
    last = size - 1 - (chosen > 0).flip(-1).int().argmax(-1, keepdim=True)
    return (block * size + torch.minimum(inner, last)).squeeze(-1)


@functools.cache
def block_size(vocab: int) -> int:
    """The largest divisor of ``vocab`` up to ``CDF_BLOCK`` (49,152: 1,024; 151,936: 128; 80: 80)."""
    return max(d for d in range(1, min(vocab, CDF_BLOCK) + 1) if vocab % d == 0)


def _below(point: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``point`` kept strictly below ``total``, so that the search never runs past the last token with mass."""
    return torch.minimum(point, torch.nextafter(total, torch.zeros_like(total)))


def seen_tokens(prompts: list[list[int]], rows: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, V] bool, True at each token of row i's prompt (``rows[i]`` indexes ``prompts``), for the penalty."""
    seen = torch.zeros((len(prompts), vocab), dtype=torch.bool)
    for i, p in enumerate(prompts):
        seen[i, torch.tensor(p, dtype=torch.long)] = True
    return seen.to(rows.device)[rows]


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """[n, V] raw logits with every seen token's logit divided by ``penalty`` (multiplied when negative), as
    transformers' RepetitionPenaltyLogitsProcessor and vLLM: penalty > 1 discourages repeats."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)
