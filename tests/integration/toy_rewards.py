"""A dense reward for tests: a random tiny model rarely gets an exact answer, so give partial credit."""


def digit_fraction(completion, example) -> float:
    """Fraction of the completion's characters that are digits (0 for an empty completion)."""
    text = completion.text
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
