"""Progress without a terminal: log lines with the values, seconds per step and the time left."""

from __future__ import annotations

import logging

import pytest

from grpolab import progress as progress_module
from grpolab.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", c)
    return c


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "grpolab.progress"]


def test_a_line_every_interval_and_at_the_end(clock, caplog):
    caplog.set_level(logging.INFO, logger="grpolab.progress")
    bar = Progress(total=60, title="GRPO", tty=False, interval_s=10.0, every=100)
    for step in range(1, 61):
        clock.now += 2.0  # 2 s per step: a line every 5 steps (10 s)
        bar.update(step, reward=0.25, kl=None if step < 10 else 0.0012, step_time=2.0)
    bar.close()
    lines = _lines(caplog)
    assert len(lines) == 12
    assert lines[0] == "GRPO step 5/60  reward 0.25  step_time 2  2.00 s/step  ETA 1m50s"
    assert lines[1] == "GRPO step 10/60  reward 0.25  kl 0.0012  step_time 2  2.00 s/step  ETA 1m40s"
    assert lines[-1].startswith("GRPO step 60/60") and lines[-1].endswith("ETA 0s")


def test_every_n_units_on_a_fast_loop_and_a_last_line_when_stopped_early(clock, caplog):
    caplog.set_level(logging.INFO, logger="grpolab.progress")
    bar = Progress(total=100, start=40, title="SFT", tty=False, may_stop_early=True)  # every: a tenth
    for step in range(41, 76):
        clock.now += 0.5
        bar.update(step, loss=1.5)
    bar.close()  # stopped at 75 of 100
    assert [line.split("  ")[0] for line in _lines(caplog)] == ["SFT step 50/100", "SFT step 60/100",
                                                                "SFT step 70/100", "SFT step 75/100"]
    # resumed at 40: the rate counts only the steps done here (35 steps in 17.5 s)
    assert _lines(caplog)[-1].endswith("0.50 s/step  ETA <= 12s")  # 100 steps is a cap


def test_disabled_progress_is_silent(clock, caplog):
    caplog.set_level(logging.INFO, logger="grpolab.progress")
    bar = Progress(total=3, enabled=False, tty=False)
    bar.update(3, reward=1.0)
    bar.close()
    assert _lines(caplog) == []
