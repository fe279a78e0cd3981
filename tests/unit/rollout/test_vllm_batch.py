"""rollout/vllm_batch.py's key guard: with an API key every route but /health needs it (vLLM's own check
covers /v1 and a few others only, not the RL endpoints)."""

from __future__ import annotations

import pytest

fastapi = pytest.importorskip("fastapi", reason="fastapi comes with vLLM (make test installs it)")

from fastapi.testclient import TestClient  # noqa: E402

from grpolab.rollout.vllm_batch import BatchEndpoint  # noqa: E402


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
    assert app.get("/grpolab/info", headers={"Authorization": "Bearer s3cret"}).json() == {"protocol": 1}
    assert app.post("/pause", headers={"Authorization": "Bearer s3cret"}).json() == {"ok": True}


def test_without_a_key_nothing_is_guarded(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = fastapi.FastAPI()
    BatchEndpoint().attach_router(app)
    assert TestClient(app).get("/grpolab/info").json() == {"protocol": 1}
