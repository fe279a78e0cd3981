"""The preference task of the reward-model tests (test_train_reward_model.py), which a tiny reward model
learns in seconds: the largest digit of a list.

Prompt ``max(3,8,1)=``, answer ``8``. A comparison's ``chosen`` is the answer; its ``rejected`` is, half the
time, a smaller digit of the list and otherwise a digit larger than the answer that is NOT in the list.
So neither "bigger is better" nor "the digit appears in the prompt" ranks the pairs: the reward model has
to check membership and order against the prompt. ``prompt_blind_accuracy`` gives the best of the
"bigger is better" rules, the baseline a trained model must beat.

Why not addition: a 2-layer, 64-wide model trained on Bradley-Terry pairs of 1-digit sums (chosen = the
sum, rejected = a near miss) stayed at chance on held-out prompts after 30 epochs; addition needs tens
of thousands of supervised examples (docs/algorithms.md 6.1), far more than a test can afford.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from grpolab.types import Example


def max_digit_examples(*, size: int, seed: int, length: int = 3) -> list[Example]:
    """``size`` distinct lists of ``length`` distinct digits, as Examples with the largest as answer."""
    if not 2 <= length <= 10:
        raise ValueError(f"length must be in [2, 10], got {length}")
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    out = []
    while len(out) < size:
        digits = tuple(rng.sample(range(10), length))
        if digits not in seen:
            seen.add(digits)
            prompt = f"max({','.join(map(str, digits))})="
            out.append(Example(prompt=prompt, answer=str(max(digits)), meta={"digits": digits}))
    return out


def max_digit_preference_pairs(*, size: int, seed: int, length: int = 3) -> list[dict[str, str]]:
    """One row {"prompt", "chosen", "rejected"} per ``max_digit_examples`` problem."""
    rng = random.Random(seed + 1)
    rows = []
    for e in max_digit_examples(size=size, seed=seed, length=length):
        digits, best = e.meta["digits"], int(e.answer)
        larger = list(range(best + 1, 10))  # never in the list: best is its maximum
        smaller = [d for d in digits if d != best]
        wrong = rng.choice(larger) if larger and rng.random() < 0.5 else rng.choice(smaller)
        rows.append({"prompt": e.prompt, "chosen": e.answer, "rejected": str(wrong)})
    return rows


def prompt_blind_accuracy(rows: Sequence[dict[str, str]]) -> float:
    """Accuracy of the better of "larger digit wins" and "smaller digit wins", which ignore the prompt."""
    bigger = sum(int(r["chosen"]) > int(r["rejected"]) for r in rows) / len(rows)
    return max(bigger, 1 - bigger)
