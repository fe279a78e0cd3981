"""Pass@k, Maj@k and mean@n over sampled answers: pure Python, no torch, no randomness.

Where the code departs from the usual definitions, and why:
* pass@k uses the unbiased estimator of Chen et al. (arXiv 2107.03374) in its product form, which never
  forms the huge binomials.
* maj@k breaks ties deterministically: a subset whose plurality is shared by several answers scores
  (tied winners that are correct) / (tied winners), which is the expectation of a uniform random
  tie-break (docs/algorithms.md 7.10 allows either) and keeps evaluation reproducible.
* Unparsed answers (None) do not vote; a subset without any parsed answer scores 0. An unparsed answer
  marked correct is rejected, so that maj@1 always equals the mean correctness.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "blind_vote_keys", "curve_means", "format_errors", "maj_at_k", "mean_at_n", "pass_at_k", "pass_maj_curves",
    "pass_maj_per_problem",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al. 2021, arXiv 2107.03374, Eq. 1).

    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (sample at least k answers per problem), got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _correctness_by_answer(answers: Sequence[str | None], correct: Sequence[bool]) -> dict[str, bool]:
    if len(answers) != len(correct):
        raise ValueError(
            f"answers and correct must have the same length, got {len(answers)} and {len(correct)}"
        )
    by_answer: dict[str, bool] = {}
    for i, (answer, ok) in enumerate(zip(answers, correct, strict=True)):
        if answer is None:
            if ok:
                raise ValueError(f"sample {i} has no parsed answer (None) but is marked correct")
            continue
        if by_answer.setdefault(answer, bool(ok)) != bool(ok):
            raise ValueError(f"answer {answer!r} is marked both correct and incorrect (sample {i})")
    return by_answer


def _majority_score(votes: Sequence[str | None], by_answer: dict[str, bool]) -> float:
    counts = Counter(a for a in votes if a is not None)
    if not counts:
        return 0.0
    top = max(counts.values())
    winners = [a for a, n in counts.items() if n == top]
    return sum(by_answer[a] for a in winners) / len(winners)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Majority-vote accuracy over ``k`` samples (self-consistency; DeepSeekMath Sec. 5.2.2, arXiv 2402.03300).

    The ``n`` samples are cut into ``floor(n / k)`` disjoint consecutive subsets of ``k``; each subset
    scores the correctness of its plurality answer (ties: the share of tied winners that are correct;
    None answers do not vote; no parsed answer scores 0); the result is the mean over subsets.

    Args:
        answers: ``[n]`` parsed final answers, None where parsing failed.
        correct: ``[n]`` whether each sample is correct; an answer string must always have the same value.
        k: votes per subset, ``1 <= k <= n``.

    Raises:
        ValueError: on mismatched lengths, bad ``k``, or inconsistent correctness.
    """
    by_answer = _correctness_by_answer(answers, correct)
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    subsets = n // k
    return sum(_majority_score(answers[j * k : (j + 1) * k], by_answer) for j in range(subsets)) / subsets


def mean_at_n(correct: Sequence[bool]) -> float:
    """Mean correctness over all ``n`` samples (avg@n, the unbiased pass@1)."""
    if not correct:
        raise ValueError("mean_at_n needs at least one sample")
    return sum(bool(c) for c in correct) / len(correct)


def pass_maj_per_problem(
    per_problem: Sequence[tuple[Sequence[str | None], Sequence[bool]]], ks: Sequence[int]
) -> dict[str, dict[int, list[float]]]:
    """Pass@k and Maj@k of each problem: ``{"pass": {k: [one value per problem]}, "maj": {...}}``.

    What an interval over problems needs (a bootstrap resamples these lists); the curves are their means.
    """
    if not per_problem:
        raise ValueError("Pass@k and Maj@k need at least one problem")
    values: dict[str, dict[int, list[float]]] = {"pass": {}, "maj": {}}
    for k in ks:
        values["pass"][k] = [pass_at_k(len(c), sum(bool(x) for x in c), k) for _, c in per_problem]
        values["maj"][k] = [maj_at_k(a, c, k) for a, c in per_problem]
    return values


def pass_maj_curves(
    per_problem: Sequence[tuple[Sequence[str | None], Sequence[bool]]], ks: Sequence[int]
) -> dict[str, dict[int, float]]:
    """Pass@k and Maj@k curves averaged over problems (DeepSeekMath Fig. 7, arXiv 2402.03300).

    Args:
        per_problem: one ``(answers [n], correct [n])`` pair per problem; every problem needs ``n >= max(ks)``.
        ks: the k values.

    Returns:
        ``{"pass": {k: mean pass@k}, "maj": {k: mean maj@k}}``.
    """
    return curve_means(pass_maj_per_problem(per_problem, ks))


def curve_means(values: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """The mean over problems of each list pass_maj_per_problem returns."""
    return {kind: {k: sum(v) / len(v) for k, v in by_k.items()} for kind, by_k in values.items()}


def format_errors(correct: Sequence[bool], answers: Sequence[str], blind: Sequence[bool] | None = None) -> list[bool]:
    """[n] True where a sample failed on format: wrong by the rewards, and right by the format-blind grader
    (``blind``) or with no answer extracted (an empty ``answers`` entry)."""
    if len(correct) != len(answers) or (blind is not None and len(blind) != len(correct)):
        raise ValueError(f"format_errors: {len(correct)} grades, {len(answers)} answers, {len(blind or [])} blind grades")
    return [
        not ok and (not a or (blind is not None and bool(b)))
        for ok, a, b in zip(correct, answers, blind if blind is not None else [False] * len(correct), strict=True)
    ]


def blind_vote_keys(answers: Sequence[str], blind: Sequence[bool], reference: str) -> list[str]:
    """[n] Maj@K vote keys under a format-blind grader: ``reference`` for a sample it grades right (the answer
    was there, however written), else the sample's extracted ``answers`` entry; an extracted answer equal to the
    reference on a sample graded wrong votes apart, so that one key never holds both grades."""
    keys = [reference if ok else a for a, ok in zip(answers, blind, strict=True)]
    return [k + " [graded wrong]" if k == reference and not ok else k for k, ok in zip(keys, blind, strict=True)]
