"""Rewards that misbehave, for tests of the errors a user meets (named as 'bad_rewards:<name>')."""

import re
import time


def raises(completion, example):
    return 1 / 0


def nan(completion, example):
    return float("nan")


def text(completion, example):
    return "1.0"


def slow(completion, example):
    time.sleep(1.0)
    return 0.0


class _WrongCount:
    name = "wrong_count"

    def __call__(self, completions, examples):
        return [0.0] * (len(completions) + 1)


wrong_count = _WrongCount()


def exits(completion, example):
    raise SystemExit(3)


def constant(completion, example):
    return 0.5


def never(completion, example):
    return None


def swallows_timeout(completion, example):
    """A bare except around a wait: whatever is raised into it to stop it, it eats."""
    while True:
        try:  # noqa: SIM105
            time.sleep(10)
        except:  # noqa: E722 (the point of it)
            pass


def catastrophic_regex(completion, example):
    """Minutes in C code, holding the GIL: no thread or signal interrupts it."""
    return float(bool(re.match(r"(a+)+$", "a" * 40 + "b")))


def huge_int(completion, example):
    return 10**400  # beyond float's range


def near_max(completion, example):
    return 1e308  # finite, but not once weighted by 10
