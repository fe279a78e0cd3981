"""The embedded default task: n-digit addition with the sum written least-significant digit first.

Writing the sum reversed makes each carry local, so a 2-layer model learns it quickly (ALGORITHMS.md
6.1, design A). Prompts look like ``123+456=`` and the reference answer is the zero-padded sum,
reversed: 123 + 456 = 579 -> ``0579`` -> ``9750``. The reward is exact match of the completion.

``style="question"`` asks a chat model in words instead (``QUESTION``: "What is 17 + 25? Answer
with just the number.", answer ``42``), each operand with between ``min_digits`` and ``digits``
digits; grade it with ``exact_match`` and ``extract: last_number``.
"""

from __future__ import annotations

import random

from grpolab.types import Example

QUESTION = "What is {a} + {b}? Answer with just the number."


def make_problem(a: int, b: int, *, digits: int = 3, reverse: bool = True) -> Example:
    total = str(a + b).zfill(digits + 1)
    answer = total[::-1] if reverse else total
    prompt = f"{str(a).zfill(digits)}+{str(b).zfill(digits)}="
    return Example(prompt=prompt, answer=answer, meta={"a": a, "b": b})


def arithmetic_examples(
    *,
    size: int,
    seed: int,
    digits: int = 3,
    reverse: bool = True,
    style: str = "equation",
    min_digits: int | None = None,
    question: str = QUESTION,
) -> list[Example]:
    """``size`` distinct problems drawn with a seeded RNG: ``123+456=`` (style "equation") or a question."""
    if style == "question":
        return question_examples(size=size, seed=seed, min_digits=min_digits or digits, digits=digits, question=question)
    if style != "equation":
        raise ValueError(f"style={style!r}; choose 'equation' (123+456=) or 'question' (What is 123 + 456?)")
    if min_digits is not None:
        raise ValueError("min_digits applies to style=question; equation operands always have `digits` digits")
    space = (10**digits) ** 2
    if size > space:
        raise ValueError(f"only {space} distinct {digits}-digit problems exist; asked for {size}")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out = []
    while len(out) < size:
        a, b = rng.randrange(10**digits), rng.randrange(10**digits)
        if (a, b) not in seen:
            seen.add((a, b))
            out.append(make_problem(a, b, digits=digits, reverse=reverse))
    return out


def question_examples(*, size: int, seed: int, min_digits: int, digits: int, question: str = QUESTION) -> list[Example]:
    """``size`` distinct additions asked as ``question``; each operand's digit count is drawn uniformly
    from ``min_digits..digits``, then the operand uniformly among the numbers of that many digits."""
    if not 1 <= min_digits <= digits:
        raise ValueError(f"need 1 <= min_digits <= digits, got min_digits={min_digits}, digits={digits}")
    if "{a}" not in question or "{b}" not in question:
        raise ValueError(f"question {question!r} must hold the operands' places {{a}} and {{b}}")
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    if size > (10**digits - low) ** 2:
        raise ValueError(f"only {(10**digits - low) ** 2} distinct problems exist; asked for {size}")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out = []
    while len(out) < size:
        a, b = (_operand(rng, rng.randint(min_digits, digits)) for _ in range(2))
        if (a, b) not in seen:
            seen.add((a, b))
            text = question.replace("{a}", str(a)).replace("{b}", str(b))
            out.append(Example(prompt=text, answer=str(a + b), meta={"a": a, "b": b}))
    return out


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def multiplication_examples(*, size: int, seed: int, digits: int = 3, digits_b: int = 2) -> list[Example]:
    """``size`` problems ``a*b=`` (a of ``digits`` digits, b of ``digits_b``), answer the product: too
    hard for a tiny model's head, easy with a calculator (the agent demo, grpolab.commands.agent_demo)."""
    rng = random.Random(seed)
    lo_a, lo_b = 10 ** (digits - 1), 10 ** (digits_b - 1)
    out = []
    for _ in range(size):
        a, b = rng.randrange(lo_a, 10 * lo_a), rng.randrange(lo_b, 10 * lo_b)
        out.append(Example(prompt=f"{a}*{b}=", answer=str(a * b), meta={"a": a, "b": b}))
    return out
