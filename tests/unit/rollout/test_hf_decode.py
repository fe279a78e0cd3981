"""The sampler's direct decode step (grpolab.rollout.hf_decode) against transformers' forward."""

from __future__ import annotations

import pytest
import torch

import grpolab.rollout.hf as hf
from grpolab.models.inference import packs_linear
from grpolab.rollout.hf import HFSampler
from grpolab.rollout.hf_decode import DirectDecoder, direct_decoder

BF16 = torch.bfloat16
G = 3


def _llama_gqa(tok):
    """4 query heads sharing 2 key heads (as SmolLM2's 9 share 3), so the grouped attention path runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(4)
    return LlamaForCausalLM(config).eval()


def _both(model, tok, prompts, **kw):
    """(direct step, transformers' forward) samples of the same seed; asserts the direct one ran."""
    steps = []
    original = hf.direct_step

    def spy(*args):
        steps.append(original(*args))
        return steps[-1]

    try:
        hf.direct_step = spy
        fast = HFSampler(model, tok, max_completion_length=10, autocast_dtype=BF16, **kw).sample(
            prompts, num_generations=G, generator=torch.Generator().manual_seed(0)
        )
        hf.direct_step = lambda *args: None
        slow = HFSampler(model, tok, max_completion_length=10, autocast_dtype=BF16, **kw).sample(
            prompts, num_generations=G, generator=torch.Generator().manual_seed(0)
        )
    finally:
        hf.direct_step = original
    assert steps and all(isinstance(s, DirectDecoder) for s in steps), "the direct step did not run"
    return fast, slow


@pytest.mark.parametrize("packed", [True, False])
def test_direct_step_samples_what_the_forward_samples(model, tok, prompts, packed):
    """Qwen2 (q/k/v biases), left-padded prompts; with the packed q|k|v and gate|up products and without."""
    if packed and not packs_linear(torch.device("cpu"), BF16):
        pytest.skip("this CPU's oneDNN has no native bf16")
    fast, slow = _both(model, tok, prompts, cast_weights=packed)
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    torch.testing.assert_close(fast.logprobs, slow.logprobs, atol=1e-5, rtol=0)
    assert fast.completion_mask.sum(-1).max() == 10  # a row ran every step: each was compared


def test_direct_step_with_heads_sharing_keys(tok, prompts):
    fast, slow = _both(_llama_gqa(tok), tok, prompts)
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    torch.testing.assert_close(fast.logprobs, slow.logprobs, atol=1e-5, rtol=0)


def test_direct_step_stops_at_eos_like_the_forward(eos_model, tok, prompts):
    fast, slow = _both(eos_model, tok, prompts)
    assert torch.equal(fast.completion_ids, slow.completion_ids) and torch.equal(fast.completion_mask, slow.completion_mask)
    assert not fast.completion_mask.all()  # some rows stopped early
    torch.testing.assert_close(fast.logprobs, slow.logprobs, atol=1e-5, rtol=0)


def _prompt_cache(model, rows=2, width=3):
    c = model.config
    shape = (rows, c.num_key_value_heads, width, c.hidden_size // c.num_attention_heads)
    return [(torch.randn(shape), torch.randn(shape).to(BF16)) for _ in range(c.num_hidden_layers)]


def test_direct_step_is_only_for_the_layers_it_follows(tok):
    from grpolab.tasks.tiny import build_tiny_model

    attention = torch.ones(2, 3, dtype=torch.long)
    plain = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=2).eval()
    assert isinstance(direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16), DirectDecoder)
    assert direct_decoder(plain.train(), _prompt_cache(plain), attention, 8, BF16) is None  # dropout would apply
    plain.eval()
    assert direct_decoder(plain, _prompt_cache(plain)[:1], attention, 8, BF16) is None  # a cache per layer
    plain.config.layer_types = ["full_attention", "sliding_attention"]
    assert direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16) is None
    plain.config.layer_types = ["full_attention"] * 2
    plain.config._attn_implementation = "flex_attention"
    assert direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16) is None


def test_direct_step_opens_one_slot_per_token_and_grows_its_cache_by_blocks(tok, monkeypatch):
    from grpolab.rollout import hf_decode
    from grpolab.tasks.tiny import build_tiny_model

    monkeypatch.setattr(hf_decode, "WINDOW_BLOCK", 4)
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=2).eval()
    attention = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded
    prompt = _prompt_cache(model)
    step = direct_decoder(model, prompt, attention, 6, BF16)
    low = torch.finfo(torch.float32).min
    assert step.mask[:, 0, 0].tolist() == [[low, 0, 0, low, low, low], [0, 0, 0, low, low, low]]
    ids = torch.tensor([[5], [6]])
    with torch.inference_mode(), torch.autocast("cpu", dtype=BF16):
        logits = step(ids, torch.tensor([[2], [3]]))  # slot 3: the cache grows from 3 to 4 slots
        keys, values = step.cache[1]
        assert logits.shape == (2, model.config.vocab_size) and step.filled == 4 and keys.shape[2] == 4
        assert keys.dtype == BF16 and torch.equal(keys[:, :, :3], prompt[1][0].to(BF16))
        assert torch.equal(values[:, :, :3], prompt[1][1]) and (keys[:, :, 3] != 0).all()
        assert step.mask[:, 0, 0, 3].tolist() == [0, 0]
        step(ids, torch.tensor([[3], [4]]))  # slot 4: grows to 6 (the capacity), not 8
        grown = step.cache[1][0]
        assert grown.shape[2] == 6 and torch.equal(grown[:, :, :4], keys) and (grown[:, :, 5] == 0).all()
        step(ids, torch.tensor([[4], [5]]))
        with pytest.raises(RuntimeError, match="no slot is left"):
            step(ids, torch.tensor([[5], [6]]))
