"""The hf engine's draw filters (rollout/filters.py): top-k, top-p, min-p and the repetition penalty, by hand
and against transformers' own logits processors (what ``generate`` and TRL's non-vLLM path apply)."""

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from grpolab.rollout.filters import (
    block_size,
    draw_tokens,
    filter_logits,
    mass_before,
    penalise_repeats,
    seen_tokens,
    tokens_at,
)


def test_filter_logits_hand_computed():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    inf = float("-inf")
    assert filter_logits(logits, top_k=2, top_p=1.0).tolist() == [[3.0, 2.0, inf, inf]]
    assert filter_logits(logits, top_k=0, top_p=1.0) is logits
    probs = torch.tensor([[0.5, 0.3, 0.2]]).log()
    # The mass before token 2 is 0.5 < 0.7, before token 3 it is 0.8: keep two.
    assert filter_logits(probs, top_k=0, top_p=0.7).isinf().tolist() == [[False, False, True]]
    assert filter_logits(probs, top_k=0, top_p=0.5).isinf().tolist() == [[False, True, True]]
    assert filter_logits(probs, top_k=2, top_p=0.5).isinf().tolist() == [[False, True, True]]


def test_min_p_keeps_the_tokens_within_a_factor_of_the_most_likely():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # min_p 0.2: keep p >= 0.1 (0.5, 0.3, 0.15); 0.5: keep p >= 0.25
    assert filter_logits(probs.log(), top_k=0, top_p=1.0, min_p=0.2).isinf().tolist() == [[False, False, False, True]]
    assert filter_logits(probs.log(), top_k=0, top_p=1.0, min_p=0.5).isinf().tolist() == [[False, False, True, True]]
    assert filter_logits(probs.log(), top_k=0, top_p=1.0, min_p=1.0).isinf().tolist() == [[False, True, True, True]]


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.3])
def test_min_p_is_transformers_min_p_warper(min_p):
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(16, 300, generator=gen)
    ours = filter_logits(logits, top_k=0, top_p=1.0, min_p=min_p)
    theirs = MinPLogitsWarper(min_p)(torch.zeros(16, 1, dtype=torch.long), logits.clone())
    assert torch.equal(ours.isinf(), theirs.isinf()) and 0 < int(ours.isinf().sum()) < logits.numel()


def test_the_repetition_penalty_is_transformers_processor_on_the_unpadded_ids():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 12, generator=gen)
    prompts = [[1, 2, 2, 5], [7]]
    rows = torch.tensor([0, 0, 1])  # two samples of prompt 0, one of prompt 1
    seen = seen_tokens(prompts, rows, 12)
    seen[1, 9] = True  # row 1 has sampled token 9 since
    ours = penalise_repeats(logits, seen, 1.3)
    for i, ids in enumerate([[1, 2, 2, 5], [1, 2, 2, 5, 9], [7]]):
        theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([ids]), logits[i : i + 1].clone())
        torch.testing.assert_close(ours[i : i + 1], theirs)
    assert torch.equal(ours[2, :7], logits[2, :7])  # tokens not seen are untouched


def test_top_p_in_fixed_point_keeps_the_same_nucleus():
    """Top-p under train.deterministic on CUDA sums the sorted probabilities in int64 fixed point (torch has
    no deterministic float cumsum there): the mass before each token is the float sum's to 1e-6, and the
    nucleus kept is the same, here on peaked and on flat rows."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.cat([4 * torch.randn(6, 500, generator=gen), 0.01 * torch.randn(2, 500, generator=gen)])
    probs = torch.softmax(logits, -1).sort(-1, descending=True).values
    exact, fixed = mass_before(probs), mass_before(probs, fixed=True)
    assert fixed.dtype == probs.dtype and (fixed - exact).abs().max() < 1e-6
    for p in (0.1, 0.5, 0.9, 0.99):
        clear = (exact - p).abs() > 1e-5  # away from the threshold by more than either sum's rounding
        assert clear.float().mean() > 0.99 and torch.equal((fixed >= p)[clear], (exact >= p)[clear])


def test_tokens_at_inverts_the_cdf_by_hand():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75], [2.0, 0.0, 2.0, 0.0]])  # the second row unnormalised: total 4
    at = lambda u0, u1: tokens_at(probs, torch.tensor([[u0], [u1]], dtype=torch.float64)).tolist()  # noqa: E731
    assert at(0.0, 0.0) == [1, 0]  # u = 0: the first token with mass, never one of probability 0
    assert at(0.2499, 0.4999) == [1, 0] and at(0.25, 0.5) == [3, 2]  # the CDF's steps: 0.25 | 1.0, 2 | 4
    assert at(1 - 2**-53, 1 - 2**-53) == [3, 2]  # the largest uniform stays on the last token with mass


def test_tokens_at_over_blocks_is_the_whole_row_inverse_cdf():
    """Two levels (fp32 block sums, float64 CDFs) draw what one float64 CDF over the row draws, away from a step
    by more than the block sums' rounding; never a token of probability 0 (zeros at blocks' ends and starts)."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(64, 3 * 1024, generator=gen), -1)
    probs[:, 1000:1100] = 0.0  # the end of block 0 and the start of block 1
    probs[:, -7:] = 0.0
    u = torch.rand(64, 1, dtype=torch.float64, generator=gen)
    cdf = probs.double().cumsum(-1)
    exact = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    assert block_size(probs.shape[1]) == 1024 and torch.equal(tokens_at(probs, u), exact)
    top = torch.full((64, 1), 1 - 2**-53, dtype=torch.float64)
    assert torch.equal(tokens_at(probs, top), torch.full((64,), 3 * 1024 - 8))  # the last token with mass


def test_tokens_at_when_a_block_sums_above_its_float64_mass():
    """fp32 rounds 1 + (2^-24 + 2^-47) up to 1 + 2^-23, above the float64 sum: a point past the block's float64
    CDF takes its last token with mass, not the zero after it (nor an index past the vocabulary)."""
    probs = torch.tensor([[1.0, 2**-24 + 2**-47, 0.0]])
    assert probs.sum(-1).item() == 1 + 2**-23 and probs.double().sum() < 1 + 2**-23
    assert tokens_at(probs, torch.tensor([[1 - 2**-53]], dtype=torch.float64)).tolist() == [1]


def test_block_size_divides_the_vocabulary():
    assert [block_size(v) for v in (49_152, 151_936, 80, 50_257, 7)] == [1024, 128, 80, 29, 7]


def test_draw_tokens_draws_the_distribution_and_never_a_zero():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75]]).repeat(20_000, 1)
    tokens = draw_tokens(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=4)
    assert counts[0] == 0 and counts[2] == 0
    # 20,000 draws: the share's standard deviation is 0.003, so 0.02 is ~6.5 of them (fixed seed: no flakiness)
    assert abs(counts[1].item() / 20_000 - 0.25) < 0.02
    again = draw_tokens(probs, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)  # one seed, one stream
