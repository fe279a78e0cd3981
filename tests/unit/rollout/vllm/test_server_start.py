"""rollout/vllm/server.py's start on an IPv6 loopback address: the port is found on that address and the URL
brackets it (a fake Popen stands for vLLM's server, whose own bind takes IPv6 addresses)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from grpolab.rollout.vllm import server as vllm_server


def test_a_server_on_ipv6_loopback_gets_a_port_there_and_a_bracketed_url(monkeypatch, tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 cannot be bound here")
    started = []

    class FakePopen:
        def __init__(self, cmd, **kw):
            started.append(cmd)
            self.pid, self.returncode = -1, 0

        def poll(self):
            return 0

    monkeypatch.setattr(vllm_server.subprocess, "Popen", FakePopen)
    server = vllm_server.VLLMServer.start(["--model", "m"], host="::1", log_path=tmp_path / "log")
    (cmd,) = started
    port = int(cmd[cmd.index("--port") + 1])
    assert cmd[cmd.index("--host") + 1] == "::1" and server.url == f"http://[::1]:{port}"
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))  # a port free on ::1 (it was an IPv4 socket's, and ::1 a traceback, before)
    vllm_server.atexit.unregister(server.stop)


def test_an_address_this_machine_cannot_bind_is_one_line():
    with pytest.raises(vllm_server.RolloutServerError, match=r"cannot bind a vLLM server to no-such-host.invalid \(") as err:
        vllm_server.free_port("no-such-host.invalid")
    assert "rollout.server_host" in str(err.value) and "\n" not in str(err.value)


def test_the_servers_pythonpath_holds_this_grpolab_and_nothing_inside_it():
    """The server imports grpolab's plugins from this checkout: the folder holding the package, not a folder
    inside it, whose types.py would shadow the standard library's (the server then fails at start)."""
    import grpolab

    root = Path(vllm_server.package_root())
    assert root / "grpolab" / "__init__.py" == Path(grpolab.__file__).resolve()
    assert not (root / "types.py").exists()
