"""The step's spec: frozen, and the update's forward packed exactly when train.padding_free says so."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.packing import packed_completion_logprobs
from grpolab.training.spec import LogprobContext
from grpolab.types import RolloutBatch


def _batch() -> RolloutBatch:
    tok = build_char_tokenizer()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    ids = torch.randint(4, 60, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(5) < torch.tensor([5, 2])[:, None]
    return RolloutBatch(prompts, ids, mask, mask, mask.float())


def test_the_update_forward_packs_only_padding_free_micro_batches():
    model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=0)
    mb = _batch()
    args = (model, mb.prompt_ids, mb.completion_ids, mb.completion_mask)
    settings = {"pad_id": 0, "temperature": 0.7, "autocast_dtype": None, "with_entropy": True}
    for padding_free, fn in ((False, completion_logprobs), (True, packed_completion_logprobs)):
        ctx = LogprobContext(0, 0.7, None, 8, padding_free=padding_free)
        got, entropy = ctx.forward(model, mb)
        want, want_entropy = fn(*args, **settings)  # the same function with the same settings: the same numbers
        assert torch.equal(got, want) and torch.equal(entropy, want_entropy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.temperature = 1.0
