"""A tool-using environment, and the built-in tools: a calculator and Python in the sandbox.

``ToolEnv`` reads tool calls from the model's turn, runs them (bounded: envs.base.run_tool) and sends
the results back as ``role="tool"`` messages; a turn without a call is the final answer, graded by
``check(answer_text, example) -> float`` (the verdict stays outside any sandbox). The reward is that
grade, given once, when the episode ends; an episode that never answers has no env reward.

Call formats (``call_format``):
* ``"hermes"``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the format Qwen2.5/3,
  Hermes and most open tool-calling chat templates teach (several calls in one turn are run in order).
* ``"python"``: the whole turn is ``name(argument)``, one call with the tool's first parameter as a
  string; for tiny vocabularies that cannot spell JSON (the agent demo's character model).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

from grpolab.envs.base import EnvStep, Message, Tool, ToolLimits, run_tool
from grpolab.types import Example

CheckFn = Callable[[str, Example], float]
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PYTHON_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_calls(text: str, call_format: Literal["hermes", "python"]) -> list[tuple[str, Any]] | None:
    """The (name, arguments) calls in a model turn; None when it makes no call (a final answer).
    A call that cannot be read gives ``("", error text)``: the model is told, not the run."""
    if call_format == "python":
        m = _PYTHON_CALL.match(text)
        return None if m is None else [(m.group(1), m.group(2))]
    blocks = _HERMES.findall(text)
    if not blocks:
        return None
    calls: list[tuple[str, Any]] = []
    for block in blocks:
        try:
            call = json.loads(block)
            calls.append((str(call["name"]), dict(call.get("arguments") or {})))
        except (ValueError, KeyError, TypeError) as exc:
            calls.append(("", f"error: the tool call is not JSON with a name and arguments ({exc})"))
    return calls


def numeric_match(text: str, example: Example) -> float:
    """1.0 when the last number in ``text`` equals the reference answer's (within 1e-6), else 0.0."""
    found = _NUMBER.findall(text)
    if not found or example.answer is None:
        return 0.0
    try:
        return float(math.isclose(float(found[-1]), float(example.answer), rel_tol=0, abs_tol=1e-6))
    except ValueError:
        return 0.0


class ToolEnv:
    """Implements ``grpolab.envs.Environment``: tool calls until a final answer, graded by ``check``."""

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        check: CheckFn = numeric_match,
        call_format: Literal["hermes", "python"] = "hermes",
        limits: ToolLimits | None = None,
        system_prompt: str | None = None,
        tools_enabled: bool = True,
    ) -> None:
        """``tools_enabled=False``: the tools are still declared but every call answers an error (the
        "without the tool" contrast of the agent demo)."""
        self._by_name = {t.name: t for t in tools}
        self.tools = [t.schema for t in tools]
        self.check = check
        self.call_format = call_format
        self.limits = limits or ToolLimits()
        self.system_prompt = system_prompt
        self.tools_enabled = tools_enabled
        self.example: Example | None = None

    def reset(self, example: Example) -> list[Message]:
        self.example = example
        if example.messages is not None:
            return [dict(m) for m in example.messages]
        first = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*first, {"role": "user", "content": example.prompt}]

    async def step(self, model_turn: str) -> EnvStep:
        calls = parse_calls(model_turn, self.call_format)
        if calls is None:
            return EnvStep(reward=float(self.check(model_turn, self.example)), done=True)
        messages, errors = [], 0
        for name, arguments in calls:
            if not name:  # unreadable call
                result_text, failed = str(arguments), True
            elif not self.tools_enabled:
                result_text, failed = "error: tools are disabled", True
            else:
                tool = self._by_name.get(name)
                args = arguments if isinstance(arguments, dict) else _first_argument(tool, arguments)
                result = await run_tool(tool, args, self.limits)
                result_text, failed = result.text, result.error is not None
            errors += failed
            messages.append({"role": "tool", "name": name or "error", "content": result_text})
            if failed and self.limits.on_error == "end":
                return EnvStep(reward=0.0, done=True, tool_calls=len(messages), tool_errors=errors)
        return EnvStep(messages, tool_calls=len(messages), tool_errors=errors)


def _first_argument(tool: Tool | None, value: str) -> dict[str, Any]:
    """``name(text)`` calls: the text as the tool's first parameter."""
    if tool is None:
        return {}
    params = list(tool.schema["function"]["parameters"].get("properties", {}))
    return {params[0]: value} if params else {}


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: The expression, e.g. "123*456 + 7".
    """
    with warnings.catch_warnings():  # "0123" parses with a SyntaxWarning first: the error is the answer
        warnings.simplefilter("ignore", SyntaxWarning)
        tree = ast.parse(expression.strip(), mode="eval")
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("exponent too large (|b| <= 64, |a| <= 10**6)")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512) -> Tool:
    """A tool that runs a Python program in grpolab's sandbox (rewards/sandbox.py) and returns what it
    printed, with the exit status when it failed."""
    from grpolab.sandbox.runner import SandboxLimits, run_python

    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)

    def python(code: str) -> str:
        """Run a Python program and return what it printed.

        Args:
            code: The program; print what you want to read.
        """
        result = run_python(code, mode="program", limits=limits)
        out = result.stdout.decode("utf-8", errors="replace")
        if result.timed_out:
            return f"{out}\n[killed: over {timeout_s:g} s]"
        if result.output_overflow:
            return f"{out}\n[killed: too much output]"
        return out if result.returncode == 0 else f"{out}\n[exit status {result.returncode}]"

    return Tool.from_function(python)
