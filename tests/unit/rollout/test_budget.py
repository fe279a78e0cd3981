"""The sampler's block size when rollout.max_batch_sequences is unset: from a KV-cache budget."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import Qwen2Config

from grpolab.config import Config, ModelConfig, RolloutConfig, TrainConfig
from grpolab.config.checks import ConfigWarning
from grpolab.errors import ConfigError
from grpolab.rollout.budget import LOGIT_COPIES, kv_bytes_per_sequence, sequences_per_block
from grpolab.rollout.hf import HFSampler
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

# Qwen2.5-7B: 28 layers, 4 KV heads of 128, vocabulary 152,064
QWEN_7B = Qwen2Config(
    hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064
)


def test_kv_bytes_of_a_real_model_by_hand():
    # 2 (K, V) x 28 layers x 4 heads x 128 dims x 2048 tokens x 2 bytes (bf16)
    assert kv_bytes_per_sequence(QWEN_7B, 2048, 2) == 2 * 28 * 4 * 128 * 2048 * 2 == 117_440_512
    per = 117_440_512 + LOGIT_COPIES * 152064 * 4
    cpu = torch.device("cpu")
    assert sequences_per_block(QWEN_7B, tokens=2048, dtype_bytes=2, device=cpu, budget_bytes=10 * per) == 10
    assert sequences_per_block(QWEN_7B, tokens=2048, dtype_bytes=2, device=cpu, budget_bytes=per - 1) == 1
    # without a budget: a share of the free memory, never unbounded
    assert 1 <= sequences_per_block(QWEN_7B, tokens=2048, dtype_bytes=2, device=cpu) < 10**6


def test_sampler_blocks_follow_the_budget_and_keep_greedy_results():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2)
    prompts = [tok("1+2=")["input_ids"], tok("3+4=")["input_ids"]]
    per = kv_bytes_per_sequence(model.config, len(prompts[0]) + 6, 4) + LOGIT_COPIES * model.config.vocab_size * 4
    whole = HFSampler(model, tok, max_completion_length=6, temperature=0.0)
    small = HFSampler(model, tok, max_completion_length=6, temperature=0.0, kv_cache_budget_bytes=3 * per)
    assert small._block(prompts, torch.device("cpu")) == 3
    assert whole._block(prompts, torch.device("cpu")) >= 8  # a tiny model: the whole batch at once
    a = whole.sample(prompts, num_generations=4)
    b = small.sample(prompts, num_generations=4)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_budget_settings_are_checked_and_ignored_combinations_warn():
    with pytest.raises(ConfigError, match="kv_cache_budget_mb"):
        Config(rollout=RolloutConfig(kv_cache_budget_mb=0))
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        Config(train=TrainConfig(max_tokens_per_micro_batch=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Config(rollout=RolloutConfig(max_batch_sequences=8, kv_cache_budget_mb=512))
        Config(model=ModelConfig(dtype="float16", autocast="bf16"))
        Config()
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(messages) == 2
    assert "kv_cache_budget_mb is ignored" in messages[0] and "autocast=bf16" in messages[1]
