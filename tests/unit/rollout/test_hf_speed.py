"""The sampler's fast paths: reserved KV cache, bf16 weight copy, plain attention on a CPU."""

from __future__ import annotations

import torch

from grpolab.rollout.hf import HFSampler

BF16 = torch.bfloat16
G = 3


def _sample(sampler, prompts, seed=0):
    return sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(seed))


def test_weight_copy_samples_what_autocast_samples(model, tok, prompts):
    cast = HFSampler(model, tok, max_completion_length=8, autocast_dtype=BF16)
    plain = HFSampler(model, tok, max_completion_length=8, autocast_dtype=BF16, cast_weights=False)
    assert cast._weights is not None and plain._weights is None
    a, b = _sample(cast, prompts), _sample(plain, prompts)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_weight_copy_is_off_in_fp32_and_follows_weight_updates(tok, prompts):
    from grpolab.tasks.tiny import build_tiny_model

    model = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=5)
    assert HFSampler(model, tok, max_completion_length=4)._weights is None
    sampler = HFSampler(model, tok, max_completion_length=6, autocast_dtype=BF16)
    before = _sample(sampler, prompts).logprobs
    model.load_state_dict(
        build_tiny_model(tok, hidden_size=64, num_layers=2, seed=6).state_dict()
    )  # "an update"
    after = _sample(sampler, prompts).logprobs
    fresh = _sample(HFSampler(model, tok, max_completion_length=6, autocast_dtype=BF16), prompts).logprobs
    assert torch.equal(after, fresh) and not torch.allclose(after, before, atol=1e-3)


def test_reserved_cache_matches_the_plain_cache(model, tok, prompts):
    """Under bf16 on a CPU the decode cache lives in reserved buffers; without them, the same samples."""
    import grpolab.rollout.hf as hf

    calls = []
    original = hf.reserve

    def spy(*args):
        calls.append(1)
        return original(*args)

    def plain(cache, rows, capacity, dtype):
        cache.batch_select_indices(rows)

    hf.reserve = spy
    direct = hf.direct_step
    hf.direct_step = lambda *args: None  # the reserved cache serves models the direct step does not run
    try:
        fast = _sample(HFSampler(model, tok, max_completion_length=10, autocast_dtype=BF16), prompts)
        assert calls, "the reserved cache was not used"
        hf.reserve = plain
        slow = _sample(HFSampler(model, tok, max_completion_length=10, autocast_dtype=BF16), prompts)
    finally:
        hf.reserve, hf.direct_step = original, direct
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    torch.testing.assert_close(fast.logprobs, slow.logprobs, atol=1e-4, rtol=0)

