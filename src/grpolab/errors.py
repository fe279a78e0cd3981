"""The base class of the errors a user is expected to meet and fix (docs/design.md, "Errors a user meets are one line").

``ConfigError``, ``DataError``, ``ModelLoadError``, ``RewardError`` and ``TrainingError`` derive from
``GrpolabError`` (and keep their ``ValueError`` / ``RuntimeError`` bases). Their message names the
file, row or key and says how to fix it, so the command line prints it as one line,
``grpolab: error: ...``, and exits with status 2. Any other exception is a bug: its traceback is kept.

This module imports nothing, so the command line can catch these errors without importing torch.
"""

from __future__ import annotations


class GrpolabError(Exception):
    """A problem the user can fix; the message says which key, file or row, and how."""


class ConfigError(GrpolabError, ValueError):
    """A configuration problem, with the key and a fix in the message."""


class RewardError(GrpolabError, RuntimeError):
    """A reward failed, returned a bad value, or took too long. The message says how to fix it.

    It lives here, below both, because the sandbox (which rewards call) raises it too. During training a
    reward failure fails the samples it hit (docs/training.md, "Failed samples"); ``failure_kind`` is how it
    is counted there (``failures/<kind>``), set by the subclasses that say more."""

    failure_kind = "reward_error"


class TrainingError(GrpolabError, RuntimeError):
    """Training cannot go on (e.g. too many non-finite losses in a row); the last good checkpoint is kept."""


NONDETERMINISTIC_OP = "does not have a deterministic implementation"
"""In torch's RuntimeError for an op with no deterministic kernel under train.deterministic (the CLI
turns it into one line naming the op)."""


def one_line(err: BaseException) -> str:
    """The message on one line (YAML and tokenizer errors span several)."""
    return " ".join(str(err).split())
