"""rollout.mode=server's settings (docs/server_mode.md), checked when a config loads, and the weight
transport a trainer's server takes, resolved here once for the trainer, its server and grpolab serve."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import fields
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from grpolab.errors import ConfigError

if TYPE_CHECKING:
    from grpolab.config.root import Config
    from grpolab.config.sections import ModelConfig, RolloutConfig


def field_default(cls, name: str):
    """The default of dataclass ``cls``'s field ``name`` (a setting left as it was)."""
    return next(f.default for f in fields(cls) if f.name == name)


LOOPBACK = ("127.0.0.1", "localhost", "::1")

MAX_TIMEOUT_S = 86400.0
"""The longest rollout.sync_timeout_s / server_start_timeout_s: a day (a longer wait is a hang; past ~1e9 s the
waits of the socket and threading modules overflow)."""


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


def check_trainer_transport(r: RolloutConfig, model: ModelConfig) -> None:
    """A trainer's rollout.mode=server transport that cannot reach its server, one line before any model loads."""
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
    if remote and model.lora.enabled:
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
        (
            not 0 < r.sync_timeout_s <= MAX_TIMEOUT_S,
            f"rollout.sync_timeout_s must be > 0 and at most {MAX_TIMEOUT_S:g} (a day), got {r.sync_timeout_s:g}: "
            "the seconds a whole server call may take",
        ),
        (
            not 0 < r.server_start_timeout_s <= MAX_TIMEOUT_S,
            f"rollout.server_start_timeout_s must be > 0 and at most {MAX_TIMEOUT_S:g} (a day), got {r.server_start_timeout_s:g}",
        ),
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
    _check_addresses(r)


def _check_addresses(r) -> None:
    """rollout.server_host and server_url: well formed, and loopback unless remote access is set up."""
    if not _bindable(r.server_host):
        raise ConfigError(
            f"rollout.server_host={r.server_host!r} is not an address to bind: write an IP address or a host name, "
            "without brackets, scheme or port (e.g. 127.0.0.1, or ::1 for IPv6; the port is rollout.server_port)"
        )
    url = None
    if r.server_url:
        try:
            url = urlsplit(r.server_url)
            url.port  # noqa: B018 - read here: a bad port (or IPv6 bracket) is a ValueError
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"rollout.server_url={r.server_url!r} is not an http(s) URL: e.g. http://127.0.0.1:8000")
    for key, host in (("server_url", url.hostname if url else None), ("server_host", r.server_host)):
        if host is not None and host not in LOOPBACK and not (r.allow_remote and os.environ.get(r.api_key_env)):
            raise ConfigError(
                f"rollout.{key} names {host}, not loopback: vLLM's RL endpoints let whoever reaches them run "
                f"engine methods, so a remote server needs rollout.allow_remote=true and an API key in "
                f"${r.api_key_env} (rollout.api_key_env)"
            )


def _bindable(host: str) -> bool:
    """An IP address, or a host name (no brackets, scheme, port or path)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(host) and not any(c in host for c in "[]/:@ ")
