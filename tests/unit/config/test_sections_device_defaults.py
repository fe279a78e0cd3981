"""`auto` defaults resolved by device: what a CPU run gets is what it always got (no gradient checkpointing,
64-row micro-batches); on CUDA the memory-bound choices (checkpointing on, 8-row micro-batches)."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError, ModelConfig, TrainConfig, load_config


def test_auto_is_the_old_cpu_value_on_a_cpu_and_the_gpu_one_on_cuda():
    model, train = ModelConfig(name_or_path="m"), TrainConfig()
    assert model.gradient_checkpointing == "auto" and train.micro_batch_size == "auto"
    assert model.checkpointing_on("cpu") is False and model.checkpointing_on("cuda") is True
    assert train.micro_batch_rows("cpu") == 64 and train.micro_batch_rows("cuda") == 8


def test_explicit_values_are_kept_on_every_device():
    for device in ("cpu", "cuda"):
        assert ModelConfig(name_or_path="m", gradient_checkpointing=True).checkpointing_on(device) is True
        assert ModelConfig(name_or_path="m", gradient_checkpointing=False).checkpointing_on(device) is False
        assert TrainConfig(micro_batch_size=5).micro_batch_rows(device) == 5


def test_the_keys_read_auto_or_a_value_and_refuse_nonsense():
    cfg = load_config(None, ["train.micro_batch_size=auto", "model.gradient_checkpointing=true"])
    assert cfg.train.micro_batch_size == "auto" and cfg.model.gradient_checkpointing is True
    assert load_config(None, ["train.micro_batch_size=16"]).train.micro_batch_rows("cuda") == 16
    with pytest.raises(ConfigError, match="train.micro_batch_size must be >= 1"):
        load_config(None, ["train.micro_batch_size=0"])
    with pytest.raises(ConfigError, match="micro_batch_size"):
        load_config(None, ["train.micro_batch_size=big"])


def test_auto_checkpointing_turns_on_past_the_long_sequence_threshold_on_any_device():
    from grpolab.config.sections import CHECKPOINT_ABOVE_TOKENS

    model = ModelConfig(name_or_path="m")
    assert CHECKPOINT_ABOVE_TOKENS == 8192
    assert model.checkpointing_on("cpu", 8192) is False and model.checkpointing_on("cpu", 8193) is True
    assert ModelConfig(name_or_path="m", gradient_checkpointing=False).checkpointing_on("cpu", 32768) is False
    cfg = load_config(None, ["data.max_prompt_length=512", "rollout.max_completion_length=8000"])
    assert cfg.longest_sequence == 8512 and cfg.model.checkpointing_on("cpu", cfg.longest_sequence) is True
