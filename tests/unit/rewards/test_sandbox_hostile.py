"""Hostile completions for the code_tests reward: each scores 0 and leaves this machine as it was.

Every case would score > 0 only if its attack worked (the function the tests call is defined only
after the attack succeeds, or the attack tries to forge the verdict), and the tests it is scored on
have three different answers, so no constant can pass them. All cases run in one batch (a few
sandboxes at once), with a 1 s time limit each; then the host is checked: its files, its sockets
(a unix socket in /tmp with mode 777, an abstract one, a TCP listener), a process holding a marker
in its command line, and leftovers of the sandbox. The full set of namespaces needs root or user
namespaces; where neither is available the file, socket and process cases are skipped (see
test_sandbox_nonroot.py for what that fallback does and does not contain).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.rewards import build_reward
from grpolab.rewards.sandbox import HARNESS
from grpolab.types import Completion, Example

TOKEN = secrets.token_hex(6)
SECRET = f"grpolab-test-secret-{TOKEN}"
MARKER = f"grpolab-marker-{TOKEN}"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42"]
ADD = "\ndef add(a, b):\n    return a + b\n"
TMP = Path("/tmp")
SENTINEL_DIR = TMP / f"grpolab-sentinel-{TOKEN}"
ANSWERS = TMP / f"grpolab-answers-{TOKEN}.json"
UNIX_SOCKET = TMP / f"grpolab-host-{TOKEN}.sock"
ABSTRACT_SOCKET = f"\0grpolab-host-{TOKEN}"


def attack(body: str) -> str:
    """Code that defines add() only if ``body`` ran without raising and set ok = True."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return f"ok = False\ntry:\n{indented}\nexcept BaseException:\n    ok = False\nif ok:{ADD.replace(chr(10), chr(10) + '    ')}"


def _walk_frames(body: str) -> str:
    return "import sys\nf = sys._getframe()\nwhile f is not None:\n" + "\n".join(
        "    " + line for line in body.splitlines()
    ) + "\n    f = f.f_back\n"


FORGERY = {
    "override builtins.exec": "import builtins\nbuiltins.exec = lambda *a, **k: None",
    "override builtins.compile": "import builtins\n_c = compile\nbuiltins.compile = lambda *a, **k: _c('1', 'x', 'eval')",
    "override builtins.eval": "import builtins\nbuiltins.eval = lambda *a, **k: True",
    "always-equal __eq__": "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "def add(a, b):\n    return Any()",
    "int subclass equal to everything": "class I(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\ndef add(a, b):\n    return I(7)",
    "read the expected values from the harness's frames": attack(
        _walk_frames("found = repr(f.f_locals) + repr(f.f_globals)\nif '=' * 2 + ' 42' in found:\n    ok = True")
    ),
    "patch the harness to send code as a value": _walk_frames(
        "if '_plain' in f.f_globals:\n    f.f_globals['_plain'] = lambda value, depth=0: value"
    )
    + f"class R:\n    def __repr__(self):\n        return \"__import__('os').system('touch /tmp/grpolab-pwned-{TOKEN}')\"\n"
    "def add(a, b):\n    return R()",
    "forge result lines on every descriptor": "import json, os\nfor fd in range(3, 64):\n    for i in range(3):\n"
    "        for line in ({'i': i, 'value': 'True'}, {'i': i, 'value': \"__import__('os')\"}, 'pass 0 %d' % i):\n"
    "            try:\n                os.write(fd, (json.dumps(line) + '\\n').encode())\n"
    "            except OSError:\n                pass\nos._exit(0)",
    "flood the status channel": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x' * (2 << 20))\n"
    "    except OSError:\n        pass",
    "deeply nested value": "def add(a, b):\n    v = []\n    for _ in range(10000):\n        v = [v]\n    return v",
    "huge integer value": "def add(a, b):\n    return 10 ** 100000",
    "exit before the tests": "import sys\nsys.exit(0)" + ADD,
    "hard exit before the tests": "import os\nos._exit(0)" + ADD,
}

RESOURCES = {
    "infinite loop": "while True:\n    pass",
    "sleep forever": "import time\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "thread bomb": attack("import threading\nthreading.Thread(target=lambda: None).start()\nok = True"),
    "subprocess": attack("import subprocess\nsubprocess.run(['true'])\nok = True"),
    "memory bomb": attack("blocks = [bytearray(10**8) for _ in range(50)]\nok = True"),
    "huge output": "while True:\n    print('x' * 65536)",
    "one 64 MB file": attack("with open('big', 'wb') as f:\n    f.write(b'0' * (64 << 20))\nok = True"),
    "360 MB in 15 MB files": attack(
        "for i in range(24):\n    with open(f'part{i}', 'wb') as f:\n        f.write(b'0' * (15 << 20))\nok = True"
    ),
    "10000 empty files": attack("for i in range(10000):\n    open(f'f{i}', 'w').close()\nok = True"),
    "raise the limits": attack("import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (100, 100))\nok = True"),
}

ESCAPES = {
    "host unix socket": attack(
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(UNIX_SOCKET)!r})\nok = True"
    ),
    "host abstract unix socket": attack(
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({ABSTRACT_SOCKET!r})\nok = True"
    ),
    "read the parent's command line": attack("import os\nok = b'pytest' in open(f'/proc/{os.getppid()}/cmdline', 'rb').read()"),
    "find other processes": attack(
        "import os\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
        f"        ok = ok or {MARKER!r}.encode() in open(f'/proc/{{pid}}/cmdline', 'rb').read()\n"
        "    except OSError:\n        pass"
    ),
    "world-readable answers file": f"import json\ntable = json.load(open({str(ANSWERS)!r}))\n"
    "def add(a, b):\n    return table[f'{a},{b}']",
    "read /etc/passwd": attack("ok = 'root:' in open('/etc/passwd').read()"),
    "read the trainer's source": attack(f"ok = 'def main' in open({str(HARNESS)!r}).read()"),
    "environment secret": attack(f"import os\nok = {SECRET!r} in repr(dict(os.environ))"),
    "the parent's environment": attack("import os\nok = len(open(f'/proc/{os.getppid()}/environ', 'rb').read()) > 0"),
    "write to the host's /tmp": attack(f"open('/tmp/grpolab-escape-{TOKEN}', 'w').write('x')\nok = True"),
    "rm -rf a world-writable folder": attack(f"import shutil\nshutil.rmtree({str(SENTINEL_DIR)!r})\nok = True"),
    "overwrite a world-writable file": attack(f"open({str(SENTINEL_DIR / 'keep.txt')!r}, 'w').write('gone')\nok = True"),
    "shell out to rm": attack(f"import os\nok = os.system('rm -rf {SENTINEL_DIR}') == 0"),
    "kill the parent": "import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(0.2)",
    "kill everything": "import os\nos.kill(-1, 9)\nimport time\ntime.sleep(0.2)",
    "kill the process group": "import os\nos.killpg(0, 9)\nimport time\ntime.sleep(0.2)",
    "become root again": attack("import os\nos.setuid(0)\nok = True"),
    "own user namespace (to mount a bigger tmpfs)": attack(
        "import ctypes\nok = ctypes.CDLL(None).unshare(0x10000000 | 0x20000) == 0"
    ),
    "mount a tmpfs": attack("import ctypes\nok = ctypes.CDLL(None).mount(b'x', b'.', b'tmpfs', 0, None) == 0"),
    "ptrace the parent": attack("import ctypes, os\nok = ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0) == 0"),
}

CASES = {**FORGERY, **RESOURCES, **ESCAPES}


def _harness_processes() -> list[str]:
    """Command lines of live processes running this checkout's harness (other checkouts' do not count)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(HARNESS) in cmdline:
            found.append(cmdline)
    return found


def _listener(family: int, address) -> socket.socket:
    server = socket.socket(family)
    server.bind(address)
    server.listen(8)
    server.setblocking(False)
    return server


@pytest.fixture(scope="module")
def host():
    """Things on this machine the hostile code would reach if it escaped, and their state afterwards."""
    SENTINEL_DIR.mkdir(mode=0o777)
    os.chmod(SENTINEL_DIR, 0o777)  # no sticky bit: any uid could delete what is inside
    (SENTINEL_DIR / "keep.txt").write_text("precious")
    os.chmod(SENTINEL_DIR / "keep.txt", 0o666)
    ANSWERS.write_text(json.dumps({"1,2": 3, "-1,1": 0, "20,22": 42}))
    os.chmod(ANSWERS, 0o644)
    unix = _listener(socket.AF_UNIX, str(UNIX_SOCKET))
    os.chmod(UNIX_SOCKET, 0o777)
    abstract = _listener(socket.AF_UNIX, ABSTRACT_SOCKET)
    tcp = _listener(socket.AF_INET, ("127.0.0.1", 0))
    marker = subprocess.Popen(["sh", "-c", "sleep 60; :", MARKER])
    old_env = os.environ.get("GRPOLAB_TEST_SECRET")
    os.environ["GRPOLAB_TEST_SECRET"] = SECRET
    try:
        yield {"listeners": (unix, abstract, tcp), "marker": marker}
    finally:
        os.environ.pop("GRPOLAB_TEST_SECRET") if old_env is None else os.environ.update(GRPOLAB_TEST_SECRET=old_env)
        marker.kill()
        marker.wait()
        for server in (unix, abstract, tcp):
            server.close()
        UNIX_SOCKET.unlink(missing_ok=True)
        ANSWERS.unlink(missing_ok=True)
        shutil.rmtree(SENTINEL_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def reward():
    kwargs = {"timeout_s": 1.0, "memory_mb": 256, "max_output_bytes": 4096, "workers": 4}
    return build_reward("code_tests", kwargs=kwargs).reward


@pytest.fixture(scope="module")
def scores(reward, host) -> dict[str, float]:
    names = sorted(CASES)
    example = Example("add two numbers", meta={"tests": TESTS})
    start = time.monotonic()
    got = reward([Completion(f"```python\n{CASES[name]}\n```", 10) for name in names], [example] * len(names))
    assert time.monotonic() - start < 1.5 * len(names) / 4 + 10  # each bounded by the time limit
    return dict(zip(names, got, strict=True))


def test_a_benign_solution_passes(reward):
    example = Example("add two numbers", meta={"tests": TESTS})
    got = reward([Completion(f"```python\n{c}\n```", 5) for c in (ADD, attack("ok = True"))], [example] * 2)
    assert got == [1.0, 1.0]  # the harness itself is not what fails the hostile cases


def test_enough_hostile_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_code_scores_zero(reward, scores, name):
    if name in ESCAPES and "newroot" not in reward.isolation:
        pytest.skip(f"no namespaces here ({reward.isolation}): see test_sandbox_nonroot.py")
    assert scores[name] == 0.0


def test_the_host_is_unchanged(reward, scores, host):
    """Files, sockets and processes the cases above aimed at."""
    assert (SENTINEL_DIR / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in SENTINEL_DIR.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in TMP.glob(f"*{TOKEN}*")) == sorted(
        p.name for p in (SENTINEL_DIR, ANSWERS, UNIX_SOCKET)
    )  # nothing escaped, was pwned or was filled
    for server in host["listeners"]:
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection ever reached it
    assert host["marker"].poll() is None  # not killed
    assert _harness_processes() == []  # nothing left running
    with socket.create_connection(host["listeners"][2].getsockname(), timeout=1):  # the listener does work
        pass
    time.sleep(0.05)
    host["listeners"][2].accept()[0].close()


def test_a_huge_program_output_is_cut_and_fails(reward):
    example = Example("print x", meta={"tests": [{"input": "", "output": "x"}]})
    flood = Completion("```python\nwhile True:\n    print('x')\n```", 5)
    fine = Completion("```python\nprint('x')\n```", 5)
    start = time.monotonic()
    assert reward([flood, fine], [example] * 2) == [0.0, 1.0]
    assert time.monotonic() - start < 5


def test_the_fallback_network_guard_refuses_sockets():
    """Without namespaces (no root, no user namespaces) only this Python-level guard stands."""
    code = (
        f"import runpy, socket\nrunpy.run_path({str(HARNESS)!r})['_guard_network']()\n"
        "for attempt in (lambda: socket.socket(), lambda: socket.create_connection(('127.0.0.1', 9))):\n"
        "    try:\n        attempt()\n        raise SystemExit('a socket was made')\n"
        "    except PermissionError:\n        pass\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
