"""rollout/vllm/batch.py: the batch route's sequence against a fake engine (pause, seed, add in order,
resume; aborts and resumes on every failure; heartbeats while queued), and the key guard: with an API
key every route but /health needs it (vLLM's own check covers /v1 and a few others only, not the RL
endpoints)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

fastapi = pytest.importorskip("fastapi", reason="fastapi comes with vLLM (make test installs it)")

from fastapi.testclient import TestClient  # noqa: E402

from grpolab.rollout.vllm.batch import BatchEndpoint  # noqa: E402


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    app = fastapi.FastAPI()
    for path in ("/health", "/pause", "/collective_rpc", "/v1/models"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    BatchEndpoint().attach_router(app)
    return TestClient(app)


def test_every_route_but_health_needs_the_key(app):
    assert app.get("/health").status_code == 200
    for path in ("/pause", "/collective_rpc", "/v1/models", "/grpolab/info"):
        assert app.get(path).status_code == 401
        assert app.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert app.get("/grpolab/info", headers={"Authorization": "Bearer s3cret"}).json()["protocol"] == 1
    assert app.post("/pause", headers={"Authorization": "Bearer s3cret"}).json() == {"ok": True}


def test_without_a_key_nothing_is_guarded_and_info_names_the_weight_transfer_and_the_model(monkeypatch):
    import torch

    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = fastapi.FastAPI()
    endpoint = BatchEndpoint()
    endpoint.attach_router(app)
    nothing = {"protocol": 1, "weight_transfer": None, "dtype": None, "weights": None}
    assert TestClient(app).get("/grpolab/info").json() == nothing  # no engine yet
    served = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    model_config = SimpleNamespace(hf_config=served.config, dtype=torch.bfloat16, trust_remote_code=False)
    endpoint.engine = SimpleNamespace(vllm_config=SimpleNamespace(
        weight_transfer_config=SimpleNamespace(backend="nccl"), model_config=model_config))  # fmt: skip
    info = TestClient(app).get("/grpolab/info").json()
    assert (info["protocol"], info["weight_transfer"], info["dtype"]) == (1, "nccl", "bfloat16")
    assert info["weights"] == [[n, list(p.shape)] for n, p in served.named_parameters(remove_duplicate=False)]
    model_config.hf_config = SimpleNamespace()  # no architecture transformers can build: the server does not say
    endpoint.weights = None
    assert TestClient(app).get("/grpolab/info").json()["weights"] is None


def test_loaded_names_what_any_worker_left_out(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = fastapi.FastAPI()
    endpoint = BatchEndpoint()
    endpoint.attach_router(app)
    assert TestClient(app).get("/grpolab/loaded").json() == {"missing": None}  # no engine yet
    reports = [["b", "a"], ["a"]]

    async def collective_rpc(method, args=()):
        assert method == "grpolab_missing_weights"
        return reports

    endpoint.engine = SimpleNamespace(collective_rpc=collective_rpc)
    assert TestClient(app).get("/grpolab/loaded").json() == {"missing": ["a", "b"]}
    reports[1] = None  # a worker whose transport does not track them
    assert TestClient(app).get("/grpolab/loaded").json() == {"missing": None}


def test_the_worker_extension_reports_what_its_transfer_engine_left_out():
    from grpolab.rollout.vllm.batch import WorkerExtension

    worker = WorkerExtension()
    assert worker.grpolab_missing_weights() is None  # no transfer engine
    worker.weight_transfer_engine = SimpleNamespace(missing=("x.weight",))
    assert worker.grpolab_missing_weights() == ["x.weight"]


class FakeQueue:
    def __init__(self, request_id: str, done: asyncio.Event, tokens: list[int]):
        self.request_id, self.done, self.tokens = request_id, done, tokens

    def get_nowait(self):
        return None

    async def get(self):
        await self.done.wait()
        sample = SimpleNamespace(token_ids=self.tokens, logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in self.tokens])
        return SimpleNamespace(finished=True, outputs=[sample, sample])


class FakeEngine:
    """The calls the route makes of vLLM's AsyncLLM, recorded; prompt i finishes when ``finish[i]`` is set."""

    def __init__(self, n: int, refuse: int | None = None, pause_fails: bool = False):
        self.calls: list[tuple] = []
        self.finish = [asyncio.Event() for _ in range(n)]
        self.refuse, self.pause_fails = refuse, pause_fails

    async def pause_generation(self, **kw):
        self.calls.append(("pause", kw["mode"]))
        if self.pause_fails:
            raise asyncio.CancelledError  # the client gone while in-flight requests drain

    async def resume_generation(self):
        self.calls.append(("resume",))

    async def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method, args))

    async def add_request(self, request_id, prompt, params, lora_request=None):
        i = int(request_id.rsplit("-", 1)[1])
        if i == self.refuse:
            raise ValueError("prompt too long")
        self.calls.append(("add", i))
        return FakeQueue(f"internal-{i}", self.finish[i], [i, i + 1])

    async def abort(self, ids, internal=False):
        self.calls.append(("abort", sorted(ids)))


def _endpoint(engine) -> BatchEndpoint:
    end = BatchEndpoint()
    asyncio.run(end.init_state(engine, SimpleNamespace(), None))
    end.lock = None  # made in the test's own loop below
    return end


async def _collect(end, engine, n: int, *, finish_order=(), stop_after=None):
    end.lock = asyncio.Lock()
    gen = end.lines(None, [{"prompt_token_ids": [i]} for i in range(n)], None, 7)
    out = []

    async def finisher():
        for i in finish_order:
            await asyncio.sleep(0.01)
            engine.finish[i].set()

    task = asyncio.ensure_future(finisher())
    async for line in gen:
        out.append(json.loads(line))
        if stop_after is not None and len(out) == stop_after:
            await gen.aclose()  # the client gone mid-batch
            break
    task.cancel()
    return out, end.lock.locked()


def test_the_batch_is_paused_seeded_added_in_order_resumed_and_streamed_as_prompts_finish():
    engine = FakeEngine(3)
    out, locked = asyncio.run(_collect(_endpoint(engine), engine, 3, finish_order=(2, 0, 1)))
    assert engine.calls == [("pause", "wait"), ("rpc", "grpolab_seed", (7,)), ("add", 0), ("add", 1), ("add", 2), ("resume",)]
    assert [line.get("prompt") for line in out] == [2, 0, 1, None] and out[-1] == {"done": 3}
    assert out[0]["samples"] == [{"token_ids": [2, 3], "logprobs": [-0.5, -0.5]}] * 2 and not locked


def test_a_refused_prompt_aborts_the_ones_added_and_resumes():
    engine = FakeEngine(3, refuse=1)
    out, locked = asyncio.run(_collect(_endpoint(engine), engine, 3))
    assert engine.calls[-2:] == [("abort", ["internal-0"]), ("resume",)]
    assert out == [{"error": "ValueError: prompt too long"}] and not locked


def test_a_client_gone_mid_batch_aborts_what_still_runs_and_frees_the_engine():
    engine = FakeEngine(3)
    out, locked = asyncio.run(_collect(_endpoint(engine), engine, 3, finish_order=(1,), stop_after=1))
    assert out[0]["prompt"] == 1
    assert engine.calls[-1] == ("abort", ["internal-0", "internal-2"]) and not locked


def test_a_pause_cut_short_still_resumes_the_engine():
    engine = FakeEngine(2, pause_fails=True)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_collect(_endpoint(engine), engine, 2))
    assert engine.calls == [("pause", "wait"), ("resume",)]


def test_a_batch_waiting_for_another_sends_heartbeats(monkeypatch):
    import grpolab.rollout.vllm.batch as vb

    monkeypatch.setattr(vb, "HEARTBEAT_S", 0.05)
    engine = FakeEngine(1)
    end = _endpoint(engine)

    async def run():
        end.lock = asyncio.Lock()
        await end.lock.acquire()  # another rank's batch
        gen = end.lines(None, [{"prompt_token_ids": [0]}], None, None)
        first = json.loads(await gen.__anext__())
        end.lock.release()
        engine.finish[0].set()
        return first, [json.loads(line) async for line in gen]

    first, rest = asyncio.run(run())
    assert first == {"queued": True} and rest[-1] == {"done": 1} and ("rpc", "grpolab_seed", (None,)) not in engine.calls


def test_the_batch_takes_min_p_and_the_repetition_penalty_and_an_older_client_gets_them_off():
    pytest.importorskip("vllm", reason="SamplingParams comes from vLLM")
    sampling = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 4, "stop_token_ids": [0]}
    body = {"prompts": [[1, 2]], "n": 2, "sampling": {**sampling, "min_p": 0.05, "repetition_penalty": 1.2}}
    end = _endpoint(FakeEngine(1))
    params, prompts, lora = end.parse(body)
    assert (params.min_p, params.repetition_penalty, prompts, lora) == (0.05, 1.2, [{"prompt_token_ids": [1, 2]}], None)
    params, _, _ = end.parse({**body, "sampling": sampling})
    assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)
