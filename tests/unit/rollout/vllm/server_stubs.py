"""Loopback stand-ins for a vLLM server, each in a thread of the test: ``RawServer`` writes whatever bytes a
test gives it (another protocol, an answer cut short, a trickle), ``StubServer`` answers HTTP routes with
fixed JSON (a server that sends samples of the wrong shape) and records what it was asked."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RawServer:
    """Accepts connections on ``host``; each one's request is read whole, then ``handler(conn)`` answers it
    (and the connection is closed)."""

    def __init__(self, handler: Callable[[socket.socket], None], host: str = "127.0.0.1"):
        self.handler = handler
        self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.bind((host, 0))
        self.listener.listen()
        port = self.listener.getsockname()[1]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed by the test
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            read_request(conn)
            self.handler(conn)
        except OSError:
            pass  # the client gave up first (a timeout under test)
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.close()


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request: its head, and as many body bytes as its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return data


class StubServer:
    """HTTP on loopback: ``routes[(method, path)] = (status, body)`` (body: a dict or list as JSON, bytes as
    they are); every request is recorded in ``asked`` as (method, path, JSON body or None)."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, object]]):
        self.routes = routes
        self.asked: list[tuple[str, str, object]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                stub.asked.append((self.command, self.path, json.loads(raw) if raw else None))
                status, body = stub.routes.get((self.command, self.path), (404, {"detail": "Not Found"}))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ndjson(*lines: object) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)
