"""Tiny fp32 models for the sampler tests: hidden 64, 2 layers, built in code."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    torch.set_num_threads(2)
    return build_tiny_model(tok, hidden_size=64, num_layers=2, seed=0).eval()


@pytest.fixture(scope="module")
def eos_model(tok):
    """Emits EOS with probability about 1/4 per step at temperature 1: a bias on the EOS logit.

    The random model's logits are near uniform over V tokens, so p(EOS) ~ e^b / (e^b + V - 1).
    """
    m = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=1).eval()
    vocab = m.config.vocab_size
    bias = torch.zeros(vocab)
    bias[tok.eos_token_id] = math.log((vocab - 1) / 3)
    m.lm_head.bias = torch.nn.Parameter(bias)
    return m


@pytest.fixture(scope="module")
def prompts(tok):
    """Three prompts of different lengths (4, 9, 1 tokens), so the batch is left-padded."""
    return [tok.encode("1+2="), tok.encode("12*34=5+6"), tok.encode("a")]
