"""Saved activations in host memory (train.offload_activations).

A training forward keeps, for its backward, every tensor the backward needs: with checkpointing one
hidden state per layer, [tokens, H] each, and without it many per layer. At 32K-token completions even the
checkpointed ones add up (Qwen2.5-7B: 28 layers x 32K x 3,584 x 2 bytes = 6.6 GB per sequence).
``torch.autograd.graph.save_on_cpu`` moves each saved tensor to host memory as the forward saves it
(pinned, so the copies are asynchronous) and back as the backward reaches it. verl's ``enable_activation_offload``
does the same. On a CPU the activations are in host memory already: the switch changes nothing there.
"""

from __future__ import annotations

import contextlib

import torch


def offloaded(on: bool, device_type: str) -> contextlib.AbstractContextManager:
    """Around a micro-batch's forward: its saved activations wait for the backward in host memory when
    ``on`` on an accelerator, else where they are."""
    if not on or device_type == "cpu":
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=True)
