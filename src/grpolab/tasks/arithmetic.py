"""The embedded default task: n-digit addition with the sum written least-significant digit first.

Writing the sum reversed makes each carry local, so a 2-layer model learns it quickly (ALGORITHMS.md
6.1, design A). Prompts look like ``123+456=`` and the reference answer is the zero-padded sum,
reversed: 123 + 456 = 579 -> ``0579`` -> ``9750``. The reward is exact match of the completion.
"""

from __future__ import annotations

import random

from grpolab.types import Example


def make_problem(a: int, b: int, *, digits: int = 3, reverse: bool = True) -> Example:
    total = str(a + b).zfill(digits + 1)
    answer = total[::-1] if reverse else total
    prompt = f"{str(a).zfill(digits)}+{str(b).zfill(digits)}="
    return Example(prompt=prompt, answer=answer, meta={"a": a, "b": b})


def arithmetic_examples(*, size: int, seed: int, digits: int = 3, reverse: bool = True) -> list[Example]:
    """``size`` distinct problems drawn with a seeded RNG."""
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


def multiplication_examples(*, size: int, seed: int, digits: int = 3, digits_b: int = 2) -> list[Example]:
    """``size`` problems ``a*b=`` (a of ``digits`` digits, b of ``digits_b``), answer the product: too
    hard for a tiny model's head, easy with a calculator (the agent demo, grpolab.agent_demo)."""
    rng = random.Random(seed)
    lo_a, lo_b = 10 ** (digits - 1), 10 ** (digits_b - 1)
    out = []
    for _ in range(size):
        a, b = rng.randrange(lo_a, 10 * lo_a), rng.randrange(lo_b, 10 * lo_b)
        out.append(Example(prompt=f"{a}*{b}=", answer=str(a * b), meta={"a": a, "b": b}))
    return out
