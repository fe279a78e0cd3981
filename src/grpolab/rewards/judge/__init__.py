"""Generative judges as rewards: ``judge`` (one request per completion) and ``group_judge`` (one per group).

settings.py holds the kwargs and their checks, parse.py reads a score from a reply, client.py sends the requests,
reward.py is the reward. A judge that grpolab serves itself (``serve: {model: ...}``) is started by the run
(runtime/judges.py); with ``base_url`` it is any OpenAI-compatible endpoint. docs/rewards.md, "Judges".
"""

from __future__ import annotations

from typing import Any

from grpolab.rewards.judge.reward import JudgeFailed, JudgeReward
from grpolab.rewards.judge.settings import JudgeSettings, ServeSettings, settings_from


def make_judge(**kwargs: Any) -> JudgeReward:
    """One request per completion, its reply read as a score (docs/rewards.md, "Judges")."""
    return JudgeReward(settings_from(kwargs, group=False))


def make_group_judge(**kwargs: Any) -> JudgeReward:
    """One request per group showing its G completions; the reply gives one score each, in order."""
    kwargs.setdefault("name", "group_judge")
    return JudgeReward(settings_from(kwargs, group=True), group=True)


__all__ = ["JudgeFailed", "JudgeReward", "JudgeSettings", "ServeSettings", "make_group_judge", "make_judge"]
