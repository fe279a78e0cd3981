"""The HTTP side of server mode: one vLLM server's calls, each bounded as a whole by a deadline, and the
pieces of a weight sync that do not depend on the sampler (buckets, a LoRA adapter's tensors, vLLM's NCCL
control protocol over HTTP). rollout/vllm/client.py is the sampler built on them.

The server is input the trainer does not trust: whatever it sends (a page of another kind of server,
bytes of another protocol, an answer cut short, a stream dropped mid-line, JSON of another shape, a
trickle of one byte a second) ends as one ``RolloutServerError`` line naming the server and the route.
HTTP is httpcore's (httpx's transport: connections kept and reused, chunked streams, h11's parsing).
Its timeouts, like httpx's, bound each socket operation, not a call (encode/httpx#1450), so its network
backend is wrapped here: every connect, read and write of a call gets at most the time left before the
call's deadline (``rollout.sync_timeout_s`` after it started), and a call past its deadline fails at once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import torch

from grpolab.distributed import parallel
from grpolab.rollout.vllm.server import RolloutServerError, VLLMServer

KEEPALIVE_S = 2.0
"""How long an idle connection is kept for the next call: less than the 5 s after which vLLM's server
(uvicorn, VLLM_HTTP_TIMEOUT_KEEP_ALIVE) closes it, so no call goes out on a connection being closed."""
MAX_ANSWER_BYTES = 64 * 2**20
"""The largest JSON answer read (a server's answers are a few KB; the batch route's lines: MAX_LINE_BYTES)."""
MAX_LINE_BYTES = 512 * 2**20
"""The largest line of the batch route read (a prompt's G samples: ~30 bytes a token)."""

_call = threading.local()
"""``deadline``: the ``time.monotonic()`` by which the call this thread is making must be done (httpcore's
sync pool does a call's I/O on the calling thread)."""


@contextlib.contextmanager
def _until(deadline: float) -> Iterator[None]:
    previous = getattr(_call, "deadline", None)
    _call.deadline = deadline
    try:
        yield
    finally:
        _call.deadline = previous


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """``timeout`` cut to the time left before this thread's call deadline; ``expired`` once it has passed."""
    deadline = getattr(_call, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation ends by the deadline of the call using it."""

    def __init__(self, inner: httpcore.NetworkStream):
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self.inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, each connection a ``_DeadlineStream``."""

    def __init__(self):
        self.inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self.inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self.inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


TRANSPORT_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                    httpcore.UnsupportedProtocol, OSError)  # fmt: skip
"""What a call to a server can fail with below HTTP (``_errors`` says which is which)."""


class ServerGone(RolloutServerError):
    """The server cannot be reached, or the one this run started has exited: no sample of any prompt can come
    back, so the run stops at once instead of dropping groups step after step (docs/training.md)."""


class ServerStatusError(RolloutServerError):
    """The server answered with an HTTP error status (``status``)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status

RESUME = "the last checkpoint is kept; restart the server and resume the run (grpolab train --resume)"


def shown(value: Any, limit: int = 80) -> str:
    """A short one-line view of what a server sent (for error messages)."""
    if isinstance(value, bytes | bytearray):
        text = value.decode(errors="replace")
    else:
        text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def bad_answer(url: str, path: str, what: str) -> RolloutServerError:
    """The one line for an answer grpolab cannot use."""
    return RolloutServerError(
        f"the vLLM server at {url} answered {path} with {what}: grpolab cannot use it (is rollout.server_url a "
        "vLLM server of this run's model? grpolab serve starts one)"
    )


class ServerClient:
    """HTTP to one vLLM server (module docstring); every call is done within ``timeout_s`` or is one line."""

    def __init__(self, url: str, *, timeout_s: float, api_key: str | None = None, server: VLLMServer | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.server = server
        """The server process when this run started it (its death is then named in errors)."""
        self._pool = httpcore.ConnectionPool(
            network_backend=_DeadlineBackend(), max_connections=None, keepalive_expiry=KEEPALIVE_S
        )  # thread-safe: the per-request sampler calls from a pool of threads

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The answer's JSON, or its text (the LoRA routes answer in plain text)."""
        with self._errors(path), _until(time.monotonic() + self.timeout_s), self._send(method, path, body) as r:
            self._check_status(path, r)
            raw = bytearray()
            for chunk in r.iter_stream():
                raw += chunk
                if len(raw) > MAX_ANSWER_BYTES:
                    raise bad_answer(self.url, path, f"more than {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw) if raw else None
        except (ValueError, RecursionError):  # not JSON (or nested past Python's stack)
            return raw.decode(errors="replace")

    def call_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The answer, which must be a JSON object."""
        answer = self.call(method, path, body)
        if not isinstance(answer, dict):
            raise bad_answer(self.url, path, f"{shown(answer)}, not a JSON object")
        return answer

    def field(self, path: str, answer: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        """``answer[key]``, which must be of ``kind`` (a bool is no int here)."""
        if key not in answer:
            raise bad_answer(self.url, path, f"no {key!r} in {shown(answer)}")
        value = answer[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise bad_answer(self.url, path, f"{key!r} = {shown(value)}, not {names}")
        return value

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST ``body`` and yield each line of the newline-delimited JSON answer, each a JSON object, as it
        comes. Each line must be whole within ``timeout_s`` of the one before (of the call's start for the
        first), however its bytes trickle in; an ``{"error": ...}`` line is a RolloutServerError."""
        deadline = time.monotonic() + self.timeout_s
        with self._errors(path), contextlib.ExitStack() as held:
            with _until(deadline):
                r = held.enter_context(self._send("POST", path, body))
                self._check_status(path, r)
            chunks, buf, scanned = r.iter_stream(), bytearray(), 0
            while True:
                end = buf.find(b"\n", scanned)
                if end < 0:  # no whole line yet: read on
                    if len(buf) > MAX_LINE_BYTES:
                        raise bad_answer(self.url, path, f"a line of more than {MAX_LINE_BYTES} bytes")
                    scanned = len(buf)
                    with _until(deadline):
                        chunk = next(chunks, None)
                    if chunk is None:
                        break
                    buf += chunk
                    continue
                raw, buf, scanned = bytes(buf[:end]), buf[end + 1 :], 0
                if raw.strip():
                    yield self._line(path, raw)
                    deadline = time.monotonic() + self.timeout_s
            if buf.strip():  # the last line, without its newline
                yield self._line(path, bytes(buf))

    def _line(self, path: str, raw: bytes) -> dict[str, Any]:
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            raise bad_answer(self.url, path, f"a line that is not JSON ({shown(raw)})") from None
        if not isinstance(line, dict):
            raise bad_answer(self.url, path, f"a line that is not a JSON object ({shown(raw)})")
        if "error" in line:
            raise RolloutServerError(f"the vLLM server at {self.url} failed at {path}: {shown(line['error'], 600)}")
        return line

    def _send(self, method: str, path: str, body: dict[str, Any] | None):
        """httpcore's streamed call (a context manager: the response, its body not yet read)."""
        headers = [(b"Content-Type", b"application/json")]
        if self.api_key:
            headers.append((b"Authorization", f"Bearer {self.api_key}".encode()))
        content = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
        t = self.timeout_s  # each operation's own bound; the call's deadline cuts it (_DeadlineStream)
        timeouts = {"connect": t, "read": t, "write": t, "pool": t}
        return self._pool.stream(method, self.url + path, headers=headers, content=content, extensions={"timeout": timeouts})

    def _check_status(self, path: str, r) -> None:
        """An HTTP error status as one line, with the start of what the server said."""
        if 200 <= r.status < 300:
            return
        said = bytearray()
        for chunk in r.iter_stream():
            said += chunk
            if len(said) > 2048:
                break
        log = f" (its log ends: {self.server.log_tail()})" if self.server is not None and r.status >= 500 else ""
        raise ServerStatusError(
            f"the vLLM server at {self.url} answered {path} with {r.status}: {shown(bytes(said), 300)}{log}", r.status
        )

    @contextlib.contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """A failure below HTTP of a call to ``path`` as one RolloutServerError line."""
        try:
            yield
        except httpcore.TimeoutException as err:
            raise (ServerGone if self._dead() else RolloutServerError)(
                f"the vLLM server at {self.url} did not answer {path} within {self.timeout_s:g} s "
                f"(rollout.sync_timeout_s){self._dead()}"
            ) from err
        except httpcore.ConnectError as err:
            raise ServerGone(
                f"the vLLM server at {self.url} cannot be reached ({shown(str(err), 200)}) at {path}"
                f"{self._dead()}: {RESUME}"
            ) from err
        except TRANSPORT_ERRORS as err:  # cut short, dropped mid-answer, or not HTTP at all
            raise (ServerGone if self._dead() else RolloutServerError)(
                f"the vLLM server at {self.url} broke off its answer to {path} or did not answer in HTTP "
                f"({type(err).__name__}: {shown(str(err), 200)}){self._dead()}: {RESUME}"
            ) from err

    def _dead(self) -> str:
        if self.server is not None and not self.server.alive():
            return f"; the server grpolab started exited with status {self.server.proc.returncode}"
        return ""

    def version(self) -> str | None:
        """The weight version the server reports."""
        answer = self.call_json("GET", "/weight_info")
        return self.field("/weight_info", answer, "weight_version", (str, int, type(None)))

    def close(self) -> None:
        """Close the kept connections."""
        self._pool.close()


def adapter_state(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The active LoRA adapter's tensors under PEFT's saved names (what ``save_pretrained`` writes), each
    whole (an FSDP2 shard is gathered: every rank calls this) on the host, cast to ``dtype`` one at a time
    (the server's: vLLM casts an adapter to its model dtype as it loads it; None: the trainer's)."""
    from peft import get_peft_model_state_dict

    peft_model = parallel.unwrap(model)
    state = get_peft_model_state_dict(peft_model, adapter_name=peft_model.active_adapter)
    return {k: _full(v.detach()).to("cpu", dtype).contiguous() for k, v in state.items()}


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
    given up front, without gathering (rollout/vllm/sync.weight_metadata), and the tensors taken from the
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
