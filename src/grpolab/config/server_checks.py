"""rollout.mode=server's settings (docs/server_mode.md), checked when a config loads, and the weight
transport a trainer's server takes, resolved here once for the trainer, its server and grpolab serve."""

from __future__ import annotations

import os
from dataclasses import fields
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from grpolab.errors import ConfigError

if TYPE_CHECKING:
    from grpolab.config.root import Config


def field_default(cls, name: str):
    """The default of dataclass ``cls``'s field ``name`` (a setting left as it was)."""
    return next(f.default for f in fields(cls) if f.name == name)


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def weight_transport(r, *, serving: bool = False) -> str:
    """rollout.weight_transport, auto resolved. shm (files in /dev/shm) for a server on this machine: one the
    run starts (it shares the trainer's GPUs, where NCCL cannot hold both of its ends) or a loopback
    server_url; nccl for a server_url elsewhere, and for ``grpolab serve`` (``serving``) bound beyond
    loopback, whose trainers are elsewhere."""
    if r.weight_transport != "auto":
        return r.weight_transport
    if r.server_url:
        host = urlsplit(r.server_url).hostname
    elif serving:
        host = r.server_host
    else:
        return "shm"
    return "shm" if host in LOOPBACK else "nccl"


def check_trainer_transport(cfg: Config) -> None:
    """A trainer's rollout.mode=server transport that cannot reach its server, one line before any model loads."""
    r = cfg.rollout
    if r.weight_transport == "nccl" and not r.server_url:
        raise ConfigError(
            "rollout.weight_transport=nccl needs a server on GPUs of its own, named by rollout.server_url (start it "
            "with CUDA_VISIBLE_DEVICES=<other GPUs> grpolab serve ...): a server this run starts shares the "
            "trainer's GPU, where NCCL cannot hold both ends of the transfer; or leave weight_transport at auto (shm)"
        )
    remote = bool(r.server_url) and urlsplit(r.server_url).hostname not in LOOPBACK
    if remote and r.weight_transport == "shm":
        raise ConfigError(
            f"rollout.weight_transport=shm writes the weights to files in this machine's /dev/shm, which the "
            f"server at {r.server_url} cannot read: set rollout.weight_transport=nccl (or auto)"
        )
    if remote and cfg.model.lora.enabled:
        raise ConfigError(
            f"model.lora in rollout.mode=server loads each adapter version from a folder in this machine's "
            f"/dev/shm, which the server at {r.server_url} cannot read: run the server on this machine (a "
            "loopback rollout.server_url), or train without LoRA"
        )


def check_server(cfg: Config) -> None:
    """rollout.mode=server's settings, checked before any model loads (docs/server_mode.md)."""
    r = cfg.rollout
    if r.mode == "colocated":
        set_here = [k for k in ("server_url", "max_staleness") if getattr(r, k) != field_default(type(r), k)]
        if set_here:
            raise ConfigError(
                f"rollout.{set_here[0]} needs rollout.mode=server (a vLLM server beside the trainer): set "
                "rollout.mode=server, or leave it out"
            )
        return
    checks = [
        (r.engine != "vllm", "rollout.mode=server runs vLLM's server: set rollout.engine=vllm (its vllm.* settings start it)"),
        (r.max_staleness < 0, "rollout.max_staleness must be >= 0 (0 = synchronous)"),
        (r.sync_timeout_s <= 0, "rollout.sync_timeout_s must be > 0 (seconds per server call)"),
        (r.server_start_timeout_s <= 0, "rollout.server_start_timeout_s must be > 0"),
        (r.sync_bucket_mb <= 0, "rollout.sync_bucket_mb must be > 0 (MB per weight bucket)"),
        (not 0 <= r.server_port < 65536, "rollout.server_port must be in 0..65535 (0 = a free port)"),
        (
            cfg.model.lora.enabled and cfg.model.lora.r > 512,
            "rollout.mode=server loads LoRA adapters of rank <= 512 (vLLM's largest max_lora_rank): lower model.lora.r",
        ),
    ]
    for bad, message in checks:
        if bad:
            raise ConfigError(message)
    url = urlsplit(r.server_url) if r.server_url else None
    if url is not None and (url.scheme not in ("http", "https") or not url.hostname):
        raise ConfigError(f"rollout.server_url={r.server_url!r} is not an http(s) URL: e.g. http://127.0.0.1:8000")
    for key, host in (("server_url", url.hostname if url else None), ("server_host", r.server_host)):
        if host is not None and host not in LOOPBACK and not (r.allow_remote and os.environ.get(r.api_key_env)):
            raise ConfigError(
                f"rollout.{key} names {host}, not loopback: vLLM's RL endpoints let whoever reaches them run "
                f"engine methods, so a remote server needs rollout.allow_remote=true and an API key in "
                f"${r.api_key_env} (rollout.api_key_env)"
            )
