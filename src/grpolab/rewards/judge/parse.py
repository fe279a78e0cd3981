"""A judge's reply as a score: a number on a scale, a verdict word, or P(yes) from the first token's log-probs.

Each parser returns a score normalised to [0, 1], or raises ``Unparseable`` saying what the reply held. A judge
that wrote no score is a failed sample, never a 0: a weak judge that rambles must not teach the policy that
every answer is wrong.

Numbers are looked for in this order, and the last match of the first pattern that matches counts (a judge that
reasons first states its score last): the user's ``score_regex``; ``[[8]]`` (MT-Bench's convention);
``score/rating/grade: 8``; ``8/10`` or ``8 out of 10`` on the judge's own scale; a reply that is a number alone,
or a last line that is one. A bare number inside prose ("7 + 58 = 65, so 10") is not taken: it is as likely
the judge's arithmetic as its score.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

NUMBER = r"[-+]?\d+(?:\.\d+)?"
PATTERNS = (
    re.compile(rf"\[\[\s*({NUMBER})\s*\]\]"),
    re.compile(rf"(?i)\b(?:score|rating|grade|mark)\s*(?:is|=|:)?\s*\**\s*({NUMBER})"),
)
ALONE = re.compile(rf"^\W*?({NUMBER})\W*$")
GROUP_LINE = re.compile(rf"(?im)^\W*(?:completion|answer|response|#)?\s*(\d+)\s*[:=)\].-]\s*(?:score\s*[:=]?\s*)?({NUMBER})\b")


class Unparseable(ValueError):
    """The reply holds no score the settings can read; the message says what it held."""


def shown(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")


def _scaled(value: float, low: float, high: float, text: str) -> float:
    if not (math.isfinite(value) and low <= value <= high):
        raise Unparseable(f"the judge's score {value:g} is outside score_range [{low:g}, {high:g}] in {shown(text)}")
    return (value - low) / (high - low)


def _scale_patterns(high: float) -> tuple[re.Pattern, ...]:
    top = f"{high:g}".replace(".", r"\.")
    return (re.compile(rf"({NUMBER})\s*(?:/|out of)\s*{top}\b"),)


def parse_number(text: str, low: float, high: float, regex: str | None = None) -> float:
    """The score in ``text`` on the scale [low, high] (module docstring), as a share of the scale."""
    patterns = (re.compile(regex),) if regex else (*PATTERNS, *_scale_patterns(high))
    for pattern in patterns:
        found = pattern.findall(text)
        if found:
            last = found[-1]
            return _scaled(float(last[0] if isinstance(last, tuple) else last), low, high, text)
    if regex is None:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        for candidate in (text.strip(), lines[-1] if lines else ""):
            alone = ALONE.match(candidate.strip())
            if alone:
                return _scaled(float(alone.group(1)), low, high, text)
    hint = f"no match of score_regex {regex!r}" if regex else "no score (e.g. 'Score: 7', '[[7]]' or '7/10')"
    raise Unparseable(f"the judge's reply has {hint}: {shown(text)}")


def parse_verdict(text: str, verdicts: Mapping[str, float]) -> float:
    """The score of the last verdict word in ``text`` (whole words, any case): "not correct. INCORRECT" reads as
    its last word; a reply with none of the words is unparseable."""
    words = sorted(verdicts, key=len, reverse=True)  # "incorrect" before "correct" where they would overlap
    pattern = re.compile(r"(?i)(?<![\w-])(" + "|".join(re.escape(w) for w in words) + r")(?![\w-])")
    found = pattern.findall(text)
    if not found:
        raise Unparseable(f"the judge's reply has none of the verdicts {sorted(verdicts)}: {shown(text)}")
    lowered = {w.lower(): v for w, v in verdicts.items()}
    return float(lowered[found[-1].lower()])


def parse_yes_probability(top: Sequence[Mapping[str, Any]], yes: Sequence[str], no: Sequence[str]) -> float:
    """P(yes) / (P(yes) + P(no)) over the first token's ``top_logprobs`` (OpenAI's ``[{token, logprob}]``); the
    texts compared stripped and lowercased, so "Yes", " yes" and "YES" add up. Neither among them: unparseable."""
    yes_set, no_set = {w.strip().lower() for w in yes}, {w.strip().lower() for w in no}
    p_yes = p_no = 0.0
    for entry in top:
        token, logprob = entry.get("token"), entry.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, int | float) or isinstance(logprob, bool):
            raise Unparseable(f"a top_logprobs entry is not {{token, logprob}}: {shown(repr(entry))}")
        word = token.strip().lower()
        p = math.exp(logprob) if logprob > -math.inf else 0.0
        if word in yes_set:
            p_yes += p
        elif word in no_set:
            p_no += p
    if p_yes + p_no <= 0.0:
        seen = [e.get("token") for e in top[:8]]
        raise Unparseable(f"none of the judge's first-token candidates is a yes or a no token: {shown(repr(seen))}")
    return p_yes / (p_yes + p_no)


def parse_group(text: str, group_size: int, low: float, high: float) -> list[float]:
    """One score per completion, in the group's order, from lines such as ``1: 7`` / ``Completion 2: 3`` / ``3) 9``,
    or a JSON-like list of ``group_size`` numbers. A completion scored twice takes its last line; one not scored
    makes the whole reply unparseable (a partial ranking says nothing about the others)."""
    scores: dict[int, float] = {}
    for index, value in GROUP_LINE.findall(text):
        scores[int(index)] = float(value)
    if set(scores) != set(range(1, group_size + 1)):
        listed = re.search(r"\[([^\[\]]*)\]", text)
        values = re.findall(NUMBER, listed.group(1)) if listed else []
        if len(values) == group_size:
            scores = {i + 1: float(v) for i, v in enumerate(values)}
    missing = [i for i in range(1, group_size + 1) if i not in scores]
    if missing:
        raise Unparseable(
            f"the judge's reply scores completions {sorted(scores) or 'none'} of 1..{group_size} (missing {missing}; "
            f"ask for one line 'i: score' each): {shown(text)}"
        )
    return [_scaled(scores[i], low, high, text) for i in range(1, group_size + 1)]
