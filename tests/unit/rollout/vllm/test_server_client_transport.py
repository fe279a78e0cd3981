"""rollout/vllm/server_client.py against servers that misbehave (loopback stand-ins in threads, tests/unit/rollout/
server_stubs.py): whatever comes back (an HTML page, another protocol, an answer cut short, a stream dropped
mid-line, JSON of another shape, a trickle) is one RolloutServerError line naming the server and the
route, and rollout.sync_timeout_s bounds a whole call, not each read."""

from __future__ import annotations

import socket
import time

import pytest
from server_stubs import RawServer, StubServer

from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.server_client import ServerClient, ServerStatusError


@pytest.fixture
def raw():
    made: list[RawServer] = []

    def make(handler, host="127.0.0.1") -> RawServer:
        made.append(RawServer(handler, host))
        return made[-1]

    yield make
    for server in made:
        server.close()


def answer(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


HTML = b"<!doctype html><html><body>Jupyter Server</body></html>"
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize(
    ("sends", "says"),
    [
        (answer("200 OK", HTML, "Content-Type: text/html"), "with <!doctype html><html><body>Jupyter Server"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n\x00\xff", "did not answer in HTTP (RemoteProtocolError: illegal status line"),
        (answer("200 OK", b'{"weight_version": "0"}')[:-10], "broke off its answer"),  # cut short
        (b"", "broke off its answer to /weight_info or did not answer in HTTP (RemoteProtocolError: Server disconnected"),
        (answer("200 OK", b'{"weight_version": [1]}'), "'weight_version' = [1], not str or int or NoneType"),
        (answer("200 OK", b'{"version": "0"}'), "no 'weight_version' in {'version': '0'}"),
        (answer("200 OK", b"[" * 100_000), "not a JSON object"),  # nested past Python's stack: no RecursionError
        (answer("502 Bad Gateway", HTML), "answered /weight_info with 502: <!doctype html>"),
    ],
    ids=["html-page", "other-protocol", "cut-short", "closed-unanswered", "wrong-type", "missing-key", "deep", "502"],
)
def test_whatever_a_server_sends_back_is_one_line_naming_it_and_the_route(raw, sends, says):
    server = raw(lambda conn: conn.sendall(sends))
    with pytest.raises(RolloutServerError) as err:
        ServerClient(server.url, timeout_s=10).version()
    message = str(err.value)
    assert says in message and server.url in message and "/weight_info" in message and "\n" not in message


def test_a_stream_dropped_mid_line_is_one_line_after_the_lines_that_came_whole(raw):
    def dropped(conn):
        conn.sendall(CHUNKED + chunk(b'{"queued": true}\n') + chunk(b'{"prompt": 0, "sam'))  # then the server dies

    got = []
    with pytest.raises(RolloutServerError, match=r"broke off its answer to /grpolab/generate") as err:
        for line in ServerClient(raw(dropped).url, timeout_s=10).stream("/grpolab/generate", {}):
            got.append(line)
    assert got == [{"queued": True}] and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"<html>\n", "a line that is not JSON (<html>)"),
        (b"[1, 2]\n", "a line that is not a JSON object ([1, 2])"),
        (b'{"error": "ValueError: prompt too long"}\n', "failed at /grpolab/generate: ValueError: prompt too long"),
    ],
)
def test_a_stream_line_that_is_not_a_json_object_is_one_line(raw, line, says):
    server = raw(lambda conn: conn.sendall(CHUNKED + chunk(line) + b"0\r\n\r\n"))
    with pytest.raises(RolloutServerError, match=r"^the vLLM server at http://127\.0\.0\.1:\d+ ") as err:
        list(ServerClient(server.url, timeout_s=10).stream("/grpolab/generate", {}))
    assert says in str(err.value)


def trickle(data: bytes, every_s: float):
    def send(conn):
        for i in range(len(data)):
            conn.sendall(data[i : i + 1])
            time.sleep(every_s)

    return send


def test_a_server_answering_a_byte_at_a_time_is_cut_at_the_calls_deadline(raw):
    """Each read gets a byte within 0.05 s, so a timeout per read never fires; the answer would take
    ~3 s whole: the call's deadline of 1 s cuts it."""
    server = raw(trickle(answer("200 OK", b'{"weight_version": "0"}'), every_s=0.05))
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError, match=r"did not answer /weight_info within 1 s \(rollout.sync_timeout_s\)"):
        ServerClient(server.url, timeout_s=1.0).version()
    assert 1.0 <= time.monotonic() - t0 < 2.5
    fast = raw(trickle(answer("200 OK", b'{"weight_version": "0"}'), every_s=0.0))
    assert ServerClient(fast.url, timeout_s=1.0).version() == "0"  # the same answer at once is read whole


def test_a_stream_line_trickled_a_byte_at_a_time_is_cut_at_its_deadline(raw):
    """The batch route's bound is per whole line: the first line comes at once, the second trickles."""
    line = b'{"prompt": 0, "samples": []}\n'

    def send(conn):
        conn.sendall(CHUNKED + chunk(b'{"queued": true}\n'))
        for i in range(len(line)):
            conn.sendall(chunk(line[i : i + 1]))
            time.sleep(0.05)

    got = []
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError, match=r"did not answer /grpolab/generate within 1 s"):
        for item in ServerClient(raw(send).url, timeout_s=1.0).stream("/grpolab/generate", {}):
            got.append(item)
    assert got == [{"queued": True}] and 1.0 <= time.monotonic() - t0 < 2.5


def test_an_http_error_keeps_its_status_and_says_what_the_server_said():
    stub = StubServer({("POST", "/finish_weight_update"): (500, b"Internal Server Error")})
    try:
        with pytest.raises(ServerStatusError, match=r"answered /finish_weight_update with 500: Internal Server Error") as err:
            ServerClient(stub.url, timeout_s=5).call("POST", "/finish_weight_update", {"weight_version": "0"})
        assert err.value.status == 500
    finally:
        stub.close()


def test_connections_are_kept_and_reused_between_calls():
    stub = StubServer({("GET", "/weight_info"): (200, {"weight_version": "7"})})
    client = ServerClient(stub.url, timeout_s=5)
    try:
        assert [client.version() for _ in range(3)] == ["7"] * 3
        assert len(client._pool.connections) == 1  # one connection for the three calls (urllib opened three)
    finally:
        client.close()
        stub.close()


def test_an_ipv6_loopback_server_is_reached(raw):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server = raw(lambda conn: conn.sendall(answer("200 OK", b'{"weight_version": "3"}')), host="::1")
    except OSError:
        pytest.skip("::1 cannot be bound here")
    assert server.url.startswith("http://[::1]:")
    assert ServerClient(server.url, timeout_s=5).version() == "3"
