"""train.offload_activations: saved activations wait in host memory on an accelerator; on a CPU, where they
already are, nothing changes."""

from __future__ import annotations

import contextlib

import torch

from grpolab.training.activations import offloaded


def test_offload_is_save_on_cpu_on_an_accelerator_only():
    assert isinstance(offloaded(True, "cuda"), torch.autograd.graph.save_on_cpu)
    assert isinstance(offloaded(True, "cpu"), contextlib.nullcontext)
    assert isinstance(offloaded(False, "cuda"), contextlib.nullcontext)
