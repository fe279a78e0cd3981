import itertools
import math

import pytest
import torch

from grpolab.algo.kl import kl_k3
from grpolab.algo.losses import (
    AGGREGATIONS,
    Aggregation,
    aggregate,
    batch_row_norms,
    clipped_surrogate_loss,
    dpo_loss,
    value_loss,
)


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


def _one_token(ratio: float, adv: float, **kw):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = clipped_surrogate_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), **kw)
    out.loss.sum().backward()
    return out.loss.item(), logp.grad.item(), out.clipped_low.item(), out.clipped_high.item()


@pytest.mark.parametrize(
    ("ratio", "adv", "objective", "grad_flows", "low", "high"),
    [
        (1.5, 1.0, 1.2, False, False, True),
        (0.5, -1.0, -0.8, False, True, False),
        (1.5, -1.0, -1.5, True, False, False),
        (0.5, 1.0, 0.5, True, False, False),
    ],
)
def test_clip_cases(ratio, adv, objective, grad_flows, low, high):
    loss, grad, clipped_low, clipped_high = _one_token(ratio, adv)
    assert loss == pytest.approx(-objective)
    # d loss / d logp = -A * ratio where the gradient flows
    assert grad == pytest.approx(-adv * ratio if grad_flows else 0.0)
    assert (clipped_low, clipped_high) == (low, high)


def test_clip_higher():
    loss, grad, _, high = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert (loss, grad, high) == (pytest.approx(-1.25), pytest.approx(-1.25), False)
    loss, grad, _, high = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.2)
    assert (loss, grad, high) == (pytest.approx(-1.2), 0.0, True)


def test_dual_clip_caps_negative_advantage_loss():
    assert _one_token(5.0, -1.0)[:2] == (pytest.approx(5.0), pytest.approx(5.0))
    loss, grad, _, _ = _one_token(5.0, -1.0, dual_clip=3.0)
    assert (loss, grad) == (pytest.approx(3.0), 0.0)
    assert _one_token(2.0, -1.0, dual_clip=3.0)[0] == pytest.approx(2.0)
    assert _one_token(5.0, 1.0, dual_clip=3.0)[0] == pytest.approx(-1.2)
    with pytest.raises(ValueError, match="dual_clip"):
        _one_token(1.0, 1.0, dual_clip=0.5)


def _batch(seed=0, n=4, t=5):
    g = torch.Generator().manual_seed(seed)
    logp = (torch.randn(n, t, dtype=torch.float64, generator=g) - 2).requires_grad_()
    lengths = torch.tensor([t, 2, 3, 1][:n])
    mask = torch.arange(t) < lengths[:, None]
    return logp, mask, lengths, g


def test_mu_one_gradient_is_reinforce():
    logp, mask, _, g = _batch()
    adv = torch.randn(logp.shape, dtype=torch.float64, generator=g)
    out = clipped_surrogate_loss(logp, logp.detach(), adv, mask=mask)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    (expected,) = torch.autograd.grad(-(adv * logp * mask).sum(), logp)
    close(grad, expected)
    assert not out.clipped_low.any() and not out.clipped_high.any()


def test_sequence_advantages_broadcast_over_tokens():
    logp, mask, _, g = _batch()
    old = logp.detach() + 0.3 * torch.randn(logp.shape, dtype=torch.float64, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    a = clipped_surrogate_loss(logp, old, adv, mask=mask)
    b = clipped_surrogate_loss(logp, old, adv[:, None].expand(-1, 5), mask=mask)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert torch.equal(a.loss[~mask], torch.zeros((~mask).sum().item(), dtype=torch.float64))


def test_gspo_mu_one_ratio_is_one_and_gradient_is_length_normalised():
    logp, mask, lengths, _ = _batch()
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    out = clipped_surrogate_loss(logp, logp.detach(), adv, level="sequence", mask=mask)
    close(out.loss, torch.where(mask, -adv[:, None].expand(-1, 5), 0.0))
    loss = aggregate(out.loss, mask, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    n = 4
    expected = torch.where(mask, -(adv / (n * lengths))[:, None].expand(-1, 5), 0.0)
    close(grad, expected)


def test_gspo_clips_on_the_sequence_ratio():
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-0.1, -0.3], [-0.1, 0.1]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    seq = clipped_surrogate_loss(logp, old, adv, level="sequence", mask=mask)
    # row 0: s = exp(0.2) = 1.221 > 1.2 -> clipped at both tokens; row 1: s = 1
    close(seq.loss, [[-1.2, -1.2], [-1.0, -1.0]])
    assert seq.clipped_high.tolist() == [[True, True], [False, False]]
    tok = clipped_surrogate_loss(logp, old, adv, mask=mask)
    close(tok.loss, [[-math.exp(0.1), -1.2], [-math.exp(0.1), -math.exp(-0.1)]])
    with pytest.raises(ValueError, match="mask"):
        clipped_surrogate_loss(logp, old, adv, level="sequence")


def test_surrogate_shape_checks():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate_loss(logp, logp, torch.zeros(3))
    with pytest.raises(ValueError, match="old_logprobs"):
        clipped_surrogate_loss(logp, torch.zeros(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="mask"):
        clipped_surrogate_loss(logp, logp, torch.zeros(2), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="level"):
        clipped_surrogate_loss(logp, logp, torch.zeros(2), level="seq")


# --- aggregation ---------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0], [7.0, 100.0, 100.0, 100.0]])
MASK = torch.tensor([[True, True, True, True], [True, True, False, False], [True, False, False, False]])


def test_each_mode_on_ragged_mask():
    # counted row sums 10, 11, 7; lengths 4, 2, 1; N = 3
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2.5 + 5.5 + 7) / 3)
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(28 / 7)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=5).item() == pytest.approx(28 / 15)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(28 / 3)


def test_an_aggregation_chosen_once_is_the_named_reduction_with_its_length_bound():
    dr_grpo = Aggregation.named("seq-mean-token-sum-norm", norm_len=5)
    assert dr_grpo.reduce is AGGREGATIONS["seq-mean-token-sum-norm"] and dr_grpo.norm_len == 5
    assert dr_grpo(LOSS, MASK).item() == pytest.approx(28 / 15)
    # the whole batch's totals, as a micro-batch of a larger batch passes them: 28 / (6 x 5)
    assert dr_grpo(LOSS, MASK, total_seqs=6.0).item() == pytest.approx(28 / 30)
    assert Aggregation.named("token-mean")(LOSS, MASK, total_tokens=14.0).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        Aggregation.named("token-sum")  # a bad name fails when chosen, not at the first micro-batch
    with pytest.raises(ValueError, match="total_seqs must be > 0"):
        dr_grpo(LOSS, MASK, total_seqs=0.0)


def test_modes_are_pairwise_different():
    norms = batch_row_norms(MASK, 2)  # bnpo's batches of 2 rows (of one row it is grpo, of all rows dapo)
    values = {mode: aggregate(LOSS, MASK, mode, norm_len=5, row_norm=norms).item() for mode in AGGREGATIONS}
    assert set(values) == {
        "seq-mean-token-mean",
        "token-mean",
        "seq-mean-token-sum-norm",
        "seq-mean-token-sum",
        "batch-token-mean",
    }
    for a, b in itertools.combinations(values, 2):
        assert values[a] != pytest.approx(values[b]), f"{a} == {b}"


def test_equal_lengths_equivalences():
    loss = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, :3] = True  # L = 3
    grpo = aggregate(loss, mask, "seq-mean-token-mean")
    close(aggregate(loss, mask, "token-mean"), grpo)
    close(aggregate(loss, mask, "seq-mean-token-sum-norm", norm_len=6), grpo * 3 / 6)
    close(aggregate(loss, mask, "seq-mean-token-sum"), grpo * 3)


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(5, 6, dtype=torch.float64, generator=g)
    mask = torch.arange(6) < torch.tensor([6, 1, 4, 2, 5])[:, None]
    norms = batch_row_norms(mask, 2)  # read by batch-token-mean only
    full = aggregate(loss, mask, mode, norm_len=6, row_norm=norms)
    totals = {"total_seqs": 5, "total_tokens": int(mask.sum())}
    parts = [aggregate(loss[s], mask[s], mode, norm_len=6, row_norm=norms[s], **totals) for s in (slice(0, 2), slice(2, 5))]
    close(parts[0] + parts[1], full)


def test_aggregate_checks():
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="shorter"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=3)
    with pytest.raises(ValueError, match="mode"):
        aggregate(LOSS, MASK, "sum")
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        aggregate(LOSS, MASK[:, :2], "token-mean")


def test_grpo_gradient_coefficient_eq21():
    # G = 2, lengths 3 and 2; loss = -J with J = surrogate - beta * k3, seq-mean-token-mean
    g = torch.Generator().manual_seed(2)
    logp = (torch.rand(2, 3, dtype=torch.float64, generator=g).log()).requires_grad_()
    ref = torch.rand(2, 3, dtype=torch.float64, generator=g).log()
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv, beta = torch.tensor([0.7, -0.7], dtype=torch.float64), 0.5
    surrogate = clipped_surrogate_loss(logp, logp.detach(), adv, mask=mask).loss
    loss = aggregate(surrogate, mask, "seq-mean-token-mean") + beta * aggregate(
        kl_k3(logp, ref), mask, "seq-mean-token-mean"
    )
    (grad,) = torch.autograd.grad(loss, logp)
    gc = adv[:, None] + beta * (ref.exp() / logp.detach().exp() - 1)
    lengths = torch.tensor([3.0, 2.0], dtype=torch.float64)[:, None]
    close(grad, torch.where(mask, -gc / (2 * lengths), 0.0))


# --- value and DPO -------------------------------------------------------------------------------


def test_value_loss_hand_values():
    values = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    old = torch.tensor([[0.5, 2.1, 0.5]])
    returns = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    # t0: unclipped (1-2)^2 = 1, clipped (0.7-2)^2 = 1.69 -> 1.69 (clip active); t1: 0 and 0
    loss, frac = value_loss(values, old, returns, mask, clip=0.2)
    assert (loss.item(), frac.item()) == (pytest.approx(0.5 * 1.69 / 2), 0.5)
    loss.backward()
    assert values.grad[0, 0].item() == 0.0
    loss, frac = value_loss(values, old, returns, mask, clip=None)
    assert (loss.item(), frac.item()) == (pytest.approx(0.25), 0.0)
    with pytest.raises(ValueError, match="returns"):
        value_loss(values, old, returns[:, :2], mask)


def test_dpo_loss_hand_values():
    out = dpo_loss(
        torch.tensor([-1.0, -3.0]),
        torch.tensor([-2.0, -3.0]),
        torch.tensor([-1.5, -3.0]),
        torch.tensor([-1.5, -3.0]),
        beta=0.1,
    )
    # margins: (0.5) - (-0.5) = 1 -> -log sigmoid(0.1); 0 -> log 2
    close(out, [math.log1p(math.exp(-0.1)), math.log(2)])
    with pytest.raises(ValueError, match=r"\[P\]"):
        dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2), beta=0.1)
