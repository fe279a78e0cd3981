"""Shared fixtures: tiny models and tokenizers built in code and saved to a temporary folder (no network)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved Qwen2-architecture model (hidden 64, 2 layers) with a character tokenizer."""
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny_model"), hidden_size=64, num_layers=2, num_heads=4)
