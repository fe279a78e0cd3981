"""The ``judge`` and ``group_judge`` rewards: a served model grades completions (docs/rewards.md, "Judges").

``judge`` sends one request per completion built from the user's template and reads a score from the reply
(rewards/judge/parse.py); ``group_judge`` sends one request per group that shows all G completions, numbered, and
reads one score each, in order (OpenPipe ART's RULER: the judge compares siblings, as GRPO's baseline does).

Failures are never a score. A request that timed out, got a server error, or whose reply holds no score fails
the call with a RewardError of the matching kind (reward_timeout, reward_error, reward_invalid), after the scores
that did come back are cached: training's isolation (rewards/isolate.py) then calls each group alone
(reward.max_retries), and only the failed requests go out again; a group whose calls all fail is dropped from
the step. When no request of a call got through because the endpoint cannot be reached, or the server the run
started for the judge has exited, the call raises RewardServiceDown: the run stops with one line naming the
endpoint.

Scores are cached by request (the rendered messages and the reply settings), so a completion sampled twice in a
group, or asked again on a retry, costs one request; the cache is cleared at each training step (the run's step
cell, as TRL rewards read it) and bounded by ``cache_size``.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from grpolab.errors import RewardError
from grpolab.rewards.errors import RewardServiceDown, describe_example
from grpolab.rewards.judge.client import Endpoint, Failed, Reply, ask_all, time_budget_s
from grpolab.rewards.judge.parse import (
    Unparseable,
    parse_group,
    parse_number,
    parse_verdict,
    parse_yes_probability,
)
from grpolab.rewards.judge.settings import FIXED_PLACEHOLDERS, JudgeSettings, placeholders
from grpolab.rewards.trl_hooks import StepCell
from grpolab.types import Completion, Example

KINDS = {"timeout": "reward_timeout", "answer": "reward_invalid", "unparseable": "reward_invalid"}
"""A failed request's kind -> the failure it counts as (failures/<kind>); any other kind is reward_error."""


class JudgeFailed(RewardError):
    """A request to the judge failed after its retries, or its reply held no score."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.failure_kind = KINDS.get(kind, "reward_error")


def _columns(example: Example) -> dict[str, Any]:
    """The dataset columns a template may name: the row's fields, then the example's other meta."""
    meta = dict(example.meta or {})
    row = meta.pop("row", None)
    return {**meta, **(row if isinstance(row, Mapping) else {})}


def _question(example: Example) -> str:
    question = (example.meta or {}).get("question")
    return question if isinstance(question, str) else example.prompt


class JudgeReward:
    """A reward read from a judge's replies; ``group=True`` is group_judge (module docstring)."""

    in_process = True
    """It runs in the trainer: it bounds its own requests (``time_budget_s``), and a worker process would cost a
    fork for what is only waiting on sockets."""

    def __init__(self, settings: JudgeSettings, *, group: bool = False) -> None:
        self.settings, self.group = settings, group
        self.name = settings.name
        self.uses = placeholders(settings.template) - FIXED_PLACEHOLDERS
        """The dataset columns the template names."""
        self.server: Any = None
        """The vLLM server the run started for this judge (runtime/judges.py), with ``url``, ``alive()``,
        ``log_tail()`` and ``stop()``; None with base_url."""
        self.group_size: int | None = None
        """group_judge: G, set by the run; None = each call is one group."""
        self.counts: dict[str, float] = {}
        self._cache: OrderedDict[str, float | list[float]] = OrderedDict()
        self._cell: StepCell | None = None
        self._step: int | None = None

    # --- where the judge is

    @property
    def url(self) -> str:
        if self.settings.base_url is not None:
            return self.settings.base_url.rstrip("/")
        if self.server is None:
            raise RewardServiceDown(
                f"reward '{self.name}' has serve.model={self.settings.serve.model!r} but no server was started for it: "  # type: ignore[union-attr]
                "grpolab train and eval (and hacking, claims) start one; elsewhere start a vLLM server of it and give base_url"
            )
        return self.server.url.rstrip("/") + "/v1"

    def endpoint(self) -> Endpoint:
        s = self.settings
        key = os.environ.get(s.api_key_env) if s.api_key_env else None
        if s.api_key_env and not key:
            raise RewardServiceDown(f"reward '{self.name}': the environment variable {s.api_key_env} (api_key_env) is not set")
        return Endpoint(self.url, s.model_name, key, s.timeout_s, s.max_retries, s.concurrency)

    def attach_server(self, server: Any) -> None:
        self.server = server

    def close(self) -> None:
        """Stop the server the run started for this judge (if any)."""
        if self.server is not None:
            self.server.stop()

    def attach_hooks(self, hooks: Any) -> None:
        """The run's step cell, read to clear the cache at each step (rewards/trl_hooks.py)."""
        self._cell = StepCell()
        hooks.attach(self._cell)

    # --- requests

    def _fields(self, example: Example, index: int) -> dict[str, Any]:
        columns = _columns(example)
        missing = sorted(self.uses - set(columns))
        if missing:
            raise JudgeFailed(
                f"reward '{self.name}': the template names {{{missing[0]}}}, which {describe_example(example, index)} has "
                f"no column of (columns: {sorted(columns) or 'none'}); fix the template or the dataset", "template"
            )
        answer = example.answer if example.answer is not None else ""
        return {**columns, "question": _question(example), "prompt": example.prompt, "answer": answer}

    def _body(self, content: str) -> dict[str, Any]:
        s = self.settings
        messages = ([{"role": "system", "content": s.system}] if s.system else []) + [{"role": "user", "content": content}]
        body: dict[str, Any] = {"model": s.model_name, "messages": messages, "max_tokens": s.max_tokens,
                                "temperature": s.temperature}  # fmt: skip
        if s.score == "yes_probability":
            body.update(logprobs=True, top_logprobs=s.top_logprobs, max_tokens=1)
        return body

    def _requests(self, completions: list[Completion], examples: list[Example]) -> list[tuple[dict, int]]:
        """(request body, index of its first completion) per request: one per completion, or one per group."""
        template = self.settings.template
        if not self.group:
            return [(self._body(template.format(**self._fields(e, i), completion=c.text)), i)
                    for i, (c, e) in enumerate(zip(completions, examples, strict=True))]  # fmt: skip
        out = []
        for start, end in self._spans(examples):
            shown = "\n\n".join(f"Completion {j + 1}:\n{c.text}" for j, c in enumerate(completions[start:end]))
            fields = self._fields(examples[start], start)
            out.append((self._body(template.format(**fields, completions=shown, group_size=end - start)), start))
        return out

    def _spans(self, examples: list[Example]) -> list[tuple[int, int]]:
        """group_judge: (start, end) of each group: whole groups of G (set by the run) when the batch is, else runs
        of one example object (the trainer repeats each prompt's example G times; the dry run asks one at a time)."""
        g = self.group_size
        if g is not None and len(examples) % g == 0:
            return [(s, s + g) for s in range(0, len(examples), g)]
        starts = [i for i in range(len(examples)) if i == 0 or examples[i] is not examples[i - 1]]
        return list(zip(starts, [*starts[1:], len(examples)], strict=True))

    def _score(self, reply: Reply, g: int) -> float | list[float]:
        """The reply's score, or (group_judge) its ``g`` scores, each in [0, 1]."""
        s = self.settings
        if self.group:
            return parse_group(reply.text, g, *s.score_range)
        if s.score == "verdict":
            return parse_verdict(reply.text, s.verdicts)
        if s.score == "yes_probability":
            if not reply.top_logprobs:
                raise Unparseable("the judge's reply has no top_logprobs (does the endpoint return log-probs?)")
            return parse_yes_probability(reply.top_logprobs, s.yes_tokens, s.no_tokens)
        return parse_number(reply.text, *s.score_range, s.score_regex)

    def time_budget_s(self, completions: list[Completion], examples: list[Example]) -> float:
        requests = len(self._spans(examples)) if self.group else len(completions)
        return time_budget_s(self.endpoint(), max(requests, 1))

    # --- the call

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]:
        self._new_step()
        requests = self._requests(completions, examples)
        keys = [json.dumps(body, sort_keys=True) for body, _ in requests]
        todo = [k for k in dict.fromkeys(keys) if k not in self._cache]
        counts = {"requests": float(len(todo)), "cached": float(len(keys) - len(todo)), "failed": 0.0,
                  "prompt_tokens": 0.0, "completion_tokens": 0.0}  # fmt: skip
        self.counts = counts
        ep = self.endpoint()
        replies = dict(zip(todo, ask_all(ep, [json.loads(k) for k in todo]), strict=True))
        sizes = dict(zip(keys, [end - start for start, end in self._spans(examples)], strict=True)) if self.group else {}
        failure: tuple[str, str, int] | None = None
        for key, reply in replies.items():
            first = requests[keys.index(key)][1]
            if isinstance(reply, Failed):
                failure = failure or (reply.kind, reply.message, first)
                continue
            counts["prompt_tokens"] += reply.prompt_tokens
            counts["completion_tokens"] += reply.completion_tokens
            try:
                self._remember(key, self._score(reply, sizes.get(key, 1)))
            except Unparseable as err:
                failure = failure or ("unparseable", str(err), first)
        counts["failed"] = float(sum(k not in self._cache for k in todo))
        if failure is not None:
            self._raise(failure, replies, examples, ep, int(counts["failed"]))
        return self._values(keys, len(completions))

    def _values(self, keys: list[str], n: int) -> list[float | None]:
        low, high = self.settings.output_range
        if not self.group:
            return [low + (high - low) * self._cache[k] for k in keys]  # type: ignore[operator]
        out: list[float | None] = []
        for k in keys:
            out.extend(low + (high - low) * v for v in self._cache[k])  # type: ignore[union-attr]
        return out[:n]

    def _raise(self, failure: tuple[str, str, int], replies: dict, examples: list[Example], ep: Endpoint, failed_n: int):
        kind, message, first = failure
        failed = [r for r in replies.values() if isinstance(r, Failed)]
        dead = self.server is not None and not self.server.alive()
        if dead or (len(failed) == len(replies) and all(r.kind == "unreachable" for r in failed)):
            why = (f"the judge server grpolab started exited ({self.server.log_tail()})" if dead  # type: ignore[union-attr]
                   else f"none of its {len(replies)} requests reached it ({message})")  # fmt: skip
            raise RewardServiceDown(
                f"reward '{self.name}': the judge at {ep.url} is down: {why}; start it again (or fix base_url) and "
                "resume the run (grpolab train --resume)"
            )
        raise JudgeFailed(
            f"reward '{self.name}': {failed_n} of {len(replies)} judge requests failed, the first on "
            f"{describe_example(examples[first], first)}: {message}", kind
        )

    def _remember(self, key: str, value: float | list[float]) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self.settings.cache_size:
            self._cache.popitem(last=False)

    def _new_step(self) -> None:
        state = self._cell.read() if self._cell is not None else None
        step = state.global_step if state is not None else None
        if step != self._step:
            self._cache.clear()
            self._step = step

    def __repr__(self) -> str:
        return f"JudgeReward({self.name!r}, group={self.group})"
