import math

import pytest
import torch

from grpolab.algo.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3

LOG_PI = torch.tensor([[math.log(0.5)]])
LOG_REF = torch.tensor([[math.log(0.25)]])


def test_hand_values():
    assert kl_k3(LOG_PI, LOG_REF).item() == pytest.approx(0.5 - math.log(0.5) - 1, abs=1e-6)
    assert kl_k3(LOG_PI, LOG_REF).item() == pytest.approx(0.1931, abs=1e-4)
    assert kl_k1(LOG_PI, LOG_REF).item() == pytest.approx(math.log(2))
    assert kl_k2(LOG_PI, LOG_REF).item() == pytest.approx(0.5 * math.log(2) ** 2)


def test_nonnegative_and_zero_at_equality():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=g) * 3
    ref = logp + torch.randn(64, 32, generator=g) * torch.logspace(-6, 1, 32)
    assert (kl_k2(logp, ref) >= 0).all()
    assert (kl_k3(logp, ref) >= 0).all()
    for fn in KL_ESTIMATORS.values():
        assert torch.equal(fn(logp, logp), torch.zeros_like(logp))


def test_k3_gradient_is_one_minus_ratio():
    logp = torch.log(torch.tensor([[0.5, 0.1, 0.9]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.3, 0.9]]))
    kl_k3(logp, ref).sum().backward()
    expected = 1 - ref.exp() / logp.detach().exp()
    torch.testing.assert_close(logp.grad, expected)


def test_k3_clamp_keeps_extreme_log_ratio_finite_and_nonnegative():
    out = kl_k3(torch.tensor([[0.0, 0.0]]), torch.tensor([[-1e4, 1e4]]))
    assert torch.isfinite(out).all() and (out >= 0).all()


def _categorical(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, dtype=torch.float64, generator=g), torch.randn(6, dtype=torch.float64, generator=g)


def _expected_loss_grad(fn, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact E_{x~pi}[grad k(x)] over a 6-way categorical: the gradient of k used as a loss."""
    logits, ref_logits = _categorical(seed)
    logits.requires_grad_()
    logp, ref = torch.log_softmax(logits, 0), torch.log_softmax(ref_logits, 0)
    (logp.exp().detach() * fn(logp, ref)).sum().backward()
    return logits.grad, ref


def _kl_grad(seed: int, forward: bool) -> torch.Tensor:
    logits, ref_logits = _categorical(seed)
    logits.requires_grad_()
    logp, ref = torch.log_softmax(logits, 0), torch.log_softmax(ref_logits, 0)
    kl = (ref.exp() * (ref - logp)).sum() if forward else (logp.exp() * (logp - ref)).sum()
    kl.backward()
    return logits.grad


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_gradients_follow_the_documented_divergence(seed):
    grad_k1, _ = _expected_loss_grad(kl_k1, seed)
    grad_k2, _ = _expected_loss_grad(kl_k2, seed)
    grad_k3, _ = _expected_loss_grad(kl_k3, seed)
    torch.testing.assert_close(grad_k1, torch.zeros_like(grad_k1))
    torch.testing.assert_close(grad_k2, _kl_grad(seed, forward=False))
    torch.testing.assert_close(grad_k3, _kl_grad(seed, forward=True))
    assert not torch.allclose(grad_k2, grad_k3)


def test_k1_in_the_reward_gives_the_reverse_kl_gradient():
    logits, ref_logits = _categorical(3)
    logits.requires_grad_()
    logp, ref = torch.log_softmax(logits, 0), torch.log_softmax(ref_logits, 0)
    # REINFORCE with reward -k1: E_pi[sg(k1) grad log pi]
    (logp.exp().detach() * kl_k1(logp, ref).detach() * logp).sum().backward()
    torch.testing.assert_close(logits.grad, _kl_grad(3, forward=False))


def test_registry_and_shape_check():
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "abs"}
    values = [fn(LOG_PI, LOG_REF).item() for fn in KL_ESTIMATORS.values()]
    assert len({round(abs(v), 6) for v in values}) == 3  # abs = |k1|; k2, k3 differ
    assert KL_ESTIMATORS["abs"](torch.tensor([-1.0, 0.5]), torch.tensor([-0.25, 0.5])).tolist() == [0.75, 0.0]
    with pytest.raises(ValueError, match="same shape"):
        kl_k3(torch.zeros(2, 3), torch.zeros(2, 4))
