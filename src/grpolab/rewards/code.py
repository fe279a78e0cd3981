"""The code-execution reward: run the completion's program against the example's tests, in a sandbox.

Registry key ``code_tests``; kwargs ``timeout_s``, ``memory_mb``, ``file_size_mb``,
``max_output_bytes``, ``disk_mb`` (see sandbox.SandboxLimits), ``workers`` (sandboxes run at once)
and ``all_or_nothing``. The reward is the fraction of tests passed (1 or 0 with ``all_or_nothing``).

The code is the last fenced block (```python, ```py or a bare ```) after the reasoning (after the last
``</think>``); without one, the content of the last ``<answer>...</answer>`` block. A completion with
neither scores 0 without running anything.

The tests are ``example.meta["tests"]`` (a JSONL row's fields are under ``meta["row"]``, so a
``"tests"`` field of the row works too), in one of two formats:

* a list of strings, each one or more ``assert`` statements, e.g. ``["assert add(1, 2) == 3"]``
  or ``["assert abs(area(2) - 12.566) < 1e-3"]``: each is split (grpolab.sandbox.checks) into
  the calls under test (``add(1, 2)``, ``area(2)``) and the rest of the assert. The code is executed
  once as module ``solution`` (its ``if __name__ == "__main__":`` block does not run; ``exit()`` or
  ``sys.exit(0)`` ends it as its last line would), then every call under test in its namespace; the
  sandbox sends back their values as plain data and this process evaluates the rest of each assert
  on them (grpolab.sandbox.verdict). Expected values, ``abs``, ``math.isclose`` and the
  comparisons never enter the sandbox; a value that is not plain data fails its test.
* a list of ``{"input": str, "output": str}``: the code runs as a program (``__main__``) once per
  case, with ``input`` as stdin; it passes if it exits with status 0 and its stdout equals
  ``output``, ignoring trailing whitespace on each line and trailing blank lines.

A missing or malformed ``tests`` field, or an assert that cannot be split that way, is an error
naming the example (found by the dry run before training starts). The sandbox and what it enforces
are described in grpolab.sandbox.runner.

Runs are independent processes, so ``workers`` > 1 runs several at once; each has its own PID
namespace, so none can signal another (without namespaces, in the fallback, ``os.kill(-1, 9)`` from
one run could fail its batch-mates': keep ``workers`` at 1 there).

Time budget: a batch of N completions can take up to about N x (timeout_s + 0.5) / workers seconds
(times the number of cases for stdin/stdout tests) when every program hangs, and the whole call
must fit in reward.timeout_s (default 60 s): raise it, or ``workers``, for large batches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpolab.rewards.base import RewardError, SampleError
from grpolab.sandbox.checks import RAISED, AssertTest, split_test
from grpolab.rewards.rules import extract_answer_tag, final_region
from grpolab.sandbox.runner import SandboxError, SandboxLimits, run_python
from grpolab.types import Completion, Example

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
PROBE_MODULES = (
    "typing", "dataclasses", "collections", "collections.abc", "itertools", "functools", "operator", "math",
    "cmath", "re", "heapq", "bisect", "json", "string", "fractions", "decimal", "random", "statistics",
    "datetime", "copy", "enum", "array", "struct", "textwrap", "unicodedata", "hashlib", "zlib", "io", "abc",
    "contextlib", "numbers", "time",
)  # fmt: skip
"""Imported by the start-up probe, in the sandbox, as the sandbox's user."""
_FORMAT_HELP = (
    "give meta['tests'] as a list of assert statements, e.g. [\"assert add(1, 2) == 3\"], or a list of "
    "{'input': stdin text, 'output': expected stdout} objects"
)


def extract_code(text: str) -> str | None:
    """The last fenced code block after the reasoning, else the last <answer> block's content, else None."""
    region = final_region(text)
    blocks = _FENCE.findall(region)
    if blocks:
        return blocks[-1]
    answer = extract_answer_tag(text)
    return answer or None


def read_tests(example: Example) -> list[str] | list[dict[str, str]]:
    """The example's tests, checked for one of the two formats (module docstring)."""
    meta = example.meta
    tests = meta.get("tests")
    if tests is None and isinstance(meta.get("row"), Mapping):
        tests = meta["row"].get("tests")
    if tests is None:
        raise ValueError(f"the example has no 'tests' (its meta keys: {sorted(meta)}); {_FORMAT_HELP}")
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, Sequence) or not tests:
        raise ValueError(f"'tests' is {tests!r}, not a non-empty list; {_FORMAT_HELP}")
    if all(isinstance(t, str) for t in tests):
        return list(tests)
    pairs = all(
        isinstance(t, Mapping) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
        for t in tests
    )
    if not pairs:
        raise ValueError(f"'tests' mixes or misshapes its items (first: {tests[0]!r}); {_FORMAT_HELP}")
    return [{"input": t["input"], "output": t["output"]} for t in tests]


def _checks(tests: list[str] | list[dict[str, str]]) -> list[AssertTest] | list[dict[str, str]]:
    if tests and isinstance(tests[0], str):
        return [split_test(test, i) for i, test in enumerate(tests)]  # type: ignore[arg-type]
    return tests  # type: ignore[return-value]


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


class CodeTests:
    """Batched reward: fraction of ``read_tests(example)`` the completion's code passes, in a sandbox."""

    in_process = True
    """Runs in the trainer even with a timeout (rewards.timeouts): each sandbox is killed at its own deadline, and
    the trainer only waits on them (without the GIL)."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        file_size_mb: int = 16,
        max_output_bytes: int = 1 << 16,
        workers: int = 1,
        all_or_nothing: bool = False,
        name: str = "code_tests",
        disk_mb: int = 64,
    ) -> None:
        self.limits = SandboxLimits(timeout_s, memory_mb, file_size_mb, max_output_bytes, disk_mb)
        if workers < 1:
            raise ValueError(f"code_tests: workers must be >= 1, got {workers}")
        self.workers = workers
        self.all_or_nothing = all_or_nothing
        self.name = name
        self.isolation = ""
        """What the sandbox enforces here, from a probe run at construction."""

    def probe(self) -> str:
        """Import a wide stdlib set in the sandbox; raise RewardError if that fails on this machine."""
        code = f"import importlib\nfailed = []\nfor m in {list(PROBE_MODULES)!r}:\n    try:\n" + (
            "        importlib.import_module(m)\n    except BaseException:\n        failed.append(m)\n"
        )
        try:
            result = run_python(code, mode="asserts", limits=self.limits, exprs=["failed"])
        except SandboxError as err:
            raise RewardError(f"code_tests: the sandbox does not work here: {err}") from err
        if result.values.get(0) != []:
            raise RewardError(
                f"code_tests: the sandbox does not work here: it could not import the standard library (failed: "
                f"{result.values.get(0) or 'unknown, nothing came back'}; exit status {result.returncode}, "
                f"isolation {result.isolation or 'none'}, timed out: {result.timed_out}). The sandboxed "
                "interpreter may not be able to read its standard library: raise timeout_s or memory_mb, "
                "or run as root."
            )
        self.isolation = result.isolation
        return result.isolation

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]:
        jobs = []
        for i, (completion, example) in enumerate(zip(completions, examples, strict=True)):
            try:
                tests = _checks(read_tests(example))
            except ValueError as exc:
                raise SampleError(self.name, i, example, exc) from exc
            jobs.append((extract_code(completion.text), tests))
        if self.workers == 1 or len(jobs) < 2:
            return [self._score(code, tests) for code, tests in jobs]
        with ThreadPoolExecutor(self.workers, thread_name_prefix="code-tests") as pool:
            return list(pool.map(lambda job: self._score(*job), jobs))

    def _score(self, code: str | None, tests: list[Any]) -> float:
        if code is None:
            return 0.0
        if isinstance(tests[0], AssertTest):
            passed = self._passes_asserts(code, tests)
        else:
            passed = sum(self._passes_io(code, case) for case in tests)
        if self.all_or_nothing:
            return float(passed == len(tests))
        return passed / len(tests)

    def _passes_asserts(self, code: str, tests: list[AssertTest]) -> int:
        exprs = [probe for test in tests for probe in test.probes]
        result = run_python(code, mode="asserts", limits=self.limits, exprs=exprs)
        if not result.loaded:
            return 0
        values = [result.values.get(k, RAISED) for k in range(len(exprs))]
        passed = k = 0
        for test in tests:
            passed += test.passes(values[k : k + len(test.probes)])
            k += len(test.probes)
        return passed

    def _passes_io(self, code: str, case: Mapping[str, str]) -> bool:
        result = run_python(code, mode="program", limits=self.limits, stdin=case["input"])
        if not result.clean_exit:
            return False
        return _normalise(result.stdout.decode("utf-8", "replace")) == _normalise(case["output"])


def make_code_tests(
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    file_size_mb: int = 16,
    max_output_bytes: int = 1 << 16,
    workers: int = 1,
    all_or_nothing: bool = False,
    disk_mb: int = 64,
) -> CodeTests:
    """The ``code_tests`` reward, after checking that its sandbox works here."""
    reward = CodeTests(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        file_size_mb=file_size_mb,
        max_output_bytes=max_output_bytes,
        workers=workers,
        all_or_nothing=all_or_nothing,
        disk_mb=disk_mb,
    )
    isolation = reward.probe()
    if "newroot" not in isolation:
        log.warning(
            "code_tests: no namespaces here (not root, and user namespaces are refused), so the sandbox runs "
            "code as this user (%s): it cannot stop that code from reading this user's files or signalling "
            "this user's processes (scores are still decided outside it); see grpolab.sandbox.runner",
            isolation,
        )
    return reward
