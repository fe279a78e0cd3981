"""A server grpolab starts dies with the process that started it, whatever kills that process, with its
/dev/shm files (rollout/vllm/server_guard.py); what an owner and guard killed together leave is reclaimed by the
next start (vllm_server.reclaim_stale). A stand-in command plays the vLLM server: it maps a /dev/shm queue
file, as vLLM's processes do, and sleeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from grpolab.rollout.vllm import server as vllm_server
from grpolab.rollout.vllm import server_guard

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or not Path("/dev/shm").is_dir(),
                                reason="Linux: /proc and /dev/shm")  # fmt: skip

STAND_IN = """
import mmap, sys, time
with open(sys.argv[1], "w+b") as f:
    f.truncate(4096)
    queue = mmap.mmap(f.fileno(), 4096)
print("serving", flush=True)
time.sleep(600)
"""

OWNER = """
import sys, threading, time
from pathlib import Path
from grpolab.rollout.vllm import server as vllm_server

records, log, queue, stand_in, in_thread = sys.argv[1:6]
vllm_server.RECORDS = Path(records)
started = []
def start():
    started.append(vllm_server.VLLMServer.launch([sys.executable, "-c", stand_in, queue], "http://127.0.0.1:1",
                                                 log_path=Path(log)))
if in_thread == "1":  # the thread that started it ends at once: the kernel's parent-death signal must not fire
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
else:
    start()
print(started[0].proc.pid, flush=True)
time.sleep(600)
"""


def _until(check, timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def queue():
    path = Path("/dev/shm") / f"psm_grpolabtest_{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "another thread"])
def test_a_server_dies_with_its_sigkilled_owner_and_its_shared_memory_goes(tmp_path, queue, in_thread):
    records, log = tmp_path / "records", tmp_path / "server.log"
    argv = [sys.executable, "-c", OWNER, str(records), str(log), str(queue), STAND_IN, "1" if in_thread else "0"]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        group = int(owner.stdout.readline())
        _until(lambda: log.is_file() and "serving" in log.read_text(), what="the stand-in server starts")
        members = server_guard.group_pids(group)
        assert len(members) == 2 and group in members  # the guard and the server, one process group
        [record] = records.glob("*.json")
        assert json.loads(record.read_text())["owner"] == owner.pid
        assert queue.exists()
    finally:
        owner.kill()  # SIGKILL: no handler, no atexit, nothing of the owner's runs
        owner.wait()
    _until(lambda: server_guard.group_pids(group) == [], 30, "the server's group is gone after its owner")
    assert not queue.exists()  # the queue the server mapped went with it
    assert list(records.glob("*.json")) == []
    assert f"the process that started this server (pid {owner.pid}) is gone" in log.read_text()


def test_stop_ends_the_group_and_the_guard_reports_the_server_s_own_status(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_server, "RECORDS", tmp_path / "records")
    quits = vllm_server.VLLMServer.launch([sys.executable, "-c", "raise SystemExit(3)"], "http://127.0.0.1:1")
    assert quits.proc.wait(timeout=60) == 3  # what wait_healthy reports as the server's exit status
    quits.stop()
    killed = vllm_server.VLLMServer.launch([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], "http://x")
    assert killed.proc.wait(timeout=60) == -signal.SIGKILL
    killed.stop()
    sleeper = vllm_server.VLLMServer.launch([sys.executable, "-c", "import time; time.sleep(600)"], "http://x")
    _until(lambda: len(sleeper.group_pids()) == 2, what="the stand-in server starts")
    sleeper.stop()
    assert sleeper.group_pids() == [] and list((tmp_path / "records").glob("*.json")) == []


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def _record(folder: Path, name: str, owner: int, owner_start, group: int, group_start, paths=()) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"owner": owner, "owner_start": owner_start, "group": group,
                                "group_start": group_start, "paths": [str(p) for p in paths]}))  # fmt: skip
    return path


def test_the_next_start_reclaims_what_a_dead_owner_left_and_nothing_else(tmp_path, queue):
    records = tmp_path / "records"
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    left = subprocess.Popen(sleep, start_new_session=True)  # a server whose owner and guard were killed together
    other = subprocess.Popen(sleep, start_new_session=True)  # a live process that now has a recorded leader's pid
    mine = subprocess.Popen(sleep, start_new_session=True)  # the server of an owner that still runs (this test)
    try:
        queue.write_bytes(b"q")
        start = server_guard.start_time
        stale = _record(records, "stale", _dead_pid(), 1, left.pid, start(left.pid), [queue, tmp_path / "psm_elsewhere"])
        reused = _record(records, "reused", _dead_pid(), 1, other.pid, start(other.pid) + 1)
        live = _record(records, "live", os.getpid(), start(os.getpid()), mine.pid, start(mine.pid))
        (tmp_path / "psm_elsewhere").write_text("not under /dev/shm: a record cannot delete it")

        assert vllm_server.reclaim_stale(records) == [left.pid]
        assert left.wait(timeout=30) == -signal.SIGTERM
        assert not queue.exists() and not stale.exists()
        assert (tmp_path / "psm_elsewhere").exists()
        assert other.poll() is None and not reused.exists()  # another process's pid: not signalled
        assert mine.poll() is None and live.exists()  # its owner runs: left alone
    finally:
        for proc in (left, other, mine):
            proc.kill()
            proc.wait()
