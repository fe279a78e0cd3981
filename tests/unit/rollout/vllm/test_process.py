"""The process's vLLM engines (grpolab.rollout.vllm.process): what starting one leaves alone, and the reload's
noise filter. The engines themselves are started, shared and shut down by test_engine.py."""

from __future__ import annotations

import logging
import random

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.rollout.vllm import process  # noqa: E402
from grpolab.rollout.vllm.process import RELOAD_LOGGER, RotaryReloadNoise, import_vllm  # noqa: E402


def test_engine_start_keeps_the_trainers_random_state_and_threads(monkeypatch):
    torch.manual_seed(11)
    random.seed(11)
    want_torch, want_py = torch.random.get_rng_state(), random.getstate()
    threads, original = torch.get_num_threads(), torch.set_num_threads
    with process._trainer_state_kept():  # what vLLM does while it starts
        torch.manual_seed(0)
        random.seed(0)
        torch.set_num_threads = lambda n: None
    assert torch.equal(torch.random.get_rng_state(), want_torch) and random.getstate() == want_py
    assert torch.set_num_threads is original and torch.get_num_threads() == threads


def test_the_reloads_false_alarm_about_rotary_embeddings_is_dropped_and_others_shown():
    import_vllm()
    import_vllm()  # a second call adds no second filter
    reload_log = logging.getLogger(RELOAD_LOGGER)
    assert sum(isinstance(f, RotaryReloadNoise) for f in reload_log.filters) == 1

    def record(layer: str) -> logging.LogRecord:  # as vLLM's reload logs it
        return logging.LogRecord(RELOAD_LOGGER, logging.WARNING, __file__, 0, "%s: Failed to load weights", (layer,), None)

    shown = [layer for layer in ("RotaryEmbedding", "Llama3RotaryEmbedding", "QKVParallelLinear") if reload_log.filter(record(layer))]
    assert shown == ["QKVParallelLinear"]
