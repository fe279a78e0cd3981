"""Engine errors in server mode, against a stub server on loopback (no vLLM): a request answered with an error, or a
batch whose stream breaks off, fails the samples that did not come back (engine_error), and those that did are
kept; every group still reaches the scorer, in its place."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpolab.rollout.vllm import batch as vllm_batch
from grpolab.rollout.vllm.client import ServerSampler
from grpolab.rollout.vllm.server_client import ServerClient
from grpolab.tasks.tiny import build_char_tokenizer

BAD = 7
"""A prompt whose first token is BAD is refused (per request), or cuts the batch's stream off before it."""


class Stub(BaseHTTPRequestHandler):
    batched = False

    def log_message(self, *args):  # quiet
        pass

    def _json(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/weight_info":
            return self._json(200, {"weight_version": "0"})
        if self.path == vllm_batch.INFO_ROUTE and self.batched:
            return self._json(200, {"protocol": vllm_batch.PROTOCOL})
        return self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            if body["prompt"][0] == BAD:
                return self._json(500, {"error": "EngineCore encountered an issue"})
            choice = {"token_ids": [3, 4], "logprobs": {"token_logprobs": [-0.5, -0.25]}}
            return self._json(200, {"choices": [choice]})
        if self.path == vllm_batch.ROUTE:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            for p, ids in enumerate(body["prompts"]):
                if ids[0] == BAD:
                    self.wfile.write(json.dumps({"error": "the engine stopped mid-batch"}).encode() + b"\n")
                    return
                samples = [{"token_ids": [3, 4], "logprobs": [-0.5, -0.25]}] * body["n"]
                self.wfile.write(json.dumps({"prompt": p, "samples": samples}).encode() + b"\n")
            self.wfile.write(b'{"done": true}\n')
            return None
        return self._json(404, {"error": "not found"})


@pytest.fixture(params=[False, True], ids=["request-per-sample", "batch-route"])
def server(request):
    handler = type("Handler", (Stub,), {"batched": request.param})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", request.param
    httpd.shutdown()
    httpd.server_close()


def test_a_failed_request_or_a_broken_stream_fails_only_what_did_not_come_back(server):
    url, batched = server
    tok = build_char_tokenizer()
    sampler = ServerSampler(ServerClient(url, timeout_s=10), tok, max_completion_length=4, eos_token_ids=[tok.eos_token_id])
    sampler.version = 0  # as after its first sync
    groups = {}
    out = sampler.sample(
        [[5, 5], [BAD, 5], [6, 6]], num_generations=2, generator=torch.Generator().manual_seed(0),
        on_group=lambda p, group: groups.setdefault(p, group),
    )  # fmt: skip
    assert sampler.batched == batched
    # per request: only prompt 1's two requests failed; a broken stream: prompt 1 and every prompt after it
    lost = [1] if not batched else [1, 2]
    kinds = [out.failures[i] and out.failures[i].kind for i in range(6)]
    assert kinds == ["engine_error" if i // 2 in lost else None for i in range(6)]
    said = "the engine stopped mid-batch" if batched else "answered /v1/completions with 500"
    assert said in out.failures[2].message and url in out.failures[2].message
    assert out.completion_ids[0].tolist() == [3, 4] and out.lengths.tolist() == [0 if i // 2 in lost else 2 for i in range(6)]
    assert sorted(groups) == [0, 1, 2]  # every group reached the scorer, the failed ones marked
    assert [groups[p].failures is not None for p in range(3)] == [p in lost for p in range(3)]
    sampler.close()


def test_a_server_that_cannot_be_reached_stops_the_run_instead_of_failing_samples(server):
    """No sample of any prompt can come back from a server that is gone: one ServerGone line, not dropped groups."""
    from grpolab.rollout.vllm.server_client import ServerGone

    url, batched = server
    tok = build_char_tokenizer()
    sampler = ServerSampler(ServerClient(url, timeout_s=10), tok, max_completion_length=4, eos_token_ids=[tok.eos_token_id])
    sampler.version = 0
    assert sampler.batched == batched  # the route is known before the server goes
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{s.getsockname()[1]}"
    sampler.client.close()
    sampler.client = ServerClient(gone, timeout_s=10)
    with pytest.raises(ServerGone, match=f"the vLLM server at {gone} cannot be reached"):
        sampler.sample([[5, 5]], num_generations=2, generator=torch.Generator().manual_seed(0))
    sampler.close()
