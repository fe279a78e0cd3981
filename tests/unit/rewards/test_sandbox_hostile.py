"""Hostile completions for the code_tests reward: each scores 0 and leaves this machine as it was.

Every case would score > 0 only if its attack worked (the function the tests call is defined only
after the attack succeeds, or the attack tries to forge the verdict), and the tests it is scored on
have three different answers, so no constant can pass them. All cases run in one batch (a few
sandboxes at once), with a 1 s time limit each; then the host is checked: its files, its sockets
(a unix socket in /tmp with mode 777, an abstract one, a TCP listener), a process holding a marker
in its command line, and sandbox processes left running. The full set of namespaces needs root or
user namespaces; where neither is available the file, socket and process cases are skipped (see
test_unprivileged_trainer for what that fallback does and does not contain). Run as root, the
suite also runs a batch as uid 65534 (test_unprivileged_trainer): once with user namespaces, once
with them refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grpolab.rewards import build_reward
from grpolab.sandbox.runner import HARNESS, NOBODY
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
        "if '_encode' in f.f_globals:\n    f.f_globals['_encode'] = lambda value, depth=0: value"
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
    marker = subprocess.Popen(["sh", "-c", "sleep 600; :", MARKER], start_new_session=True)
    old_env = os.environ.get("GRPOLAB_TEST_SECRET")
    os.environ["GRPOLAB_TEST_SECRET"] = SECRET
    try:
        yield {"listeners": (unix, abstract, tcp), "marker": marker}
    finally:
        os.environ.pop("GRPOLAB_TEST_SECRET") if old_env is None else os.environ.update(GRPOLAB_TEST_SECRET=old_env)
        os.killpg(marker.pid, 9)  # the shell and its sleep
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
        pytest.skip(f"no namespaces here ({reward.isolation}): see test_unprivileged_trainer")
    assert scores[name] == 0.0


# Run the reward as an unprivileged user. Expected scores there, per mode; None: not run in that mode.
# userns: the same namespaces as root, in a user namespace. fallback (user namespaces refused): only
# the rlimits, the clean environment and the socket guard, so what the trainer's user can read, it
# reads (the known limits listed in grpolab.sandbox.runner); scores are still decided outside it.
UNPRIVILEGED = {
    "correct": (ADD, 1.0, 1.0),
    "correct, dataclass": ("from dataclasses import dataclass\n@dataclass\nclass P:\n    a: int\n"
                           "def add(a, b):\n    return P(a).a + b", 1.0, 1.0),
    "override builtins.exec": (FORGERY["override builtins.exec"], 0.0, 0.0),
    "always-equal __eq__": (FORGERY["always-equal __eq__"], 0.0, 0.0),
    "patch the harness to send code as a value": (FORGERY["patch the harness to send code as a value"], 0.0, 0.0),
    "infinite loop": (RESOURCES["infinite loop"], 0.0, 0.0),
    "fork bomb": (RESOURCES["fork bomb"], 0.0, 0.0),
    "360 MB in 15 MB files": (RESOURCES["360 MB in 15 MB files"], 0.0, None),  # no disk quota in the fallback
    "environment secret": (ESCAPES["environment secret"], 0.0, 0.0),
    "host unix socket": (ESCAPES["host unix socket"], 0.0, 0.0),  # the guard stops socket.socket
    "world-readable answers file": (ESCAPES["world-readable answers file"], 0.0, 1.0),
    "find other processes": (ESCAPES["find other processes"], 0.0, 1.0),
    "own user namespace (to mount a bigger tmpfs)": (ESCAPES["own user namespace (to mount a bigger tmpfs)"], 0.0, 0.0),
}  # fmt: skip


def _libc_call(libc, name: str, *args) -> None:
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _readable_interpreter(libc) -> None:
    """In a private mount namespace, make the interpreter's folder reachable by every user.

    A pyenv Python under /root (mode 700) is what this machine has: a tmpfs over the first folder
    others cannot enter, holding only the path down to the interpreter, bind-mounted back.
    """
    _libc_call(libc, "unshare", 0x00020000)
    _libc_call(libc, "mount", None, b"/", None, 16384 | (1 << 18), None)  # MS_REC | MS_PRIVATE
    prefix = Path(sys.base_prefix).resolve()
    closed = next((p for p in reversed(prefix.parents) if not os.stat(p).st_mode & 0o001), None)
    if closed is None:
        return
    view = tempfile.mkdtemp()
    _libc_call(libc, "mount", bytes(prefix), view.encode(), None, 4096, None)  # MS_BIND
    _libc_call(libc, "mount", b"tmpfs", bytes(closed), b"tmpfs", 0, b"mode=755")
    prefix.mkdir(parents=True)
    _libc_call(libc, "mount", view.encode(), bytes(prefix), None, 4096, None)


def _score_unprivileged(mode: str) -> dict:
    """Fork; the child drops to uid 65534 (and, for ``fallback``, loses namespaces), builds and runs the reward."""
    names = [name for name, row in UNPRIVILEGED.items() if row[1 if mode == "userns" else 2] is not None]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        os.close(read)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _readable_interpreter(libc)
            if mode == "fallback":  # the harness's filter refuses unshare: no namespaces from here on
                _libc_call(libc, "prctl", 38, 1, 0, 0, 0)
                runpy.run_path(str(HARNESS))["_seccomp"](libc)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            kwargs = {"timeout_s": 1.0, "memory_mb": 256, "max_output_bytes": 4096, "workers": 4}
            reward = build_reward("code_tests", kwargs=kwargs).reward
            example = Example("add two numbers", meta={"tests": TESTS})
            got = reward([Completion(f"```python\n{UNPRIVILEGED[n][0]}\n```", 5) for n in names], [example] * len(names))
            report = {"isolation": reward.isolation, "uid": os.getuid(), "scores": dict(zip(names, got, strict=True))}
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            report = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="run as root to drop to an unprivileged uid (unprivileged, every test is this)")
@pytest.mark.parametrize("mode", ["userns", "fallback"])
def test_unprivileged_trainer(host, mode):
    report = _score_unprivileged(mode)
    assert "error" not in report, report.get("error")
    assert report["uid"] == NOBODY
    if mode == "userns":
        assert report["isolation"] == "userns+pidns+netns+mountns+newroot+tmpfs+seccomp"
    else:
        assert report["isolation"] == "pynet+seccomp"
    column = 1 if mode == "userns" else 2
    expected = {name: row[column] for name, row in UNPRIVILEGED.items() if row[column] is not None}
    assert report["scores"] == expected


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
