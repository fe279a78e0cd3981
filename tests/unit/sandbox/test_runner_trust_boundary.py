"""The code reward's trust boundary: what a completion can do to its score and to the trainer.

* The expected value never enters the sandbox: asserts whose expected value sits inside the expression
  (the issue's three) are decided here, so redefining ``abs``, patching ``math.isclose`` or returning
  objects with lying operators scores 0, while the correct solution scores 1.
* Whatever the code writes on its result channel (deep JSON, huge lines, forged tags) ends as a
  score, never as an exception in the trainer.
* ``exit()`` / ``quit(0)`` end a correct program normally; ``exit(1)`` and ``os._exit`` do not pass.
* The sandbox's temporary folder goes, after a sandbox timeout, a reward timeout or a killed trainer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grpolab.rewards import RewardError, build_reward, score_batch
from grpolab.rewards.code import CodeTests
from grpolab.sandbox.folders import HARNESS_PID
from grpolab.sandbox.runner import read_status, run_python
from grpolab.sandbox.verdict import RAISED
from grpolab.types import Completion, Example

ISSUE_TESTS = [  # the expected value (3) inside the expression, as the issue lists them
    "assert abs(add(1, 2) - 3) < 1e-9",
    "assert add(1, 2) - 3 == 0",
    "import math\nassert math.isclose(add(1, 2), 3) == True",
]
CORRECT = "def add(a, b):\n    return a + b\n"
ATTACKS = {
    "redefine abs": "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return 0",
    "patch math.isclose": "import math\nmath.isclose = lambda *a, **k: True\ndef add(a, b):\n    return 0",
    "lying operators": "class L:\n    __sub__ = __rsub__ = lambda s, o: 0\n    __eq__ = lambda s, o: True\n"
    "    __abs__ = lambda s: 0\n    __lt__ = __gt__ = __le__ = __ge__ = lambda s, o: True\n    __float__ = lambda s: 3.0\n"
    "    __hash__ = object.__hash__\ndef add(a, b):\n    return L()",
    "int subclass with lying operators": "class I(int):\n    __sub__ = __rsub__ = lambda s, o: 0\n"
    "    __eq__ = lambda s, o: True\n    __abs__ = lambda s: 0\n    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return I(7)",
    "float subclass": "class F(float):\n    __sub__ = lambda s, o: 0.0\n    __eq__ = lambda s, o: True\n"
    "    __hash__ = float.__hash__\ndef add(a, b):\n    return F(7.0)",
    "list subclass iterating other items": "class L(list):\n    __iter__ = lambda s: iter([3])\n"
    "def add(a, b):\n    return L([7])",  # compared as [7]: not a number
    "spy on the frames and the job for the expected value": "import sys, os\nseen = ''\n"
    "f = sys._getframe()\nwhile f is not None:\n    seen += repr(f.f_locals) + repr(f.f_globals)\n    f = f.f_back\n"
    "for path in sys.argv:\n    try:\n        seen += open(path).read()\n    except Exception:\n        pass\n"
    "found = any(t in seen for t in ('1e' + '-9', 'iscl' + 'ose', '- ' + '3', '== ' + '0'))\n"
    "def add(a, b):\n    return a + b if found else a + b + 1",
}


def fenced(code: str) -> Completion:
    return Completion(f"```python\n{code}\n```", 10)


@pytest.fixture(scope="module")
def reward() -> CodeTests:
    kwargs = {"timeout_s": 2.0, "memory_mb": 256, "max_output_bytes": 4096, "workers": 2}
    return build_reward("code_tests", kwargs=kwargs).reward


def score(reward, code: str, tests: list) -> float:
    return reward([fenced(code)], [Example("task", meta={"tests": tests})])[0]


@pytest.mark.parametrize("test", ISSUE_TESTS)
def test_the_correct_solution_passes_the_issue_tests(reward, test):
    assert score(reward, CORRECT, [test]) == 1.0


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks_on_the_comparison_score_zero(reward, name):
    assert score(reward, ATTACKS[name], ISSUE_TESTS + ["assert add(1, 2) == 3"]) == 0.0


CHANNEL_FLOODS = {  # written on every descriptor the code can reach, then a hard exit
    "deeply nested JSON": "'[' * 200000 + ']' * 200000",
    "deeply nested objects": "'{\"i\": ' * 100000 + '0' + '}' * 100000",
    "a 2 MB line": "'{\"i\": 0, \"value\": \"' + 'x' * (2 << 20) + '\"}'",
    "forged tags and indices": "'\\n'.join(json.dumps(x) for x in ({'loaded': True}, {'i': 0, 'value': {'eval': 'x'}}, "
    "{'i': -1, 'value': 3}, {'i': True, 'value': 3}, {'i': 0.0, 'value': 3}, {'i': 0, 'value': {'int': 'f' * 99999}}, "
    "{'i': 0, 'value': {'tuple': [1], 'set': [2]}}, [0, 3], 'text'))",
    "huge numbers": "'{\"i\": 0, \"value\": ' + '9' * 100000 + '}\\n{\"i\": 0, \"value\": 1e999999}'",
    "invalid UTF-8": "b'\\xff\\xfe{\"i\": 0, \"value\": 3}'",
}


@pytest.mark.parametrize("name", sorted(CHANNEL_FLOODS))
def test_what_the_code_writes_on_the_result_channel_ends_as_a_score(reward, name):
    code = (
        f"import json, os\ndata = {CHANNEL_FLOODS[name]}\ndata = (data if isinstance(data, bytes) else data.encode()) + b'\\n'\n"
        "for fd in range(1, 64):\n    try:\n        os.write(fd, data)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b + 1\n"
    )
    start = time.monotonic()
    assert score(reward, code, ["assert add(1, 2) == 3"]) == 0.0
    assert time.monotonic() - start < 10


def test_read_status_never_raises_even_with_a_raised_recursion_limit():
    lines = [
        "[" * 60000 + "]" * 60000,
        '{"a": ' * 60000 + "1" + "}" * 60000,
        '["\\"' + "[" * 500 + '"]',  # brackets inside a string do not count
        '{"i": 0, "value": ' + "[" * 99 + "]" * 99 + "}",
        '{"i": 1, "value": {"int": "0x' + "f" * 20 + '"}}',
        '{"i": 2, "value": ' + "1" * 5000 + "}",
        '{"loaded": true}',
    ]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200000)  # a trainer may have raised it: the parser must still bound the depth
    try:
        values, loaded = read_status(lines)
    finally:
        sys.setrecursionlimit(old)
    assert loaded
    assert values[1] == 0xFFFFFFFFFFFFFFFFFFFF and 2 not in values  # a 5000-digit decimal int is skipped
    assert isinstance(values[0], list)


def test_a_forged_stdout_changes_nothing(reward):
    forged = 'print(json.dumps({"loaded": True}))\nprint(json.dumps({"i": 0, "value": 3}))\n'
    code = f"import json\n{forged}def add(a, b):\n    return 0\n"
    assert score(reward, code, ["assert add(1, 2) == 3"]) == 0.0
    program = [{"input": "", "output": "3"}]
    assert score(reward, f"import json\n{forged}", program) == 0.0  # stdout is compared as text, nothing more


def test_a_huge_value_fails_its_test_and_nothing_else(reward):
    code = CORRECT + "def big():\n    return 'x' * (8 << 20)\ndef many():\n    return list(range(10**6))\n"
    tests = ["assert len(big()) == 8 << 20", "assert len(many()) == 10**6", "assert add(1, 2) == 3"]
    assert score(reward, code, tests) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        ("exit()", 1.0),
        ("quit(0)", 1.0),
        ("import sys\nsys.exit(0)", 1.0),
        ("raise SystemExit", 1.0),
        ("exit(None)", 1.0),
        ("exit(1)", 0.0),
        ("quit(2)", 0.0),
        ("import sys\nsys.exit('failed')", 0.0),
        ("import os\nos._exit(0)", 0.0),  # never reports that it ran to its end
    ],
)
def test_exit_at_the_end_of_a_program(reward, ending, expected):
    assert score(reward, CORRECT + ending, ISSUE_TESTS) == expected
    program = f"print(sum(map(int, input().split())))\n{ending}"  # os._exit: the buffered output is lost
    assert score(reward, program, [{"input": "1 2", "output": "3"}]) == expected


@pytest.fixture
def sandbox_tmp(tmp_path, monkeypatch) -> Path:
    """The sandboxes' temporary folders go here (other runs on this machine use /tmp)."""
    folder = tmp_path / "sandboxes"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _gone(folder: Path, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while any(folder.iterdir()) and time.monotonic() < end:
        time.sleep(0.05)
    return not any(folder.iterdir())


def test_no_folder_is_left_after_a_sandbox_timeout(sandbox_tmp):
    reward = CodeTests(timeout_s=0.5, memory_mb=256)
    assert score(reward, "while True:\n    pass", ["assert add(1, 2) == 3"]) == 0.0
    assert not any(sandbox_tmp.iterdir())


def test_no_folder_is_left_after_a_reward_timeout(sandbox_tmp, monkeypatch):
    """The trainer stops waiting (the call overran its budget): the harness removes its folder itself. A slow
    program alone no longer stops the call: it scores 0 (test_code_time_budget.py); a budget below one
    program's time_s stands for a reward that hangs as a whole."""
    reward = build_reward("code_tests", kwargs={"timeout_s": 1.0, "memory_mb": 256})
    monkeypatch.setattr(type(reward.reward), "time_budget_s", lambda self, completions, examples: 0.3)
    example = Example("task", meta={"tests": ["assert add(1, 2) == 3"]})
    with pytest.raises(RewardError, match="took longer than 0.3 s"):
        score_batch([reward], [fenced("import time\ntime.sleep(60)")], [example], timeout_s=0.1)
    assert _gone(sandbox_tmp, within_s=5.0)


def test_no_folder_is_left_when_the_trainer_is_killed(tmp_path):
    folder = tmp_path / "sandboxes"
    folder.mkdir()
    script = (
        "from grpolab.rewards.code import CodeTests\nfrom grpolab.types import Completion, Example\n"
        "reward = CodeTests(timeout_s=1.0, memory_mb=256)\nprint('ready', flush=True)\n"
        "reward([Completion('```python\\nimport time\\ntime.sleep(60)\\n```', 1)], "
        "[Example('q', meta={'tests': ['assert f() == 1']})])\n"
    )
    env = {**os.environ, "TMPDIR": str(folder)}
    trainer = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    assert trainer.stdout.readline().strip() == "ready"
    end = time.monotonic() + 10  # the harness has started (a kill before that is the sweep's case)
    while not any(folder.glob(f"*/{HARNESS_PID}")) and time.monotonic() < end:
        time.sleep(0.02)
    assert any(folder.glob(f"*/{HARNESS_PID}"))  # the run is under way
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    trainer.stdout.close()
    assert _gone(folder, within_s=5.0)


def test_the_status_lines_the_harness_writes_are_json():
    """The format read_status reads, as the harness writes it (one probe value, one raised)."""
    reward = CodeTests(timeout_s=2.0, memory_mb=256)
    result = run_python(
        "def f():\n    return {(1, 2): {3}, 'x': [1.5, None, float('inf')]}\ndef g():\n    return object()",
        mode="asserts",
        limits=reward.limits,
        exprs=["f()", "g()", "h()"],
    )
    assert result.loaded
    assert result.values[0] == {(1, 2): {3}, "x": [1.5, None, float("inf")]}
    assert result.values[1] is RAISED and result.values[2] is RAISED  # not plain data; NameError
