"""The sampler's reserved decode cache (grpolab.rollout.hf_cache); its samples against the plain cache's are in
test_hf_speed.py, the direct step's in test_hf_decode.py."""

from __future__ import annotations

import torch

from grpolab.rollout.hf_cache import ReservedLayer, reserve

BF16 = torch.bfloat16


def test_reserved_layer_writes_in_place():
    keys, values = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
    layer = ReservedLayer(keys, values, capacity=6, dtype=BF16)
    buffer = layer.keys.data_ptr()
    k, v = layer.update(torch.ones(2, 4, 1, 8), torch.ones(2, 4, 1, 8))
    assert k.shape == (2, 4, 6, 8) and k.dtype == BF16 and k.data_ptr() == buffer
    assert layer.get_seq_length() == 4 and layer.get_mask_sizes(1) == (6, 0)
    assert torch.equal(k[:, :, :3], keys.to(BF16)) and (k[:, :, 3] == 1).all() and (k[:, :, 4:] == 0).all()


def test_reserve_repeats_each_prompts_row_into_reserved_buffers():
    from transformers import DynamicCache

    cache = DynamicCache()
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)  # 2 prompts, 3 tokens
    cache.update(keys, -keys, 0)
    reserve(cache, torch.tensor([1, 1, 0]), capacity=5, dtype=None)  # prompt 1's two samples, then prompt 0's
    (layer,) = cache.layers
    assert isinstance(layer, ReservedLayer) and layer.keys.shape == (3, 1, 5, 2) and layer.get_seq_length() == 3
    assert torch.equal(layer.keys[:, :, :3], keys[[1, 1, 0]]) and torch.equal(layer.values[:, :, :3], -keys[[1, 1, 0]])
    assert (layer.keys[:, :, 3:] == 0).all()
