"""training/failures.py: a group's failure is its first row's, counted once under that kind; the share and the stop."""

from __future__ import annotations

import pytest

from grpolab.training.failures import FailedGroups, FailureTally, group_failures
from grpolab.types import FAILURE_KINDS, Failure

ENV = Failure("env_error", "environment m.Remote: step(model_turn) raised ConnectionResetError: gone")
NAN = Failure("reward_nan", "reward 'judge' returned nan for example 5 (prompt: 'q2')")


def test_a_group_is_failed_by_its_first_failed_row():
    assert group_failures([None, None, None, ENV, NAN, NAN], 2) == [None, ENV, NAN]
    assert group_failures(None, 2) == []


def test_the_tally_counts_groups_per_kind_over_rounds_and_the_share_of_those_drawn():
    tally = FailureTally()
    tally.add([None, ENV, None, NAN], retries=3)
    tally.add([None, ENV, None, None], retries=1)
    m = tally.metrics()
    assert {k: v for k, v in m.items() if v} == {
        "failures/env_error": 2, "failures/reward_nan": 1, "failures/retries": 4, "failures/groups_dropped": 3,
        "failures/group_share": 3 / 8,
    }  # fmt: skip
    assert {f"failures/{kind}" for kind in FAILURE_KINDS} <= set(m)  # every kind, 0 or not: the same keys everywhere
    tally.check(m, 0.375, left=5)  # at the limit is not over it
    with pytest.raises(FailedGroups) as err:
        tally.check(m, 0.3, left=5)
    assert str(err.value) == (
        f"3 of 8 groups (38%) were dropped for failed samples (env_error 2, reward_nan 1; the first: {ENV.message}), "
        "more than train.max_failed_group_share=0.3. Fix what failed, give it more retries (reward.max_retries, "
        "env.max_retries), or raise train.max_failed_group_share"
    )
