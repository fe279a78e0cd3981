"""studies/child.py: a stage in a spawned process gives back its value, its one-line error, or says it died."""

from __future__ import annotations

import os
import signal

import pytest

from grpolab.config import ConfigError
from grpolab.studies.child import ChildStageError, in_child


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _refuse(key: str) -> None:
    raise ConfigError(f"claims.{key} must be at least 1")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_value_comes_back_from_another_process():
    value, pid = in_child("a square", _square_and_pid, 7)
    assert value == 49
    assert pid != os.getpid()


def test_a_users_error_is_raised_here_with_its_message():
    with pytest.raises(ConfigError, match=r"^claims\.seeds must be at least 1$"):
        in_child("a check", _refuse, "seeds")


def test_a_killed_child_is_one_line_naming_the_stage_and_the_signal():
    with pytest.raises(ChildStageError, match=r"the stage ran in its own process, which exited with code -9: killed, out of memory\?"):
        in_child("the stage", _die)
