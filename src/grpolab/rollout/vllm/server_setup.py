"""From a run's ``EngineSpec`` (rollout/base.py) to a vLLM server and its client sampler (rollout.mode=server;
docs/server_mode.md).

``server_args`` turns the run's engine settings (rollout/vllm/setup.py ``engine_kwargs``, the colocated
engine's own) into the server's command line, so both modes run the same engine; ``start_server``
starts one (``grpolab train`` with no rollout.server_url, and ``grpolab serve``); ``build_server_sampler``
is the vLLM record's server builder (rollout/vllm/record.py), what rollout/engines.py builds in server mode.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading

import torch

from grpolab.config import ConfigError
from grpolab.config.server_checks import weight_transport
from grpolab.distributed import dist
from grpolab.models.loading import resolve_autocast, resolve_device
from grpolab.rollout.vllm import batch, shm
from grpolab.rollout.vllm.client import ServerSampler
from grpolab.rollout.vllm.server import RolloutServerError, VLLMServer
from grpolab.rollout.vllm.server_client import ServerClient
from grpolab.rollout.vllm.setup import VLLMSpec, check_vllm, engine_kwargs, model_config, sampler_kwargs
from grpolab.rollout.vllm.weights import MODEL_NAME


def server_args(
    spec: VLLMSpec,
    *,
    device_type: str,
    autocast_dtype: torch.dtype | None,
    context: int | None = None,
    serving: bool = False,
):
    """(vLLM server arguments, environment) for the run's engine settings (``serving``: for grpolab serve)."""
    kw = engine_kwargs(spec, device_type=device_type, autocast_dtype=autocast_dtype, context=context, serving=serving)
    args = [
        "--model", kw["model"], "--tokenizer", kw["tokenizer"], "--served-model-name", MODEL_NAME,
        "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]),
        "--gpu-memory-utilization", str(kw["gpu_memory_utilization"]),
        "--logprobs-mode", kw["logprobs_mode"], "--seed", str(kw["seed"]),
        "--enable-prefix-caching" if kw["enable_prefix_caching"] else "--no-enable-prefix-caching",
        "--worker-extension-cls", batch.EXTENSION,
        "--weight-transfer-config", json.dumps({"backend": shm.BACKEND if weight_transport(spec.rollout, serving=serving) == "shm" else "nccl"}),
    ]  # fmt: skip
    if kw.get("revision"):
        args += ["--revision", kw["revision"]]
    if kw["trust_remote_code"]:
        args.append("--trust-remote-code")
    if kw["enforce_eager"]:
        args.append("--enforce-eager")
    if "max_num_seqs" in kw:
        args += ["--max-num-seqs", str(kw["max_num_seqs"])]
    env = {}
    if spec.model.lora.enabled:  # the adapter goes to the server per version (rollout/vllm/client.py)
        rank = next(r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= spec.model.lora.r)  # vLLM's allowed ranks
        args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if "kv_cache_memory_bytes" in kw:
        args += ["--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"])]
        if device_type == "cpu":  # the CPU backend sizes its cache from this variable (whole GiB)
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kw["kv_cache_memory_bytes"] / 2**30)))
    env.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))
    return args, env


def api_key(spec: VLLMSpec) -> str | None:
    return os.environ.get(spec.rollout.api_key_env) or None


def start_server(
    spec: VLLMSpec,
    *,
    device_type: str,
    autocast_dtype: torch.dtype | None,
    context: int | None = None,
    serving: bool = False,
):
    """A healthy server for the run (bound to rollout.server_host:server_port), or one RolloutServerError line;
    ``serving``: the server of grpolab serve, for trainers that may be elsewhere."""
    check_vllm(spec, device_type=device_type)
    if context is None:  # grpolab serve: the model's context caps the default max_model_len, as in a run
        context = getattr(model_config(spec.model), "max_position_embeddings", None)
    args, env = server_args(spec, device_type=device_type, autocast_dtype=autocast_dtype, context=context, serving=serving)
    r = spec.rollout
    server = VLLMServer.start(
        args, host=r.server_host, port=r.server_port, api_key=api_key(spec), allow_remote=r.allow_remote, env=env
    )
    server.wait_healthy(r.server_start_timeout_s)
    return server


def build_server_sampler(
    spec: VLLMSpec,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> ServerSampler:
    """rollout.mode=server: the client of rollout.server_url, or of a server started here (stopped by ``close``).
    The server takes ``wrapped`` (or ``policy``)'s weights, as version 0, before the first sample. Under
    torchrun the ranks share one server: rank 0 starts it (or every rank uses rollout.server_url) and
    sends the weights, gathered once; each rank samples its own groups."""
    device = next(policy.parameters()).device
    context = getattr(policy.config, "max_position_embeddings", None)
    r = spec.rollout
    server, url = None, r.server_url
    if not url:  # under torchrun rank 0 starts the one server every rank samples from
        if dist.is_main():
            server = start_server(spec, device_type=device.type, autocast_dtype=autocast_dtype, context=context)
        url = dist.broadcast_object(server.url if server is not None else None)
    client = ServerClient(url, timeout_s=r.sync_timeout_s, api_key=api_key(spec), server=server)
    dtype = engine_kwargs(spec, device_type=device.type, autocast_dtype=autocast_dtype, context=context)["dtype"]
    return ServerSampler(
        client,
        tokenizer,
        **sampler_kwargs(spec, policy, tokenizer, wrapped, temperature),
        transport=weight_transport(r),
        bucket_bytes=int(r.sync_bucket_mb * 2**20),
        dtype=getattr(torch, dtype),
        lora=spec.model.lora.enabled,
        vocab_size=getattr(policy.config, "vocab_size", None),  # the embedding's rows: ids the trainer can index
    )


def serve(spec: VLLMSpec, *, announce=lambda line: print(line, flush=True)) -> int:
    """``grpolab serve``: the run's server on rollout.server_host:server_port until SIGINT / SIGTERM / SIGHUP, then stopped
    with everything it started. A trainer reaches it with rollout.mode=server rollout.server_url=<the URL>."""
    if spec.rollout.mode != "server":
        raise ConfigError("grpolab serve starts the server of rollout.mode=server: set rollout.mode=server (and rollout.engine=vllm)")
    device = resolve_device(spec.model)
    server = start_server(spec, device_type=device.type, autocast_dtype=resolve_autocast(spec.model, device), serving=True)
    done = threading.Event()
    previous = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        announce(f"grpolab: vLLM server ready at {server.url} (log: {server.log_path}); train with "
                 f"rollout.mode=server rollout.server_url={server.url}; Ctrl-C stops it")  # fmt: skip
        while not done.wait(1.0):
            if not server.alive():
                raise RolloutServerError(f"the vLLM server exited with status {server.proc.returncode}: {server.log_tail()}")
        return 0
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
