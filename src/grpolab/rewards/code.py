"""The code-execution reward: run the completion's program against the example's tests, in a sandbox.

Registry key ``code_tests``; kwargs ``timeout_s``, ``memory_mb``, ``file_size_mb``,
``max_output_bytes`` (see sandbox.SandboxLimits), ``workers`` (sandboxes run at once) and
``all_or_nothing``. The reward is the fraction of tests passed (1 or 0 with ``all_or_nothing``).

The code is the last fenced block (```python, ```py or a bare ```) after the reasoning (after the last
``</think>``); without one, the content of the last ``<answer>...</answer>`` block. A completion with
neither scores 0 without running anything.

The tests are ``example.meta["tests"]`` (a JSONL row's fields are under ``meta["row"]``, so a
``"tests"`` field of the row works too), in one of two formats:

* a list of strings, each Python code, usually one ``assert``: the code is executed once as module
  ``solution`` (its ``if __name__ == "__main__":`` block does not run), then every test in its
  namespace; a test passes if it does not raise. E.g. ``["assert add(1, 2) == 3"]``.
* a list of ``{"input": str, "output": str}``: the code runs as a program (``__main__``) once per
  case, with ``input`` as stdin; it passes if it exits with status 0 and its stdout equals
  ``output``, ignoring trailing whitespace on each line and trailing blank lines.

A missing or malformed ``tests`` field is an error naming the example (found by the dry run before
training starts). The sandbox and what it enforces are described in grpolab.rewards.sandbox.

Runs are independent processes, so ``workers`` > 1 runs several at once; they then share uid 65534,
and a completion that signals every process it may (``os.kill(-1, 9)``) can fail its batch-mates'
runs. The default, 1, rules that out.

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
from grpolab.rewards.rules import extract_answer_tag, final_region
from grpolab.rewards.sandbox import SandboxLimits, run_python
from grpolab.types import Completion, Example

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
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


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


class CodeTests:
    """Batched reward: fraction of ``read_tests(example)`` the completion's code passes, in a sandbox."""

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
    ) -> None:
        self.limits = SandboxLimits(timeout_s, memory_mb, file_size_mb, max_output_bytes)
        if workers < 1:
            raise ValueError(f"code_tests: workers must be >= 1, got {workers}")
        self.workers = workers
        self.all_or_nothing = all_or_nothing
        self.name = name
        self.isolation = ""
        """What the sandbox enforces here, from a probe run at construction."""

    def probe(self) -> str:
        """Run a trivial program; raise RewardError if the sandbox cannot run Python on this machine."""
        result = run_python(
            "import collections, json, math, re",
            mode="asserts",
            limits=self.limits,
            tests=["assert math.sqrt(4) == 2"],
        )
        if result.passed != {0}:
            raise RewardError(
                f"code_tests: a trivial program failed in the sandbox (exit status {result.returncode}, "
                f"isolation {result.isolation or 'none'}, timed out: {result.timed_out}); the sandboxed "
                "interpreter may not be able to read its standard library. Raise timeout_s, or run as root."
            )
        self.isolation = result.isolation
        return result.isolation

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]:
        jobs = []
        for i, (completion, example) in enumerate(zip(completions, examples, strict=True)):
            try:
                tests = read_tests(example)
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
        if isinstance(tests[0], str):
            passed = len(run_python(code, mode="asserts", limits=self.limits, tests=tests).passed)
        else:
            passed = sum(self._passes_io(code, case) for case in tests)
        if self.all_or_nothing:
            return float(passed == len(tests))
        return passed / len(tests)

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
) -> CodeTests:
    """The ``code_tests`` reward, after checking that its sandbox works here."""
    reward = CodeTests(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        file_size_mb=file_size_mb,
        max_output_bytes=max_output_bytes,
        workers=workers,
        all_or_nothing=all_or_nothing,
    )
    isolation = reward.probe()
    if not isolation.startswith("uid"):
        log.warning(
            "code_tests: not running as root, so the sandbox runs code as this user (%s): it cannot stop "
            "that code from signalling or reading this user's processes and files; see grpolab.rewards.sandbox",
            isolation,
        )
    return reward
