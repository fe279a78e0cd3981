"""Resume's config diff (runtime/resume.py): what was trained is refused, the rest accepted."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.resume import check_changes, config_changes


def test_resume_diff_refuses_what_was_trained_and_accepts_the_rest():
    saved = {"optim": {"lr": 1e-3, "schedule": "constant"}, "rollout": {"num_generations": 8}, "log": {"a": 1}}
    new = {"optim": {"lr": 1e-5, "schedule": "cosine"}, "rollout": {"num_generations": 4}, "log": {"a": 2}}
    changes = config_changes(saved, new)
    assert set(changes) == {"optim.lr", "optim.schedule", "rollout.num_generations", "log.a"}
    with pytest.raises(ConfigError) as err:
        check_changes(changes, (), ckpt.Path("x/config.yaml"))
    text = str(err.value)
    assert "optim.schedule: 'constant' -> 'cosine'; rollout.num_generations: 8 -> 4" in text
    assert "optim.lr" not in text and "log.a" not in text
    assert "--resume-allow-change optim.schedule --resume-allow-change rollout.num_generations" in text
    check_changes(changes, ("optim.schedule", "rollout"), ckpt.Path("x"))  # a section allows all its keys
