"""Shared fixtures: tiny models and tokenizers built in code and saved to a temporary folder (no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# OMP_NUM_THREADS=1 runs the suite single-threaded (reduction orders change with the thread count).
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved Qwen2-architecture model (hidden 64, 2 layers) with a character tokenizer."""
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny_model"), hidden_size=64, num_layers=2, num_heads=4)


@pytest.fixture(scope="session")
def addition_jsonl(tmp_path_factory):
    """Factory: ``addition_jsonl(size)`` is a JSONL file of ``size`` one-digit addition problems
    (rows with "prompt" and "answer", seed 0), written once per size."""
    from grpolab.tasks.arithmetic import arithmetic_examples

    made: dict[int, Path] = {}

    def make(size: int) -> Path:
        if size not in made:
            path = tmp_path_factory.mktemp("data") / f"add{size}.jsonl"
            rows = [
                {"prompt": e.prompt, "answer": e.answer}
                for e in arithmetic_examples(size=size, seed=0, digits=1)
            ]
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            made[size] = path
        return made[size]

    return make
