"""A step's batch as one server call, seeded like the colocated engine (rollout.mode=server; docs/server_mode.md).

A server grpolab starts carries two vLLM plugins of grpolab's (vLLM's own extension points):

* ``WorkerExtension``, the worker extension (``--worker-extension-cls``): ``grpolab_seed(seed)`` seeds the
  worker's torch (and numpy) generators, the ones vLLM draws requests without a seed of their own from
  (rollout/vllm/engine.py, ``engine_seeded``, says where), and ``grpolab_missing_weights()`` names the
  parameters the last weight update left out (rollout/vllm/shm.py);
* ``BatchEndpoint``, an endpoint plugin (``vllm.endpoint_plugins``, allowed by name in ``VLLM_PLUGINS``):
  ``POST /grpolab/generate`` takes the whole batch, G samples of each prompt, and runs it as the
  colocated engine does: the scheduler paused once in-flight requests are done (its KV and prefix cache
  cleared, as colocated mode resets the prefix cache), the worker seeded, every prompt added in order with
  ``n = G`` and no seed of its own, then the scheduler resumed, so the engine schedules the whole batch
  at once, in the same order, from the same generator state. The same weights, settings and seed then
  give the tokens of colocated mode. Each prompt's samples are sent back as soon as they are all done
  (newline-delimited JSON), so the trainer scores a group while the others generate. One batch at a
  time (a lock): two trainer ranks' batches are run one after the other, each as its own rank's
  colocated engine would.

``GET /grpolab/info`` tells a client the route is there, how the server takes weights, and which model it
serves: its dtype and the ``[name, shape]`` of every parameter of the Hugging Face model its config
describes (built once on the meta device, so it costs no memory), the names and shapes a trainer of
that model sends; a trainer checks them at its first sync (rollout/vllm/server_protocol.py). ``GET
/grpolab/loaded`` names the parameters the last weight update left out (``{"missing": [...]}``, null
when the transport does not track them). A server without these routes (a plain ``vllm serve``) is
sampled with a seed per request instead (rollout/vllm/client.py).

With an API key (``VLLM_API_KEY``, set by ``rollout.api_key_env``), the plugin also guards every route but
/health with it (``KeyGuard``): vLLM's own key check covers only /v1, /v2, /inference and /cohere, which
leaves the RL endpoints (/pause, /update_weights, /collective_rpc, ...) and this route open to anyone who
reaches the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import uuid

ROUTE = "/grpolab/generate"
INFO_ROUTE = "/grpolab/info"
LOADED_ROUTE = "/grpolab/loaded"
PLUGIN = "grpolab_batch"
"""The endpoint plugin's entry-point name (``VLLM_PLUGINS`` must name it)."""
EXTENSION = "grpolab.rollout.vllm.batch.WorkerExtension"
PROTOCOL = 1
HEARTBEAT_S = 5.0
"""Seconds between the ``{"queued": true}`` lines of a batch waiting for another one."""


class WorkerExtension:
    """Mixed into vLLM's worker: the engine's unseeded sampling from a given seed, and what its last weight
    update left out."""

    def grpolab_seed(self, seed: int) -> None:
        import numpy as np
        import torch

        torch.random.default_generator.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed(seed)
        np.random.seed(seed % 2**32)

    def grpolab_missing_weights(self) -> list[str] | None:
        """The parameters the last update of grpolab's shm transport left out; None for another transport."""
        missing = getattr(getattr(self, "weight_transfer_engine", None), "missing", None)
        return None if missing is None else list(missing)


class BatchEndpoint:
    """``vllm.endpoint_plugins`` factory: the two routes of the module docstring."""

    name = PLUGIN
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.engine = None
        self.models = None
        self.lock: asyncio.Lock | None = None
        self.weights: list | None = None
        """The served model's ``[name, shape]`` list (module docstring), made at the first /grpolab/info."""

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse, StreamingResponse

        router = APIRouter()

        async def info() -> dict:
            vllm_config = getattr(self.engine, "vllm_config", None)
            model_config = getattr(vllm_config, "model_config", None)
            if self.weights is None and model_config is not None:
                self.weights = await asyncio.to_thread(served_weights, model_config)
            dtype = getattr(model_config, "dtype", None)
            return {
                "protocol": PROTOCOL,
                "weight_transfer": getattr(getattr(vllm_config, "weight_transfer_config", None), "backend", None),
                "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
                "weights": self.weights or None,
            }

        async def loaded() -> dict:
            if self.engine is None:
                return {"missing": None}
            reports = await self.engine.collective_rpc("grpolab_missing_weights")  # one per worker
            if any(r is None for r in reports):
                return {"missing": None}
            return {"missing": sorted({name for r in reports for name in r})}

        async def generate(raw):
            try:
                body = await raw.json()
                params, prompts, lora = self.parse(body)
            except (KeyError, TypeError, ValueError) as err:
                return JSONResponse({"error": f"bad {ROUTE} request: {type(err).__name__}: {err}"}, status_code=400)
            return StreamingResponse(self.lines(params, prompts, lora, body.get("seed")), media_type="application/x-ndjson")

        generate.__annotations__ = {"raw": Request}  # FastAPI reads it; a string (this module's future import) it cannot resolve
        router.add_api_route(INFO_ROUTE, info, methods=["GET"])
        router.add_api_route(LOADED_ROUTE, loaded, methods=["GET"])
        router.add_api_route(ROUTE, generate, methods=["POST"])
        app.include_router(router)
        key = os.environ.get("VLLM_API_KEY")
        if key:
            app.add_middleware(KeyGuard, key=key)

    async def init_state(self, engine_client, state, args) -> None:
        self.engine = engine_client
        self.models = getattr(state, "openai_serving_models", None)
        self.lock = asyncio.Lock()

    def parse(self, body: dict):
        """``body``: prompts (token ids), n, seed (or null), sampling (temperature, top_p, top_k, min_p and
        repetition_penalty (absent: off), max_tokens, stop_token_ids), model (the served name or a loaded LoRA
        adapter's)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = body["sampling"]
        params = SamplingParams(
            n=int(body["n"]), temperature=float(s["temperature"]), top_p=float(s["top_p"]), top_k=int(s["top_k"]),
            min_p=float(s.get("min_p", 0.0)), repetition_penalty=float(s.get("repetition_penalty", 1.0)),
            max_tokens=int(s["max_tokens"]), stop_token_ids=[int(t) for t in s["stop_token_ids"]], logprobs=0,
            detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
        )  # fmt: skip
        name, lora = body.get("model"), None
        if self.models is not None and name and not self.models.is_base_model(name):
            if name not in self.models.lora_requests:  # never the base weights for an adapter that is not there
                raise ValueError(f"the model {name!r} is neither the served model nor a loaded LoRA adapter")
            lora = self.models.lora_requests[name]
        prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in body["prompts"]]
        return params, prompts, lora

    async def lines(self, params, prompts: list[dict], lora, seed: int | None):
        """One JSON line per prompt as its n samples finish (``{"prompt": i, "samples": [{token_ids,
        logprobs}, ...]}``), in the order they finish, then ``{"done": n_prompts}``; a failure is an
        ``{"error": ...}`` line (the status is sent already). While another batch holds the engine (another
        trainer rank's), a ``{"queued": true}`` line every ``HEARTBEAT_S``, so the client's wait for a line
        bounds this batch's own generation, not the queue before it."""
        try:
            if self.engine is None:
                raise RuntimeError("this server has no engine")
            while True:
                try:
                    await asyncio.wait_for(self.lock.acquire(), timeout=HEARTBEAT_S)
                    break
                except TimeoutError:
                    yield json.dumps({"queued": True}) + "\n"
            try:
                async with contextlib.aclosing(self._run(params, prompts, lora, seed)) as lines:
                    async for line in lines:  # a client gone closes it here: its requests are aborted first
                        yield line
            finally:
                self.lock.release()
            yield json.dumps({"done": len(prompts)}) + "\n"
        except Exception as err:  # noqa: BLE001 - the client turns this into one line
            yield json.dumps({"error": f"{type(err).__name__}: {err}"}) + "\n"

    async def _run(self, params, prompts: list[dict], lora, seed: int | None):
        """The batch, holding the lock: paused, seeded, added in order, resumed (whatever fails or is cancelled
        on the way: a client gone), then each prompt's line as it finishes; a client gone mid-batch (this
        generator closed) aborts the requests still running."""
        tag = uuid.uuid4().hex[:12]
        queues = []
        try:
            await self.engine.pause_generation(mode="wait", clear_cache=True)
            if seed is not None:
                await self.engine.collective_rpc("grpolab_seed", args=(int(seed),))
            for i, p in enumerate(prompts):
                queues.append(await self.engine.add_request(f"grpolab-{tag}-{i}", p, params, lora_request=lora))
        except BaseException:  # a prompt refused (too long, ...), or the client gone: the ones added go too
            if queues:
                await self.engine.abort([q.request_id for q in queues], internal=True)
            raise
        finally:
            await self.engine.resume_generation()
        tasks = {asyncio.ensure_future(_finished(q)): i for i, q in enumerate(queues)}
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=tasks.get):
                    yield json.dumps({"prompt": tasks[task], "samples": task.result()}) + "\n"
        finally:
            unfinished = [queues[i].request_id for t, i in tasks.items() if not t.done()]
            for task in tasks:
                task.cancel()
            if unfinished:
                await self.engine.abort(unfinished, internal=True)


class KeyGuard:
    """ASGI middleware: every HTTP request but /health needs ``Authorization: Bearer <key>`` (401 otherwise)."""

    OPEN = ("/health",)

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].removeprefix(scope.get("root_path", "")) not in self.OPEN:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})
                return
        await self.app(scope, receive, send)


def served_weights(model_config) -> list:
    """``[name, shape]`` of every parameter (a tied head under both names, as a trainer sends it) of the
    Hugging Face model ``model_config`` describes, built on the meta device; [] when transformers cannot
    build it (an architecture it lacks: the trainer then relies on /grpolab/loaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                model_config.hf_config, trust_remote_code=bool(getattr(model_config, "trust_remote_code", False))
            )
    except Exception:  # noqa: BLE001 - whatever transformers raises for a config it cannot build
        return []
    return [[name, list(p.shape)] for name, p in model.named_parameters(remove_duplicate=False)]


async def _finished(queue) -> list[dict]:
    while True:
        out = queue.get_nowait() or await queue.get()
        if out.finished:
            break
    return [
        {"token_ids": list(c.token_ids), "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)]}
        for c in out.outputs
    ]
