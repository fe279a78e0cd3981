"""The sampler's direct decode step (grpolab.rollout.hf_decode) against transformers' forward."""

from __future__ import annotations

import copy

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


def _qwen3(tok):
    """Qwen3: an RMSNorm over each query and key head before the rotary embedding; 4 query heads on 2 key heads."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(5)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # norms' weights other than ones, so that a skipped norm shows
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


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


def _float64_logprobs(model, prompts, out) -> torch.Tensor:
    """The log-probs of ``out``'s sampled tokens under a float64 copy of ``model`` (each row alone, unpadded)."""
    exact = copy.deepcopy(model).double()
    logprobs = torch.zeros(out.logprobs.shape, dtype=torch.float64)
    for i, row in enumerate(out.completion_ids):
        prompt, n = prompts[i // G], int(out.completion_mask[i].sum())
        ids = torch.tensor(prompt + row[:n].tolist())[None]
        with torch.no_grad():
            logits = exact(ids).logits[0, len(prompt) - 1 : -1]
        logprobs[i, :n] = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    return logprobs


def _sharp(model, factor: float = 4.0):
    """A copy of ``model`` with its query and key weights scaled up: a random model's attention is near uniform,
    where a wrong scale or mask would hardly change a log-prob; this one's is peaked (measured: an attention
    scaled 1.5x then misses float64 by ~0.03-0.04 here, against ~0.002 for both engines)."""
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        for layer in sharp.model.layers:
            attn = layer.self_attn
            # Qwen3 normalises each head after the products: its norms' weights set the scale
            for module in (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else (attn.q_proj, attn.k_proj):
                module.weight.mul_(factor)
    return sharp


def _as_close_as_the_forward(model, prompts, fast, slow, attention: str) -> None:
    """The batched products compute transformers' own operations: the same tokens and log-probs. SDPA keeps the
    scores in fp32 where the eager attention rounds them to bf16 (other roundings, the same precision): its
    log-probs are as close to float64 as transformers' bf16 forward's, within a factor 2 or bf16's resolution,
    each engine's tokens judged under float64."""
    if attention == "products":
        assert torch.equal(fast.completion_ids, slow.completion_ids)
        torch.testing.assert_close(fast.logprobs, slow.logprobs, atol=1e-5, rtol=0)
        return
    fast_error = (fast.logprobs.double() - _float64_logprobs(model, prompts, fast)).abs().max()
    slow_error = (slow.logprobs.double() - _float64_logprobs(model, prompts, slow)).abs().max()
    assert fast_error <= max(2 * slow_error, 2**-8), (fast_error, slow_error)


@pytest.fixture(params=["sdpa", "products"])
def attention(request, monkeypatch):
    """The direct step's one-token attention: SDPA (chosen on CPUs with AMX) or the batched products (elsewhere)."""
    from grpolab.rollout import hf_decode

    monkeypatch.setattr(hf_decode, "fused_decode_attention", lambda device, dtype: request.param == "sdpa")
    return request.param


@pytest.mark.parametrize("packed", [True, False])
def test_direct_step_samples_what_the_forward_samples(model, tok, prompts, packed, attention):
    """Qwen2 (q/k/v biases), left-padded prompts; with the packed q|k|v and gate|up products and without."""
    if packed and not packs_linear(torch.device("cpu"), BF16):
        pytest.skip("this CPU's oneDNN has no native bf16")
    model = _sharp(model)
    fast, slow = _both(model, tok, prompts, cast_weights=packed)
    _as_close_as_the_forward(model, prompts, fast, slow, attention)
    assert fast.completion_mask.sum(-1).max() == 10  # a row ran every step: each was compared


def test_direct_step_with_heads_sharing_keys(tok, prompts, attention):
    model = _sharp(_llama_gqa(tok))
    fast, slow = _both(model, tok, prompts)
    _as_close_as_the_forward(model, prompts, fast, slow, attention)


def test_direct_step_with_qwen3_head_norms(tok, prompts, attention):
    model = _sharp(_qwen3(tok))
    fast, slow = _both(model, tok, prompts)
    _as_close_as_the_forward(model, prompts, fast, slow, attention)


def test_direct_step_stops_at_eos_like_the_forward(eos_model, tok, prompts, attention):
    model = _sharp(eos_model)
    fast, slow = _both(model, tok, prompts)
    _as_close_as_the_forward(model, prompts, fast, slow, attention)
    assert not fast.completion_mask.all()  # some rows stopped early
    for out in (fast, slow):  # a row shorter than the limit ends with the EOS
        ends = out.completion_ids.gather(1, (out.completion_mask.sum(-1, keepdim=True) - 1))
        short = out.completion_mask.sum(-1) < 10
        assert (ends[short] == tok.eos_token_id).all()


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_dropping_finished_rows_changes_no_sample(eos_model, tok, prompts, monkeypatch, penalty, attention):
    """The same tokens and log-probs whether the finished rows are dropped from the decode or kept to the end
    (each row's products do not depend on the other rows; a uniform is drawn for every row at every step)."""
    from grpolab.rollout import hf_decode

    dropped = []
    original = DirectDecoder.drop_finished

    def spy(self, finished):
        keep = original(self, finished)
        dropped.append(None if keep is None else finished.numel() - keep.numel())
        return keep

    def run():
        return HFSampler(eos_model, tok, max_completion_length=10, autocast_dtype=BF16, repetition_penalty=penalty).sample(
            prompts, num_generations=G, generator=torch.Generator().manual_seed(0)
        )

    monkeypatch.setattr(DirectDecoder, "drop_finished", spy)
    dropping = run()
    assert any(dropped), "no row was dropped"
    monkeypatch.setattr(hf_decode, "DROP_FRACTION", 2.0)  # never
    dropped.clear()
    keeping = run()
    assert dropped and not any(dropped)
    assert torch.equal(dropping.completion_ids, keeping.completion_ids)
    assert torch.equal(dropping.completion_mask, keeping.completion_mask)
    torch.testing.assert_close(dropping.logprobs, keeping.logprobs, atol=1e-6, rtol=0)


def test_drop_finished_keeps_the_unfinished_rows_by_hand(tok):
    from grpolab.tasks.tiny import build_tiny_model

    model = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=2).eval()
    attention = torch.ones(16, 3, dtype=torch.long)
    attention[5, 0] = 0
    step = direct_decoder(model, _prompt_cache(model, rows=16), attention, 8, BF16)
    before = [(k.clone(), v.clone()) for k, v in step.cache]
    mask = step.mask.clone()
    finished = torch.zeros(16, dtype=torch.bool)
    finished[3] = True  # 1 of 16 < DROP_FRACTION (1/8): kept until a second row finishes
    assert step.drop_finished(finished) is None and step.cache[0][0].shape[0] == 16
    finished[9] = True
    keep = step.drop_finished(finished)
    assert keep.tolist() == [i for i in range(16) if i not in (3, 9)]
    for (k, v), (k0, v0) in zip(step.cache, before, strict=True):
        assert torch.equal(k, k0[keep]) and torch.equal(v, v0[keep])
    assert torch.equal(step.mask, mask[keep]) and step.mask[4, 0, 0, 0] < 0  # row 5 (now 4) keeps its padding


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
    plain.model.layers[1].self_attn.sliding_window = 4  # a window the layer types do not name
    assert direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16) is None
    plain.model.layers[1].self_attn.sliding_window = None
    assert isinstance(direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16), DirectDecoder)
    plain.config._attn_implementation = "flex_attention"
    assert direct_decoder(plain, _prompt_cache(plain), attention, 8, BF16) is None


def test_direct_step_opens_one_slot_per_token_and_grows_its_cache_by_blocks(tok, monkeypatch):
    from grpolab.rollout import hf_decode
    from grpolab.tasks.tiny import build_tiny_model

    monkeypatch.setattr(hf_decode, "WINDOW_BLOCK", 4)
    monkeypatch.setattr(hf_decode, "fused_decode_attention", lambda device, dtype: False)
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=2).eval()
    attention = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded
    prompt = _prompt_cache(model)
    step = direct_decoder(model, prompt, attention, 6, BF16)
    low = torch.finfo(torch.float32).min  # the batched products' mask: the embeddings' dtype, as transformers'
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


def test_fused_decode_attention_only_in_bf16_on_a_cpu_with_amx(monkeypatch):
    from grpolab.models import inference

    cpu, meta = torch.device("cpu"), torch.device("meta")  # meta stands in for an accelerator
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert inference.fused_decode_attention(cpu, BF16)
    assert not inference.fused_decode_attention(cpu, torch.float32) and not inference.fused_decode_attention(cpu, None)
    assert not inference.fused_decode_attention(meta, BF16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not inference.fused_decode_attention(cpu, BF16)
