"""The HTTP side of server mode: one vLLM server's JSON calls, each bounded by a timeout, and the pieces of a
weight sync that do not depend on the sampler (buckets, a LoRA adapter's tensors, vLLM's NCCL control
protocol over HTTP). rollout/vllm_client.py is the sampler built on them."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import torch

from grpolab.distributed import parallel
from grpolab.rollout.vllm_server import RolloutServerError, VLLMServer
from grpolab.types import Failure


class ServerClient:
    """JSON over HTTP to one vLLM server, every call bounded by ``timeout_s``."""

    def __init__(self, url: str, *, timeout_s: float, api_key: str | None = None, server: VLLMServer | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.server = server
        """The server process when this run started it (its death is then named in errors)."""

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        timeout = timeout_s or self.timeout_s
        with self._errors(path, timeout), urllib.request.urlopen(self._request(method, path, body), timeout=timeout) as r:
            text = r.read()
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:  # a few endpoints (LoRA loading) answer in plain text
            return text.decode(errors="replace")

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST ``body`` and yield each line of the newline-delimited JSON answer as it comes; every wait for
        the next line is bounded by the timeout, and an ``{"error": ...}`` line is a RolloutServerError."""
        with self._errors(path, self.timeout_s), urllib.request.urlopen(self._request("POST", path, body), timeout=self.timeout_s) as r:
            for raw in r:
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    raise RolloutServerError(f"the vLLM server at {self.url} sent a line that is not JSON at {path}") from None
                if "error" in line:
                    raise RolloutServerError(f"the vLLM server at {self.url} failed at {path}: {line['error']}")
                yield line

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> urllib.request.Request:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    @contextlib.contextmanager
    def _errors(self, path: str, timeout: float) -> Iterator[None]:
        """Any failure of an HTTP call to ``path`` as one RolloutServerError line."""
        try:
            yield
        except urllib.error.HTTPError as err:
            said = " ".join(err.read().decode(errors="replace").split())[:300]
            raise RolloutServerError(f"the vLLM server at {self.url} answered {path} with {err.code}: {said}") from err
        except TimeoutError as err:
            raise RolloutServerError(
                f"the vLLM server at {self.url} did not answer {path} within {timeout:g} s (rollout.sync_timeout_s)"
                f"{self._dead()}"
            ) from err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, TimeoutError):
                raise RolloutServerError(
                    f"the vLLM server at {self.url} did not answer {path} within {timeout:g} s "
                    f"(rollout.sync_timeout_s){self._dead()}"
                ) from err
            raise RolloutServerError(
                f"the vLLM server at {self.url} cannot be reached ({reason}) at {path}{self._dead()}: "
                "the last checkpoint is kept; restart the server and resume the run (grpolab train --resume)"
            ) from err

    def _dead(self) -> str:
        if self.server is not None and not self.server.alive():
            return f"; the server grpolab started exited with status {self.server.proc.returncode}"
        return ""

    def version(self) -> str | None:
        return self.call("GET", "/weight_info")["weight_version"]


def read_batch_line(line: dict, url: str, prompts: int, per_prompt: int) -> tuple[int, list[dict | Failure]]:
    """(prompt index, its samples) of one line of grpolab's batch route (rollout/vllm_batch.py), checked before
    any of it is used: a line that cannot be read, or names another batch, is a RolloutServerError."""
    try:
        p, samples = int(line["prompt"]), line["samples"]
        got = [{"token_ids": c["token_ids"], "logprobs": {"token_logprobs": c["logprobs"]}} for c in samples]
    except (KeyError, TypeError, ValueError) as err:
        raise RolloutServerError(f"the vLLM server at {url} sent a line grpolab cannot read: {err!r}") from None
    if not 0 <= p < prompts or len(got) != per_prompt:
        raise RolloutServerError(f"the vLLM server at {url} returned another batch than asked")
    return p, [checked_choice(c, url) for c in got]


def checked_choice(choice: dict, url: str) -> dict | Failure:
    """A sample as the server returned it (OpenAI's ``choices[i]`` layout), or an engine_error when its log-probs
    do not match its tokens one for one."""
    toks, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    if len(lps) != len(toks):
        return Failure("engine_error", f"the vLLM server at {url} returned {len(lps)} log-probs for {len(toks)} tokens")
    return choice


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The active LoRA adapter's tensors under PEFT's saved names (what ``save_pretrained`` writes), each
    whole (an FSDP2 shard is gathered: every rank calls this) on the host."""
    from peft import get_peft_model_state_dict

    peft_model = parallel.unwrap(model)
    state = get_peft_model_state_dict(peft_model, adapter_name=peft_model.active_adapter)
    return {k: _full(v.detach()).to("cpu").contiguous() for k, v in state.items()}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def consume(weights) -> int:
    """A rank other than 0: take part in the gathers (FSDP2 collectives, in the sender's order), send nothing;
    returns the bytes rank 0 sent (the same tensors)."""
    return sum(t.numel() * t.element_size() for _, t in weights)


def buckets(weights, limit_bytes: int):
    """Groups of ``(name, tensor)`` of at most ``limit_bytes`` each (a larger tensor is a bucket of its own),
    taken from the iterator one tensor at a time (so an FSDP2 gather holds one bucket, not the model)."""
    bucket, size = [], 0
    for name, t in weights:
        n = t.numel() * t.element_size()
        if bucket and size + n > limit_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


class NcclControl:
    """vLLM's ``VLLMWeightSyncClient`` protocol over our HTTP client (its NCCL engine drives it)."""

    def __init__(self, client: ServerClient):
        self.client = client

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.client.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.client.call("POST", "/start_weight_update")

    def update_weights(self, update_info) -> None:
        self.client.call("POST", "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.client.call("POST", "/finish_weight_update", {"weight_version": weight_version})


class StreamSource:
    """A one-pass ``WeightSource`` for vLLM's NCCL trainer engine: ``metadata`` (name, dtype, whole shape)
    given up front, without gathering (rollout/vllm_sync.weight_metadata), and the tensors taken from the
    iterator one at a time, so that no more than one gathered parameter is held (vLLM asks for a fresh
    source each round: one is made per sync). ``sent``: the bytes iterated so far."""

    def __init__(self, weights, metadata):
        self.weights, self.params, self.sent = weights, metadata, 0

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, dtype, shape) for name, dtype, shape in self.params]

    def __iter__(self):
        for name, t in self.weights:
            self.sent += t.numel() * t.element_size()
            yield name, t


def address_towards(host: str) -> str:
    """This machine's address on its route to ``host``. vLLM's NCCL rendezvous is the trainer's (rank 0 binds
    it) and the server's workers connect to it: the server's own address would not bind here."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host.strip("[]"), 9))  # no packet is sent: this only picks the outgoing interface
            return s.getsockname()[0]
    except OSError as err:
        raise RolloutServerError(
            f"could not find this machine's address towards the vLLM server at {host} for the NCCL weight "
            f"transfer ({err}): set GRPOLAB_NCCL_ADDRESS to an address of this machine the server can reach"
        ) from None
