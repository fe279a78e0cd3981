"""Asking an OpenAI-compatible chat endpoint many questions at once, each bounded as a whole.

``ask_all`` sends every request concurrently (at most ``concurrency`` in flight) over one httpx connection pool
and awaits each under ``asyncio.wait_for``: a request's deadline covers connecting, waiting and reading the whole
answer, whatever the server trickles (httpx's own timeouts bound each socket operation, not a call). A request
that timed out, could not connect, or got 429 or a 5xx is sent again up to ``max_retries`` times; a 4xx (a
prompt over the judge's context, a wrong model name) is not, since it would fail the same way.

Not rollout/vllm/server_client.py's transport, which does the same with a sync pool and a wrapped network backend:
rewards sit below rollout in the layers, and asyncio gives the whole-call deadline here without the wrapper.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from grpolab.rewards.judge.parse import shown

BACKOFF_S = 0.5
"""The pause before the first retry; doubled before each next one."""
MAX_ANSWER_BYTES = 4 * 2**20
"""A chat answer of max_tokens tokens is a few KB; more is not a judge's answer."""


@dataclass(frozen=True)
class Reply:
    """What the judge answered to one request."""

    text: str
    top_logprobs: list[dict[str, Any]] | None
    """The first generated token's candidates ``[{token, logprob}]``, when log-probs were asked for."""
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    """A request that failed after its retries; ``kind``: timeout, unreachable, status, answer."""

    kind: str
    message: str
    retries: int = 0


@dataclass(frozen=True)
class Endpoint:
    """Where and how requests go."""

    url: str
    """The base URL, ending in /v1 (requests go to <url>/chat/completions)."""
    model: str
    api_key: str | None
    timeout_s: float
    max_retries: int
    concurrency: int


class _Retryable(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _reply(data: Any, url: str) -> Reply:
    """The parts of a chat completion the judge reads; a body of another shape is a ``Failed`` answer."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
        usage = data.get("usage") or {}
        content = (choice.get("logprobs") or {}).get("content") or []
        top = content[0].get("top_logprobs") if content else None
        return Reply(str(text), top, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise _Retryable("answer", f"the judge at {url} answered with JSON that is no chat completion: {shown(json.dumps(data))}") from None


async def _post(client: httpx.AsyncClient, ep: Endpoint, body: Mapping[str, Any]) -> Reply:
    url = ep.url + "/chat/completions"
    try:
        async with client.stream("POST", url, json=body) as r:
            raw = bytearray()
            async for chunk in r.aiter_bytes():
                raw += chunk
                if len(raw) > MAX_ANSWER_BYTES:
                    raise _Retryable("answer", f"the judge at {ep.url} sent more than {MAX_ANSWER_BYTES} bytes")
    except httpx.ConnectError as err:
        raise _Retryable("unreachable", f"the judge at {ep.url} cannot be reached ({err})") from None
    except (httpx.TransportError, httpx.DecodingError) as err:  # cut off, reset, not HTTP
        raise _Retryable("status", f"the judge at {ep.url} broke off its answer ({type(err).__name__}: {err})") from None
    if r.status_code == 429 or r.status_code >= 500:
        raise _Retryable("status", f"the judge at {ep.url} answered {r.status_code}: {shown(raw.decode(errors='replace'), 300)}")
    if r.status_code >= 400:
        raise _Retryable("rejected", f"the judge at {ep.url} refused the request with {r.status_code}: "
                                     f"{shown(raw.decode(errors='replace'), 300)}")  # fmt: skip
    try:
        data = json.loads(raw)
    except ValueError:
        raise _Retryable("answer", f"the judge at {ep.url} answered with something that is not JSON: {shown(raw.decode(errors='replace'))}") from None
    return _reply(data, ep.url)


async def _ask(client: httpx.AsyncClient, ep: Endpoint, body: Mapping[str, Any], gate: asyncio.Semaphore) -> Reply | Failed:
    last = Failed("unreachable", f"the judge at {ep.url} was not asked")
    for attempt in range(ep.max_retries + 1):
        if attempt:
            await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
        async with gate:
            try:
                return await asyncio.wait_for(_post(client, ep, body), ep.timeout_s)
            except TimeoutError:
                last = Failed("timeout", f"the judge at {ep.url} did not answer within {ep.timeout_s:g} s (timeout_s)", attempt)
            except _Retryable as err:
                last = Failed(err.kind, str(err), attempt)
                if err.kind in ("rejected", "answer"):  # the same request would fail the same way
                    return last
    return last


async def _ask_all(ep: Endpoint, bodies: Sequence[Mapping[str, Any]]) -> list[Reply | Failed]:
    headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
    limits = httpx.Limits(max_connections=ep.concurrency, max_keepalive_connections=ep.concurrency)
    gate = asyncio.Semaphore(ep.concurrency)
    async with httpx.AsyncClient(headers=headers, timeout=ep.timeout_s, limits=limits, trust_env=False) as client:
        return await asyncio.gather(*(_ask(client, ep, body, gate) for body in bodies))


def ask_all(ep: Endpoint, bodies: Sequence[Mapping[str, Any]]) -> list[Reply | Failed]:
    """Every request's reply or failure, in order (module docstring); runs its own event loop."""
    if not bodies:
        return []
    return asyncio.run(_ask_all(ep, bodies))


def time_budget_s(ep: Endpoint, requests: int) -> float:
    """The longest ``ask_all`` of ``requests`` can take: rounds of ``concurrency`` requests, each round
    every try's deadline and pause; a slack of 5 s for the event loop."""
    rounds = -(-requests // ep.concurrency)
    pauses = sum(BACKOFF_S * 2**i for i in range(ep.max_retries))
    return rounds * (ep.timeout_s * (ep.max_retries + 1) + pauses) + 5.0
