"""Progress of the long phases (SFT, GRPO, evaluation): a rich bar on a terminal, log lines elsewhere.

A bar only draws on a TTY; under ``make demo | tee`` or in CI logs it would print nothing for minutes.
There one INFO line goes to the ``grpolab.progress`` logger every ``interval_s`` seconds or every
``every`` units (a tenth of the total by default), and at the end: the count, the values passed to
``update`` (reward, KL, loss, ...), seconds per unit and the estimated time left.
"""

from __future__ import annotations

import logging
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

log = logging.getLogger(__name__)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """``update(completed, **info)`` after each unit of work; ``close()`` at the end.

    ``tty``: draw the bar (True) or write log lines (False); None asks whether stdout is a terminal.
    ``may_stop_early``: the total is a cap (SFT stops at its accuracy target), so the ETA is a bound."""

    def __init__(
        self,
        *,
        total: int,
        start: int = 0,
        enabled: bool = True,
        title: str = "",
        unit: str = "step",
        tty: bool | None = None,
        interval_s: float = 10.0,
        every: int | None = None,
        may_stop_early: bool = False,
    ):
        self._bar = None
        self._lines = False
        self._total, self._start, self._title, self._unit = total, start, title, unit
        self._interval, self._every = interval_s, every or max(1, total // 10)
        self._t0 = self._last_time = time.perf_counter()
        self._last_done = self._completed = start
        self._eta = "ETA <=" if may_stop_early else "ETA"
        self._values: dict[str, float] = {}
        if not enabled:
            return
        if tty is None:
            tty = Console().is_terminal
        if not tty:
            self._lines = True
            return
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(title, total=total, completed=start, info="")

    def update(self, completed: int, **info: float | None) -> None:
        values = {k: v for k, v in info.items() if v is not None}
        self._completed, self._values = completed, values
        if self._lines:
            self._maybe_log(completed, values)
        if self._bar is None:
            return
        text = "  ".join(f"{k} {v:.3g}" for k, v in values.items())
        self._bar.update(self._task, completed=completed, info=text)

    def _maybe_log(self, completed: int, values: dict[str, float]) -> None:
        now = time.perf_counter()
        due = now - self._last_time >= self._interval or completed - self._last_done >= self._every
        if not (due or completed >= self._total):
            return
        self._last_time, self._last_done = now, completed
        log.info(self.line(completed, values, now - self._t0))

    def line(self, completed: int, values: dict[str, float], elapsed: float) -> str:
        """One progress line: ``GRPO step 12/60  reward 0.41  kl 0.0012  2.30 s/step  ETA 1m50s``."""
        parts = [f"{self._title} {self._unit} {completed}/{self._total}".strip()]
        parts += [f"{k} {v:.3g}" for k, v in values.items()]
        done = completed - self._start
        if done > 0:
            per = elapsed / done
            parts.append(f"{per:.2f} s/{self._unit}")
            parts.append(f"{self._eta} {_duration(per * (self._total - completed))}")
        return "  ".join(parts)

    def close(self) -> None:
        if self._lines and self._completed != self._last_done:  # stopped early (SFT at its target)
            self._last_done = self._completed
            log.info(self.line(self._completed, self._values, time.perf_counter() - self._t0))
        if self._bar is not None:
            self._bar.stop()
