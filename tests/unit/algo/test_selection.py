"""The off-policy sequence mask and the 80/20 high-entropy mask (algo/selection.py): hand-computed cases,
and TRL 1.16's formulas (trl/trainer/grpo_trainer.py ``get_off_policy_mask`` and ``get_high_entropy_mask``,
written out below from their code, one process) on random tensors."""

import math

import pytest
import torch

from grpolab.algo.selection import (
    entropy_threshold,
    high_entropy_mask,
    linear_quantile,
    off_policy_sequence_mask,
)

NAN = float("nan")


def test_off_policy_mask_drops_only_negative_advantages_that_drifted():
    mask = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    sampler = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [NAN, -1.0]])
    current = torch.tensor([[-2.0, -2.0], [-2.0, -2.0], [-1.2, -5.0], [-3.0, -1.6]])
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0])
    keep = off_policy_sequence_mask(adv, current, sampler, mask, threshold=0.5)
    # row 0: mean(1, 1) = 1 > 0.5 with A < 0: dropped; row 1: the same drift, A > 0: kept; row 2: only its
    # counted token, 0.2 <= 0.5: kept; row 3: the NaN token counts 0, (0 + 0.6) / 2 = 0.3: kept
    assert keep.tolist() == [[False, False], [True, True], [True, False], [True, True]]
    assert off_policy_sequence_mask(adv, current, sampler, mask, threshold=0.25)[3].tolist() == [False, False]
    # per-token advantages are compared per token; A = 0 counts as non-negative
    per_token = torch.tensor([[0.0, -1.0], [1.0, 1.0], [-1.0, 0.0], [-1.0, -1.0]])
    assert off_policy_sequence_mask(per_token, current, sampler, mask, threshold=0.5)[0].tolist() == [True, False]


def _trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
    kl_div = sampling_per_token_logps - per_token_logps.detach()
    kl_div = torch.nan_to_num(kl_div, nan=0.0)
    seq_kl_sum = (kl_div * mask).sum(dim=1, keepdim=True)
    avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    is_pos_adv = advantages >= 0
    is_low_kl = avg_seq_kl <= off_policy_threshold
    return (is_pos_adv | is_low_kl).to(dtype=mask.dtype)


def test_off_policy_mask_is_trls_on_random_tensors():
    gen = torch.Generator().manual_seed(0)
    n, t = 64, 12
    mask = torch.arange(t) < torch.randint(0, t + 1, (n, 1), generator=gen)
    current = -torch.rand(n, t, generator=gen) * 3
    sampler = current + torch.randn(n, t, generator=gen) * 0.8
    adv = torch.randn(n, generator=gen)
    for threshold in (0.0, 0.1, 0.5):
        ours = off_policy_sequence_mask(adv, current, sampler, mask, threshold=threshold)
        trl = _trl_off_policy_mask(adv[:, None], current, sampler, mask.float(), threshold)  # [N, 1]
        assert torch.equal(ours, (trl.bool() & mask))
        assert 0 < int((~ours & mask).any(-1).sum()) < n  # both kinds of rows occur


def test_linear_quantile_is_torch_quantile():
    gen = torch.Generator().manual_seed(1)
    for n in (1, 2, 7, 1000):
        x = torch.rand(n, generator=gen) * 5
        for q in (0.0, 0.2, 0.5, 0.8, 0.999, 1.0):
            torch.testing.assert_close(linear_quantile(x, q), torch.quantile(x, q))
    assert float(linear_quantile(torch.tensor([0.1, 0.9, 0.5, 0.3, 0.7]), 0.6)) == pytest.approx(0.58)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        linear_quantile(torch.zeros(0), 0.5)


ENTROPY = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])
COUNTED = torch.tensor([[True, True, True], [True, True, False]])


@pytest.mark.parametrize(
    ("rho", "kept"),
    [
        # sorted counted entropies 0.1 0.3 0.5 0.7 0.9; the 0.6 quantile is 0.5 + 0.4 * 0.2 = 0.58
        (0.4, [[False, False, True], [False, True, False]]),
        (0.0, [[False, False, True], [False, False, False]]),  # only the maximum; the uncounted 5.0 never
        (1.0, [[True, True, True], [True, True, False]]),
        (0.5, [[False, True, True], [False, True, False]]),  # the median 0.5 itself is kept (>=)
    ],
)
def test_high_entropy_mask_keeps_the_top_fraction_of_counted_tokens(rho, kept):
    assert high_entropy_mask(ENTROPY, COUNTED, top_quantile=rho).tolist() == kept


def test_high_entropy_mask_with_a_given_threshold_and_nothing_counted():
    threshold = entropy_threshold(torch.tensor([0.0, 1.0]), 0.5)  # 0.5: computed over other tokens
    assert high_entropy_mask(ENTROPY, COUNTED, top_quantile=0.5, threshold=threshold).tolist() == [
        [False, True, True], [False, True, False],
    ]  # fmt: skip
    none = torch.zeros_like(COUNTED)
    assert not high_entropy_mask(ENTROPY, none, top_quantile=0.2).any()
    with pytest.raises(ValueError, match=r"top_quantile must be in \[0, 1\]"):
        entropy_threshold(torch.ones(3), 1.5)


def _trl_high_entropy_mask(entropies, mask, threshold):
    local = entropies[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    entropy_mask = masked_entropies >= entropy_threshold
    return entropy_mask & mask.bool()


def test_high_entropy_mask_is_trls_on_random_tensors():
    gen = torch.Generator().manual_seed(2)
    mask = torch.arange(20) < torch.randint(1, 21, (32, 1), generator=gen)
    entropy = torch.rand(32, 20, generator=gen) * math.log(50)
    for rho in (0.0, 0.05, 0.2, 0.8, 1.0):
        ours = high_entropy_mask(entropy, mask, top_quantile=rho)
        assert torch.equal(ours, _trl_high_entropy_mask(entropy, mask, 1 - rho))
    share = high_entropy_mask(entropy, mask, top_quantile=0.2).sum() / mask.sum()
    assert abs(float(share) - 0.2) < 0.01
