import pytest
import torch

from grpolab.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten

NAN = float("nan")
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, 6.0]])
MASK = torch.tensor([[True, True, False], [True, False, True]])


def test_sum_and_mean_hand_values_ignore_masked_nan():
    assert masked_sum(X, MASK).item() == 13.0
    assert torch.equal(masked_sum(X, MASK, dim=-1), torch.tensor([3.0, 10.0]))
    assert masked_mean(X, MASK).item() == pytest.approx(13 / 4)
    assert torch.equal(masked_mean(X, MASK, dim=-1), torch.tensor([1.5, 5.0]))
    assert torch.equal(masked_mean(X, MASK, dim=0), torch.tensor([2.5, 2.0, 6.0]))


def test_empty_selection_gives_zero_not_nan():
    empty = torch.zeros_like(MASK)
    assert masked_mean(X, empty).item() == 0.0
    assert torch.equal(masked_mean(X, empty, dim=-1), torch.zeros(2))
    assert masked_var(X, empty).item() == 0.0


def test_var_matches_torch_on_selected_values():
    x = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    sel = x[mask]
    assert masked_var(x, mask).item() == pytest.approx(sel.var(unbiased=True).item())
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(sel.var(unbiased=False).item())
    rows = masked_var(x, mask, dim=-1)
    for i in range(5):
        expected = x[i][mask[i]].var().item() if mask[i].sum() > 1 else 0.0
        assert rows[i].item() == pytest.approx(expected)


def test_var_single_entry_is_zero():
    mask = torch.tensor([[True, False, False], [False, False, False]])
    assert masked_var(X, mask).item() == 0.0
    assert masked_var(X, mask, unbiased=False).item() == 0.0


def test_whiten():
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 3 + 5
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    w = masked_whiten(x, mask)
    assert w[mask].mean().item() == pytest.approx(0.0, abs=1e-12)
    assert w[mask].std().item() == pytest.approx(1.0, rel=1e-6)
    assert torch.equal(w[~mask], torch.zeros((~mask).sum().item(), dtype=x.dtype))
    kept = masked_whiten(x, mask, shift_mean=False)
    assert kept[mask].mean().item() == pytest.approx(x[mask].mean().item())
    assert kept[mask].std().item() == pytest.approx(1.0, rel=1e-6)


def test_shape_and_dtype_checks():
    with pytest.raises(ValueError, match="same shape"):
        masked_sum(X, MASK[:, :2])
    with pytest.raises(ValueError, match="bool"):
        masked_mean(X, MASK.float())
