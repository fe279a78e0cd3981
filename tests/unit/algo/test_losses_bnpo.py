""""batch-token-mean" (TRL's bnpo): each batch of rows divided by its own tokens, the batches averaged, with
hand-computed values; micro-batches for memory do not change it."""

from __future__ import annotations

import pytest
import torch

from grpolab.algo.losses import Aggregation, aggregate, batch_row_norms

LOSS = torch.tensor([[1.0, 2.0, 5.0], [4.0, 7.0, 7.0], [1.0, 1.0, 1.0], [9.0, 9.0, 9.0]])
MASK = torch.arange(3)[None, :] < torch.tensor([2, 1, 3, 0])[:, None]  # 2, 1, 3 and 0 counted tokens


def test_row_norms_are_each_batchs_tokens_times_the_number_of_batches():
    # batches (rows 0, 1): 3 tokens, (rows 2, 3): 3 tokens; 2 batches
    torch.testing.assert_close(batch_row_norms(MASK, 2), torch.tensor([6.0, 6.0, 6.0, 6.0], dtype=torch.float64))
    # batches of 3: (0, 1, 2) 6 tokens, (3,) none, counted as 1 (TRL's clamp(min=1)); every rank's 5 batches
    torch.testing.assert_close(
        batch_row_norms(MASK, 3, num_batches=5.0), torch.tensor([30.0, 30.0, 30.0, 5.0], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="batch_rows must be >= 1"):
        batch_row_norms(MASK, 0)


def test_the_loss_is_the_mean_over_batches_of_each_batchs_token_mean_whatever_the_micro_batches():
    # batch (0, 1): (1 + 2 + 4) / 3 = 7/3; batch (2, 3): (1 + 1 + 1) / 3 = 1; their mean 5/3 (TRL: each
    # micro-batch's bnpo loss / gradient_accumulation_steps, summed)
    norms = batch_row_norms(MASK, 2)
    whole = aggregate(LOSS, MASK, "batch-token-mean", row_norm=norms)
    assert whole.item() == pytest.approx(5 / 3)
    split = sum(
        aggregate(LOSS[rows], MASK[rows], "batch-token-mean", row_norm=norms[rows])
        for rows in (torch.tensor([0]), torch.tensor([1, 2]), torch.tensor([3]))
    )
    assert split.item() == pytest.approx(5 / 3)
    # without row_norm the rows given are one batch: their token mean, (1 + 2 + 4 + 1 + 1 + 1) / 6
    assert aggregate(LOSS, MASK, "batch-token-mean").item() == pytest.approx(10 / 6)
    # batches of one row are grpo's per-sequence mean (the empty row counts, with 0): (1.5 + 4 + 1 + 0) / 4
    one = aggregate(LOSS, MASK, "batch-token-mean", row_norm=batch_row_norms(MASK, 1))
    assert one.item() == pytest.approx(aggregate(LOSS, MASK, "seq-mean-token-mean").item())


def test_batch_rows_belong_to_batch_token_mean_only():
    assert Aggregation.named("batch-token-mean", batch_rows=3).batch_rows == 3
    with pytest.raises(ValueError, match="batch-token-mean"):
        Aggregation.named("token-mean", batch_rows=3)
    with pytest.raises(ValueError, match=r"row_norm must be \[N\]"):
        aggregate(LOSS, MASK, "batch-token-mean", row_norm=torch.ones(3))
