"""Math answer accuracy with math-verify (``from math_verify import parse, verify``).

The prediction is, in order of preference: the last ``<answer>...</answer>`` after the reasoning,
the last closed ``\\boxed{...}``, else the whole text after the reasoning. A bare answer (tag or box
content such as ``\\sqrt{2}``) is parsed as ``$...$`` first, because math-verify's default
extraction finds LaTeX only between delimiters (bare ``\\sqrt{2}`` parses to nothing, bare ``2\\pi``
to 2).

Timeouts: math-verify bounds parse and verify with ``signal.alarm``, which raises ValueError
outside the main thread. In the main thread we pass ``timeout_s`` through; in any other thread (the
worker ``score_batch`` uses when ``timeout_s`` is set) we disable it (``parsing_timeout=None``,
``timeout_seconds=None``) and rely on the caller's thread timeout. The input is also cut to its last
``max_chars`` characters, since sympy can take very long on long adversarial strings.
"""

from __future__ import annotations

import threading
from functools import lru_cache, partial

from grpolab.rewards.base import PerSample, per_sample
from grpolab.rewards.rules import extract_answer_tag, extract_boxed, final_region, require_answer
from grpolab.types import Completion, Example

_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def _signal_timeout(timeout_s: int | None) -> int | None:
    return timeout_s if threading.current_thread() is threading.main_thread() else None


def parse_answer(text: str, *, bare: bool, timeout_s: int | None = 5) -> list:
    """math-verify's parse of ``text``; ``bare`` answers without delimiters are tried as ``$text$`` first."""
    from math_verify import parse

    timeout = _signal_timeout(timeout_s)
    if bare and not any(d in text for d in _DELIMITERS):
        return parse(f"${text}$", parsing_timeout=timeout) or parse(text, parsing_timeout=timeout)
    return parse(text, parsing_timeout=timeout)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int | None) -> tuple:
    return tuple(parse_answer(gold, bare=True, timeout_s=timeout_s))


def prediction_text(text: str) -> tuple[str, bool]:
    """(candidate, bare): the answer-tag content, else the boxed content, else the final text."""
    region = final_region(text)
    for candidate in (extract_answer_tag(region), extract_boxed(region)):
        if candidate is not None:
            return candidate, True
    return region, False


def math_accuracy(
    completion: Completion, example: Example, *, max_chars: int = 1000, timeout_s: int | None = 5
) -> float:
    """1.0 if math-verify finds the predicted answer equal to ``example.answer``, else 0.0."""
    from math_verify import verify

    gold_text = require_answer(example, "math_accuracy")
    gold = _parse_gold(gold_text, _signal_timeout(timeout_s))
    if not gold:
        raise ValueError(
            f"math-verify cannot parse the reference answer {gold_text!r}; write it as a number or "
            "LaTeX (e.g. '\\frac{1}{2}'), or use the exact_match reward for this dataset"
        )
    candidate, bare = prediction_text(completion.text)
    predicted = parse_answer(candidate[-max_chars:], bare=bare, timeout_s=timeout_s)
    if not predicted:
        return 0.0
    return float(verify(list(gold), predicted, timeout_seconds=_signal_timeout(timeout_s)))


def make_math_accuracy(*, max_chars: int = 1000, timeout_s: int | None = 5) -> PerSample:
    if max_chars <= 0:
        raise ValueError(f"math_accuracy: max_chars={max_chars}; give a positive number (default 1000)")
    if timeout_s is not None and (not isinstance(timeout_s, int) or timeout_s <= 0):
        raise ValueError(
            f"math_accuracy: timeout_s={timeout_s!r}; math-verify's signal alarm takes whole seconds, "
            "give a positive int or None"
        )
    return per_sample(partial(math_accuracy, max_chars=max_chars, timeout_s=timeout_s), name="math_accuracy")
