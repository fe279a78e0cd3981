"""How many sequences the sampler decodes at once when rollout.max_batch_sequences is not set.

Decoding N sequences holds, per sequence, the KV cache of every layer for the whole prompt plus
completion, and the [V] logits of the step with the sampling filters' copies of them:

    kv_bytes   = 2 (keys, values) x layers x kv_heads x head_dim x (prompt + max_completion) x dtype bytes
    step_bytes = LOGIT_COPIES x V x 4

(Qwen2.5-7B, 1,024 + 1,024 tokens in bf16: 2 x 28 x 4 x 128 x 2048 x 2 = 117 MB per sequence; 512
sequences would need 60 GB.) The block is the budget divided by their sum: ``rollout.kv_cache_budget_mb``
when set, else KV_CACHE_FRACTION of the memory free when sampling starts (CUDA: free device memory plus
what torch's allocator holds unused; CPU: MemAvailable). Never unbounded for a real model.
"""

from __future__ import annotations

from pathlib import Path

import torch

KV_CACHE_FRACTION = 0.25
"""Share of the free memory the sampler's KV cache and step logits may take when no budget is set."""
LOGIT_COPIES = 4
"""fp32 [V] tensors per sequence in one decode step: logits, scaled, sorted (top-p), probabilities."""


def kv_bytes_per_sequence(config, tokens: int, dtype_bytes: int) -> int:
    """KV-cache bytes of one sequence of ``tokens`` tokens for a transformers model config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * tokens * dtype_bytes


def free_memory_bytes(device: torch.device) -> int:
    """Memory free for new tensors on ``device`` now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # no /proc (macOS, Windows): assume 8 GiB


def sequences_per_block(
    config, *, tokens: int, dtype_bytes: int, device: torch.device, budget_bytes: int | None = None
) -> int:
    """Sequences decoded at once: the budget (or KV_CACHE_FRACTION of free memory) over the per-sequence need."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    per_sequence = kv_bytes_per_sequence(config, tokens, dtype_bytes) + LOGIT_COPIES * text.vocab_size * 4
    budget = budget_bytes if budget_bytes is not None else int(KV_CACHE_FRACTION * free_memory_bytes(device))
    return max(1, budget // per_sequence)
