"""Rule rewards: exact match, a format-blind answer check, the DeepSeek-R1 format reward, and length shaping.

Each reward is a plain per-sample function ``fn(completion, example, **options) -> float``; the
``make_*`` factories check the options once and return the batched reward the registry builds.

Where the code departs from the papers, and why:
* Answers are read only after the last ``</think>`` when there is one: an answer written inside
  the reasoning is not the final answer, and counting it would reward hedging in the think block.
* ``r1_format`` allows empty think and answer blocks: R1 (arXiv 2501.12948, Sec. 2.2) defines the
  format reward by the tags alone; an empty answer still earns no accuracy reward.
* ``answer_anywhere`` is not a training reward but a grader blind to format (``eval.blind_grader``): the
  answer counts wherever it stands in the reply, reasoning included. Where the prompt itself holds the
  answer ("What is 0 + 7?"), a number copied from the prompt cannot be told from an answer, so there only
  the reply's last number (a non-numeric answer: its last line) counts.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Literal

from grpolab.rewards.base import PerSample, per_sample
from grpolab.types import Completion, Example

Extract = Literal["answer_tag", "none", "last_line", "last_number"]
EXTRACT_MODES: tuple[str, ...] = ("answer_tag", "none", "last_line", "last_number")

# An <answer> block whose content holds no other "<answer>": the innermost, for nested tags.
_ANSWER_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
_BOXED = "\\boxed{"
# A number as a chat model writes one: sign, digits with optional thousands commas, optional decimals.
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def final_region(text: str) -> str:
    """The text after the last ``</think>``, or all of it when there is none."""
    _, sep, after = text.rpartition("</think>")
    return after if sep else text


def extract_answer_tag(text: str) -> str | None:
    """Stripped content of the last complete ``<answer>...</answer>`` after the reasoning, or None."""
    matches = _ANSWER_RE.findall(final_region(text))
    return matches[-1].strip() if matches else None


def extract_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (nested braces matched), or None."""
    close_of: dict[int, int] = {}
    stack: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            close_of[stack.pop()] = m.start()
    start = len(text)
    while (start := text.rfind(_BOXED, 0, start)) >= 0:
        brace = start + len(_BOXED) - 1
        if brace in close_of:
            return text[brace + 1 : close_of[brace]].strip()
    return None


def extract_last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def extract_last_number(text: str) -> str | None:
    """The last number after the reasoning, thousands commas removed ("17 + 25 = 1,042." -> "1042"), or None."""
    matches = _NUMBER_RE.findall(final_region(text))
    return matches[-1].replace(",", "") if matches else None


_EXTRACTORS = {
    "answer_tag": extract_answer_tag,
    "last_line": extract_last_line,
    "last_number": extract_last_number,
    "none": lambda text: text.strip(),
}


def require_answer(example: Example, reward: str) -> str:
    if example.answer is None:
        field = (example.meta or {}).get("answer_field")
        where = f"no '{field}' field (data.answer_field)" if field else "no reference answer (data.answer_field)"
        raise ValueError(
            f"the dataset row has {where}, which reward '{reward}' needs: set data.answer_field to the column "
            "that holds the reference answer, fill it in every row, or drop this reward"
        )
    return example.answer


def exact_match(completion: Completion, example: Example, *, extract: Extract = "answer_tag") -> float:
    """1.0 if the extracted answer equals ``example.answer`` (both stripped), else 0.0."""
    gold = require_answer(example, "exact_match").strip()
    predicted = _EXTRACTORS[extract](completion.text)
    return float(predicted is not None and predicted == gold)


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _numbers(text: str) -> list[float]:
    return [v for n in _NUMBER_RE.findall(text) if (v := _as_number(n)) is not None]


def _normalised(text: str) -> str:
    return " ".join(text.casefold().split())


def answer_anywhere(completion: Completion, example: Example) -> float:
    """1.0 when ``example.answer`` appears anywhere in the reply, whatever the format (module docstring).

    A numeric answer is compared numerically with every number in the reply ("42.0" and "1,042" count for 42 and
    1042); any other answer as a substring of the reply, both case-folded with whitespace collapsed.
    """
    gold = require_answer(example, "answer_anywhere").strip()
    value = _as_number(gold)
    if value is not None:
        if value in _numbers(example.prompt):
            return float(_numbers(final_region(completion.text))[-1:] == [value])
        return float(value in _numbers(completion.text))
    if not gold:
        return 0.0
    echoed = _normalised(gold) in _normalised(example.prompt)
    region = (extract_last_line(final_region(completion.text)) or "") if echoed else completion.text
    return float(_normalised(gold) in _normalised(region))


def r1_format(completion: Completion, example: Example, *, prefilled_think: bool = False) -> float:
    """1.0 iff the text is ``<think>...</think> <answer>...</answer>``, one of each tag, nothing after.

    Whitespace is allowed around and between the blocks. With ``prefilled_think`` the prompt ends in
    ``<think>``, so the completion starts inside the think block and must not open another one.
    """
    text = completion.text.strip()
    counts = (text.count("<think>"), text.count("</think>"), text.count("<answer>"), text.count("</answer>"))
    if counts != (0 if prefilled_think else 1, 1, 1, 1):
        return 0.0
    if not prefilled_think and not text.startswith("<think>"):
        return 0.0
    after_think = text[text.index("</think>") + len("</think>") :].lstrip()
    return float(after_think.startswith("<answer>") and after_think.endswith("</answer>"))


def soft_overlong(completion: Completion, example: Example, *, max_length: int, cache_length: int) -> float:
    """DAPO soft overlong punishment (arXiv 2503.14476, Eq. 13), from ``completion.num_tokens``.

    0 up to ``max_length - cache_length`` tokens, then a linear ramp to -1 at ``max_length``, and -1 beyond.
    """
    n, start = completion.num_tokens, max_length - cache_length
    if n <= start:
        return 0.0
    if n <= max_length:
        return (start - n) / cache_length
    return -1.0


def length_penalty(completion: Completion, example: Example, *, coef: float, max_length: int) -> float:
    """``-coef * num_tokens / max_length``: a linear cost per token, -coef at ``max_length`` tokens."""
    return -coef * completion.num_tokens / max_length


def truncation_penalty(completion: Completion, example: Example, *, penalty: float = 1.0) -> float:
    """``-penalty`` when the completion was cut at the length limit (no EOS), else 0."""
    return -penalty if completion.truncated else 0.0


def make_exact_match(*, extract: Extract = "answer_tag") -> PerSample:
    if extract not in EXTRACT_MODES:
        raise ValueError(f"exact_match: extract={extract!r}; choose one of {', '.join(EXTRACT_MODES)}")
    reward = per_sample(partial(exact_match, extract=extract), name="exact_match")
    if extract == "last_number":  # evaluation votes on the number, not on the whole reply (eval.runner)
        reward.extract_answer = extract_last_number
    return reward


def make_answer_anywhere() -> PerSample:
    return per_sample(answer_anywhere, name="answer_anywhere")


def make_r1_format(*, prefilled_think: bool = False) -> PerSample:
    return per_sample(partial(r1_format, prefilled_think=bool(prefilled_think)), name="r1_format")


def make_soft_overlong(*, max_length: int, cache_length: int) -> PerSample:
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"soft_overlong: need 0 < cache_length <= max_length, got cache_length={cache_length}, "
            f"max_length={max_length}; DAPO uses max_length=20480, cache_length=4096"
        )
    fn = partial(soft_overlong, max_length=max_length, cache_length=cache_length)
    return per_sample(fn, name="soft_overlong")


def make_length_penalty(*, coef: float, max_length: int) -> PerSample:
    if max_length <= 0:
        raise ValueError(f"length_penalty: max_length={max_length}; give the positive completion-token limit")
    return per_sample(partial(length_penalty, coef=coef, max_length=max_length), name="length_penalty")


def make_truncation_penalty(*, penalty: float = 1.0) -> PerSample:
    return per_sample(partial(truncation_penalty, penalty=penalty), name="truncation_penalty")
