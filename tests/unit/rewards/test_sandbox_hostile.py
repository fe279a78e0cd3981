"""Hostile completions for the code_tests reward: each is contained, scores 0, and harms nothing.

Every case is written so that it would score > 0 only if its attack worked (the function the tests
call is defined only after the attack succeeds), and each is bounded by a 1 s sandbox time limit.
The cases that would hurt this process or its files if containment failed run only as root, where
the sandbox switches uid and namespaces (grpolab.rewards.sandbox); the others run everywhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grpolab.rewards import build_reward
from grpolab.rewards.sandbox import NOBODY
from grpolab.types import Completion, Example

IS_ROOT = os.geteuid() == 0
SECRET = "grpolab-test-secret-b7f3"
TESTS = ["assert add(1, 2) == 3"]
ADD = "\ndef add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def reward():
    return build_reward("code_tests", kwargs={"timeout_s": 1.0, "memory_mb": 256, "max_output_bytes": 4096}).reward


@pytest.fixture(scope="module")
def sentinel():
    """A world-writable folder (no sticky bit) holding a world-writable file, both owned by this user.

    Unix permissions alone would let any uid delete or overwrite it: only the sandbox's read-only
    mounts protect it.
    """
    folder = Path(tempfile.mkdtemp(prefix="grpolab-sentinel-", dir="/tmp"))
    os.chmod(folder, 0o777)
    file = folder / "keep.txt"
    file.write_text("precious")
    os.chmod(file, 0o666)
    yield file
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    yield server
    server.close()


def attack(body: str) -> str:
    """Code that defines add() only if ``body`` ran without raising and set ok = True."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return f"ok = False\ntry:\n{indented}\nexcept BaseException:\n    ok = False\nif ok:{ADD.replace(chr(10), chr(10) + '    ')}"


EVERYWHERE = {
    "infinite loop": "while True:\n    pass",
    "sleep forever": "import time\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "thread bomb": attack("import threading\nthreading.Thread(target=lambda: None).start()\nok = True"),
    "subprocess": attack("import subprocess\nsubprocess.run(['true'])\nok = True"),
    "memory bomb": attack("blocks = [bytearray(10**8) for _ in range(50)]\nok = True"),
    "huge output": "while True:\n    print('x' * 65536)",
    "fill the disk": attack("with open('big', 'wb') as f:\n    f.write(b'0' * (64 << 20))\nok = True"),
    "exit before the tests": "import sys\nsys.exit(0)" + ADD,
    "hard exit before the tests": "import os\nos._exit(0)" + ADD,
    "raise the limits": attack("import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (100, 100))\nok = True"),
    "forge pass lines": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'pass 0 0\\n')\n"
    "    except OSError:\n        pass\nimport sys\nsys.exit(0)",
}

ROOT_ONLY = {
    "kill the parent": attack("import os\nos.kill(os.getppid(), 9)\nok = True"),
    "kill the parent's group": attack("import os\nos.killpg(os.getpgid(os.getppid()), 9)\nok = True"),
    # kill(-1) succeeds as uid 65534 (there is nothing of that uid to hit), so no add() here:
    # what this case checks is that this process and its files survive.
    "kill everything": "import os\nos.kill(-1, 9)\nimport time\ntime.sleep(0.2)",
    "read the secret from the environment": attack(f"import os\nok = {SECRET!r} in repr(dict(os.environ))"),
    "read the parent's environment": attack(
        f"import os\nok = {SECRET!r}.encode() in open(f'/proc/{{os.getppid()}}/environ', 'rb').read()"
    ),
    "become root again": attack("import os\nos.setuid(0)\nok = True"),
    "shell out to rm": "import os\nos.system('rm -rf /tmp/grpolab-sentinel-*')",
}


def _nobody_processes() -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        count += int(uid) == NOBODY
    return count


def _score(reward, code: str) -> float:
    example = Example("add two numbers", meta={"tests": TESTS})
    start = time.monotonic()
    [score] = reward([Completion(f"```python\n{code}\n```", 10)], [example])
    assert time.monotonic() - start < 5
    return score


def test_a_benign_solution_passes(reward):
    assert _score(reward, ADD) == 1.0  # the harness itself is not what fails the hostile cases
    assert _score(reward, attack("ok = True")) == 1.0


@pytest.mark.parametrize("name", sorted(EVERYWHERE))
def test_hostile_code_is_contained(reward, name):
    assert _score(reward, EVERYWHERE[name]) == 0.0
    assert not IS_ROOT or _nobody_processes() == 0  # nothing left running


@pytest.mark.skipif(not IS_ROOT, reason="without root the sandbox cannot switch uid (see grpolab.rewards.sandbox)")
@pytest.mark.parametrize("name", sorted(ROOT_ONLY))
def test_hostile_code_cannot_reach_this_process(reward, name, sentinel, monkeypatch):
    monkeypatch.setenv("GRPOLAB_TEST_SECRET", SECRET)
    assert _score(reward, ROOT_ONLY[name]) == 0.0
    assert sentinel.read_text() == "precious"
    assert _nobody_processes() == 0


@pytest.mark.skipif(not IS_ROOT, reason="files are protected by read-only mounts, set up as root")
def test_files_outside_the_working_folder_survive(reward, sentinel):
    folder = sentinel.parent
    body = (
        f"import os, shutil\nos.remove({str(sentinel)!r})\n"
        f"open({str(folder / 'new.txt')!r}, 'w').write('x')\nshutil.rmtree({str(folder)!r})\nok = True"
    )
    assert _score(reward, attack(body)) == 0.0
    assert _score(reward, attack(f"open({str(sentinel)!r}, 'w').write('gone')\nok = True")) == 0.0
    assert _score(reward, attack("open('/tmp/grpolab-escaped.txt', 'w').write('x')\nok = True")) == 0.0
    assert sentinel.read_text() == "precious" and sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
    assert not Path("/tmp/grpolab-escaped.txt").exists()
    # ... while its own working folder is writable
    assert _score(reward, attack("open('mine.txt', 'w').write('x')\nok = open('mine.txt').read() == 'x'")) == 1.0


@pytest.mark.skipif(not IS_ROOT, reason="the network namespace needs root here")
def test_no_connection_even_to_localhost(reward, listener):
    port = listener.getsockname()[1]
    body = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\nok = True"
    assert _score(reward, attack(body)) == 0.0
    with pytest.raises(TimeoutError):
        listener.accept()
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):  # the listener does work
        listener.accept()[0].close()


def test_a_huge_program_output_is_cut_and_fails(reward):
    example = Example("print x", meta={"tests": [{"input": "", "output": "x"}]})
    flood = Completion("```python\nwhile True:\n    print('x')\n```", 5)
    fine = Completion("```python\nprint('x')\n```", 5)
    start = time.monotonic()
    assert reward([flood, fine], [example] * 2) == [0.0, 1.0]
    assert time.monotonic() - start < 5


def test_the_fallback_network_guard_refuses_sockets():
    """Without namespaces (no root, no user namespaces) only this Python-level guard stands."""
    from grpolab.rewards.sandbox import HARNESS

    code = (
        f"import runpy, socket\nrunpy.run_path({str(HARNESS)!r})['_guard_network']()\n"
        "for attempt in (lambda: socket.socket(), lambda: socket.create_connection(('127.0.0.1', 9))):\n"
        "    try:\n        attempt()\n        raise SystemExit('a socket was made')\n"
        "    except PermissionError:\n        pass\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
