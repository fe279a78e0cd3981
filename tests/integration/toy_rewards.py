"""A dense reward for tests: a random tiny model rarely gets an exact answer, so give partial credit."""


def digit_fraction(completion, example) -> float:
    """Fraction of the completion's characters that are digits (0 for an empty completion)."""
    text = completion.text
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def digit_steps(steps, example) -> list[float]:
    """A per-step process rule: 1.0 for a step that holds a digit, else 0.0."""
    return [float(any(c.isdigit() for c in step)) for step in steps]


def broken_steps(steps, example) -> list[float]:
    """A process rule that fails on every example (for the dry-run test)."""
    return [{}["missing"] for _ in steps]


def digit_fraction_half_flat(completion, example) -> float:
    """``digit_fraction`` on half the prompts (by the parity of their characters' sum), 0 on the others:
    the others' groups are all equal, so DAPO's dynamic sampling drops them and samples more rounds."""
    return digit_fraction(completion, example) if sum(map(ord, example.prompt)) % 2 else 0.0


def digit_fraction_failing_on(completion, example, prompt: str) -> float:
    """``digit_fraction``, but the judge behind it is gone for the example whose prompt holds ``prompt``."""
    if prompt in example.prompt:
        raise ConnectionResetError("[Errno 104] Connection reset by peer")
    return digit_fraction(completion, example)


def counted_digit_fraction(completion, example) -> float:
    """``digit_fraction``, each call appending a line to ``$GRPOLAB_TEST_REWARD_CALLS/rank<RANK>`` (when set):
    which ranks scored, and how much."""
    import os
    from pathlib import Path

    folder = os.environ.get("GRPOLAB_TEST_REWARD_CALLS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"rank{os.environ.get('RANK', '0')}", "a") as f:
            f.write("x\n")
    return digit_fraction(completion, example)
