"""A fake OpenAI-compatible chat endpoint on loopback, in a thread of the test: ``answer(body)`` says what each
request gets back, (status, JSON object or raw bytes); ``HANG`` makes the request wait until the server closes
(a judge that never answers). Every request's body is recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = object()


def chat(text: str, top: list[dict] | None = None, prompt_tokens: int = 10, completion_tokens: int = 3) -> dict:
    """A chat completion whose reply is ``text`` (and, with ``top``, the first token's top_logprobs)."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": top[0]["token"], "logprob": top[0]["logprob"], "top_logprobs": top}]}
    return {"choices": [choice], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def user_text(body: dict) -> str:
    return body["messages"][-1]["content"]


class FakeJudge:
    def __init__(self, answer: Callable[[dict], tuple[int, Any]]):
        self.answer = answer
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge._lock:
                    judge.bodies.append(body)
                    judge.headers.append(dict(self.headers))
                got = judge.answer(body)
                if got is HANG:
                    judge.closing.wait(60)
                    return
                status, payload = got
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def calls(self) -> int:
        return len(self.bodies)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
