"""Config section of the vLLM generation engine (``rollout.engine=vllm``; rollout/vllm/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpolab.errors import ConfigError


@dataclass(frozen=True)
class VLLMConfig:
    """One in-process vLLM engine per training process (TRL's colocate mode); read only when
    ``rollout.engine=vllm``. See docs/vllm.md."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of the engine's weights: auto = bfloat16 when the trainer autocasts to bf16, else model.dtype.
    float32 makes the engine's log-probs equal the fp32 trainer's (to ~1e-5)."""
    gpu_memory_utilization: float | None = None
    """CUDA: fraction of the device memory the engine may take (weights, activations, KV cache), in (0, 1].
    null = 0.3 for an engine beside the trainer on its GPU (colocated, or a server the run starts: the trainer
    needs the rest; TRL colocate's), 0.9 for grpolab serve's, on GPUs of its own (vLLM's and TRL vllm-serve's).
    Unused on CPU, where kv_cache_space_gb rules."""
    kv_cache_space_gb: float | None = None
    """KV-cache size in GiB. CPU: null = 1 GiB (vLLM must be told; it cannot measure a CPU's free memory).
    CUDA: null = what gpu_memory_utilization leaves after the weights."""
    max_model_len: int | None = None
    """Longest prompt + completion the engine serves; null = data.max_prompt_length +
    rollout.max_completion_length."""
    max_num_seqs: int | None = None
    """Sequences decoded at once (vLLM's continuous batch); null = vLLM's default (256)."""
    enable_prefix_caching: bool = True
    """Share the prompt's KV cache between the G completions of a group (and across steps)."""
    block_size: int | None = None
    """Tokens per KV-cache block; null = vLLM's default (CPU: 128, CUDA: 16). Prefix caching shares whole
    blocks only, so with 128 a prompt shorter than 128 tokens is computed again by each of its G samples (a
    45-token chat prompt x 64 samples: 25.5 s; with 32: 11.1 s, docs/vllm.md). CPU: a multiple of 32."""
    enforce_eager: bool | None = None
    """No CUDA graphs / torch.compile: null = True on CPU (no compile at start-up), False on CUDA."""
    sleep_mode: bool = False
    """CUDA: offload the engine's weights and free its KV cache while the trainer runs (vLLM sleep mode,
    level 1), so training gets that memory back. vLLM does not support it on CPU: ignored there."""
    timeout_s: float = 1800.0
    """The most one sampling call or weight sync may take; past it the run stops with one line naming this
    key (a hung engine), the checkpoints kept. The engine runs in the trainer's main thread, interrupted
    between Python bytecodes: a call stuck inside C code (a deadlocked collective) is not cut."""

    def __post_init__(self) -> None:
        checks = [
            (
                self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1,
                "vllm.gpu_memory_utilization must be in (0, 1] (TRL: 0.3), or null for the default",
            ),
            (
                self.kv_cache_space_gb is not None and self.kv_cache_space_gb <= 0,
                "vllm.kv_cache_space_gb must be > 0 (GiB), or null for the default",
            ),
            (self.max_model_len is not None and self.max_model_len < 2, "vllm.max_model_len must be >= 2, or null"),
            (self.max_num_seqs is not None and self.max_num_seqs < 1, "vllm.max_num_seqs must be >= 1, or null"),
            (
                self.block_size is not None and (self.block_size < 16 or self.block_size % 16),
                "vllm.block_size must be a multiple of 16 (CPU: of 32, e.g. 32), or null for vLLM's default",
            ),
            (not self.timeout_s > 0, "vllm.timeout_s must be > 0 (seconds per sampling call or weight sync)"),
        ]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)
