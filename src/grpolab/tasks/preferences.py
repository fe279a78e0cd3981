"""Preference pairs built from a task's examples: the narrow, exploitable set of the hacking miniature."""

from __future__ import annotations

import random
from collections.abc import Sequence

from grpolab.types import Example


def length_shortcut_pairs(examples: Sequence[Example], *, seed: int) -> list[dict[str, str]]:
    """A deliberately narrow preference set: ``chosen`` is the answer, ``rejected`` the answer less one digit.

    Every rejected answer is wrong AND one character shorter, so "longer is better" ranks every pair
    right and a reward model need not learn the task at all: the exploitable shortcut of the hacking
    miniature (``grpolab hacking --miniature``), where a policy can lengthen its answers for reward.
    """
    rng = random.Random(seed)
    rows = []
    for e in examples:
        answer = e.answer or ""
        if len(answer) < 2:
            continue
        cut = rng.randrange(len(answer))
        rows.append({"prompt": e.prompt, "chosen": answer, "rejected": answer[:cut] + answer[cut + 1 :]})
    return rows
