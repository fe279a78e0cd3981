"""open-r1's reward functions (huggingface/open-r1, src/open_r1/rewards.py), as TRL-style functions.

``grpolab convert-trl`` maps an open-r1 recipe's ``reward_funcs`` names here. grpolab's own rewards are
not the same definitions, so they are not used in their place:

* ``accuracy``: open-r1 parses the gold ``solution`` column with math-verify's default extraction and the
  completion with LaTeX extraction only (boxed first, no anchorless match), and gives None (skip) when the
  gold does not parse; grpolab's ``math_accuracy`` reads the ``<answer>`` tag first and raises instead.
* ``format``: open-r1 wants exactly ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` (those
  newlines; since 566cfd1, 2025-02-24); grpolab's ``r1_format`` allows any whitespace and one of each tag. Its two
  earlier definitions are ``format_reward_spaced`` and ``format_reward_inline``.
* ``tag_count`` and ``reasoning_steps`` have no grpolab counterpart.

So the four that need only math-verify are copied here, their logic unchanged (Apache-2.0, open-r1 commit
1416fa0); the ones that run code in remote sandboxes (code, ioi_code, cf_code, ...) or are factories call
open-r1's own code (``pip install open-r1``) through the wrappers at the end. ``soft_overlong_punishment``
is grpolab's ``soft_overlong`` (the same DAPO ramp, read from the token count).
"""

from __future__ import annotations

import re
from typing import Any


def _contents(completions: list[Any]) -> list[str]:
    return [c[0]["content"] if isinstance(c, list) else c for c in completions]  # open-r1: conversational


def accuracy_reward(completions, solution, **kwargs) -> list[float | None]:
    """1.0 when math-verify finds the completion's LaTeX answer equal to ``solution``; None when the gold does not parse."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    rewards: list[float | None] = []
    for content, sol in zip(_contents(completions), solution, strict=True):
        gold = parse(sol, extraction_mode="first_match")
        if not gold:
            rewards.append(None)
            continue
        normal = NormalizationConfig(
            nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True
        )
        answer = parse(
            content,
            extraction_config=[
                LatexExtractionConfig(normalization_config=normal, boxed_match_priority=0, try_extract_without_anchor=False)
            ],
            extraction_mode="first_match",
        )
        try:
            rewards.append(float(verify(gold, answer)))
        except Exception:  # noqa: BLE001 - open-r1 skips an example math-verify fails on
            rewards.append(None)
    return rewards


_FORMAT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 iff the completion is ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` (open-r1's ``format``)."""
    return [1.0 if _FORMAT.match(c) else 0.0 for c in _contents(completions)]


_FORMAT_SPACED = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_FORMAT_INLINE = re.compile(r"^<think>.*?</think><answer>.*?</answer>$")


def format_reward_spaced(completions, **kwargs) -> list[float]:
    """open-r1's ``format`` from d12886d to 566cfd1 (2025-02-08 to 02-24): ``<think>...</think>``, any whitespace,
    ``<answer>...</answer>``, the tags' contents spanning lines (grpolab convert-trl's reading of open-r1's early
    recipes, whose built-in system prompt asks for ``<think> ... </think><answer> ... </answer>``)."""
    return [1.0 if _FORMAT_SPACED.match(c) else 0.0 for c in _contents(completions)]


def format_reward_inline(completions, **kwargs) -> list[float]:
    """open-r1's ``format`` before d12886d (2025-01-25 to 02-08): ``<think>...</think><answer>...</answer>`` with
    nothing between the two, and no newline anywhere (its pattern had no DOTALL)."""
    return [1.0 if _FORMAT_INLINE.match(c) else 0.0 for c in _contents(completions)]


def tag_count_reward(completions, **kwargs) -> list[float]:
    """0.25 for each of open-r1's four tags that occurs exactly once (with its newlines)."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for t in tags if c.count(t) == 1) for c in _contents(completions)]


_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def reasoning_steps_reward(completions, **kwargs) -> list[float]:
    """min(1, steps / 3), counting step markers, numbered lines, bullets and transition words."""
    return [min(1.0, len(_STEPS.findall(c)) / 3) for c in _contents(completions)]


# ----------------------------------------------------------------------------- open-r1's own code


def _open_r1(name: str):
    try:
        import open_r1.rewards as rewards
    except ImportError as err:
        raise ImportError(f"open-r1's {name} reward runs open-r1's code: pip install open-r1 (and its sandbox's client)") from err
    return getattr(rewards, name)


def code_format_reward(completions, language: str = "python", **kwargs):
    """open-r1's ``code_format`` (get_code_format_reward(language))."""
    return _open_r1("get_code_format_reward")(language=language)(completions, **kwargs)


def cosine_reward(completions, solution, cosine: dict | None = None, **kwargs):
    """open-r1's ``cosine`` (get_cosine_scaled_reward(**cosine))."""
    return _open_r1("get_cosine_scaled_reward")(**(cosine or {}))(completions, solution, **kwargs)


def repetition_penalty_reward(completions, ngram_size: int = 3, max_penalty: float = -1.0, **kwargs):
    """open-r1's ``repetition_penalty`` (get_repetition_penalty_reward(ngram_size, max_penalty))."""
    return _open_r1("get_repetition_penalty_reward")(ngram_size=ngram_size, max_penalty=max_penalty)(completions, **kwargs)
