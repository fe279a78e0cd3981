"""model.lm_head_fp32 (TRL's cast_lm_head_to_fp32): the head's weight and GEMMs in fp32 under bf16 autocast,
a tied embedding sharing the fp32 weight and returning the model's dtype."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.config import ModelConfig
from grpolab.models import chunked_head as chunked_head_module
from grpolab.models.chunked_head import ChunkedLMHead, install_chunked_head, keep_head_in_fp32
from grpolab.models.loading import load_policy
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model


def _head(fp32: bool) -> ChunkedLMHead:
    """V = 2, H = 1: logits h * (1 + 2^-10) and h * 1, which a bf16 GEMM rounds to the same value."""
    head = ChunkedLMHead.sharing(torch.nn.Linear(1, 2, bias=False))
    head.weight = torch.nn.Parameter(torch.tensor([[1.0 + 2**-10], [1.0]]))
    head.fp32 = fp32
    return head


@pytest.mark.parametrize("fp32", [False, True])
def test_the_fp32_head_keeps_the_logit_gap_bf16_rounds_away(fp32):
    hidden = torch.ones(1, 1, 1)
    request = chunked_head_module.HeadRequest(torch.tensor([[0]]), 1.0, chunk=4)
    head = _head(fp32)
    with chunked_head_module.head_request(head, request), torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(hidden)
    # the fp32 head: log p(0) = -log(1 + e^-gap), gap = 2^-10; the bf16 one: both logits 1, log 0.5
    want = -math.log1p(math.exp(-(2**-10))) if fp32 else math.log(0.5)
    assert out[0, 0, 0].item() == pytest.approx(want, abs=1e-7)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # no request: the logits, in fp32 and unrounded
        logits = head(hidden)
    if fp32:
        assert logits.dtype == torch.float32 and (logits[0, 0, 0] - logits[0, 0, 1]).item() == pytest.approx(2**-10)
    else:
        assert logits.dtype == torch.bfloat16


def test_a_tied_bf16_model_keeps_its_head_in_fp32_and_its_embedding_output_in_bf16():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).to(torch.bfloat16)
    assert install_chunked_head(model)
    keep_head_in_fp32(model)
    assert model.lm_head.weight.dtype == torch.float32 and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # the rest is left as it was
    ids = torch.tensor([tok("12+3=")["input_ids"]])
    assert model.model.embed_tokens(ids).dtype == torch.bfloat16
    assert model(ids).logits.dtype == torch.float32  # the bf16 body runs, the head computes in fp32


def test_load_policy_keeps_the_head_in_fp32_when_asked(tiny_model_dir):
    cfg = ModelConfig(name_or_path=tiny_model_dir, device="cpu", dtype="bfloat16", lm_head_fp32=True)
    model, _ = load_policy(cfg)
    assert model.lm_head.fp32 and model.lm_head.weight.dtype == torch.float32
    plain, _ = load_policy(ModelConfig(name_or_path=tiny_model_dir, device="cpu", dtype="bfloat16"))
    assert not plain.lm_head.fp32 and plain.lm_head.weight.dtype == torch.bfloat16


def test_a_head_that_is_not_a_plain_linear_is_refused():
    model = torch.nn.Sequential()
    with pytest.raises(ValueError, match="not a plain Linear"):
        keep_head_in_fp32(model)
