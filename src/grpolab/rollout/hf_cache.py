"""The sampler's decode cache after the prefill: each prompt's rows repeated for its samples, in one of three forms.

- ``direct_step``: a ``DirectDecoder`` (grpolab.rollout.hf_decode) that holds the cache itself and replaces the
  model's forward, for the Llama, Qwen2 and Qwen3 layers it follows;
- ``reserve``: every layer's keys and values moved into buffers reserved for the whole completion and written in
  place (``ReservedLayer``), where the decode runs transformers' forward with the plain attention on a CPU;
- ``select_rows``: transformers' own cache, rows selected (sliding-window, linear-attention and other layers,
  and every model off the plain attention).

grpolab.rollout.hf chooses among them (measured: the first two pay off with the plain attention only).
"""

from __future__ import annotations

import torch
from transformers import cache_utils
from transformers.cache_utils import DynamicLayer

from grpolab.rollout.hf_decode import DirectDecoder, direct_decoder

# transformers' layer of Mamba / gated-delta states (5.x); () where it has none, so no layer is one
_LINEAR_ATTENTION = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())


class ReservedLayer(DynamicLayer):
    """A cache layer with zeroed buffers reserved for the whole completion, written in place.

    ``DynamicLayer.update`` concatenates, copying the whole cache at every decoded token; returning
    views of a longer buffer instead makes the attention matmuls copy them. So, as transformers'
    ``StaticLayer`` does, the full buffers are returned and the attention mask (padded with zeros to
    ``capacity`` by transformers) hides the slots not yet written. The buffers hold the compute dtype
    (what autocast would cast the keys and values to before the attention anyway).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int, dtype: torch.dtype):
        super().__init__()
        self.device = keys.device
        self.capacity = capacity
        self.filled = 0
        self.keys = keys.new_zeros((*keys.shape[:2], capacity, keys.shape[3]), dtype=dtype)
        self.values = values.new_zeros((*values.shape[:2], capacity, values.shape[3]), dtype=dtype)
        self.is_initialized = True
        self.update(keys, values)

    def update(self, key_states, value_states, *args, **kwargs):
        stop = self.filled + key_states.shape[2]
        self.keys[:, :, self.filled : stop] = key_states
        self.values[:, :, self.filled : stop] = value_states
        self.filled = stop
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_max_length(self) -> int:
        return self.capacity


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep cache rows ``rows`` (a prompt's row repeated for its samples). A linear-attention layer (the Mamba or
    gated-delta states of NemotronH, Qwen3.5) has no batch_select_indices, or inherits one that selects only the
    keys and values beside its states; its reorder_cache selects every state."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        cache.batch_select_indices(rows)
        return
    for layer in layers:
        if isinstance(layer, _LINEAR_ATTENTION) or not hasattr(layer, "batch_select_indices"):
            layer.reorder_cache(rows)
        else:
            layer.batch_select_indices(rows)


def reserve(cache, rows: torch.Tensor, capacity: int, dtype: torch.dtype | None) -> None:
    """Keep cache rows ``rows`` (each prompt's row repeated for its samples), with room for ``capacity``."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        select_rows(cache, rows)  # sliding-window or other layer types: the plain path
        return
    for i, layer in enumerate(layers):
        layers[i] = ReservedLayer(layer.keys[rows], layer.values[rows], capacity, dtype or layer.keys.dtype)


def direct_step(model, cache, rows: torch.Tensor, prompt_attention, capacity: int, dtype) -> DirectDecoder | None:
    """A ``DirectDecoder`` from the prefill's cache (rows ``rows`` of it), where every layer is a plain one and the
    model is one it runs; it then holds the decode's cache itself."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return None
    prompt_cache = [(layer.keys[rows], layer.values[rows]) for layer in layers]
    return direct_decoder(model, prompt_cache, prompt_attention, capacity, dtype or layers[0].keys.dtype)
