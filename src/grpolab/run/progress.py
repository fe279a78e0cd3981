"""A rich progress bar for the long phases (SFT, GRPO, evaluation), silent when disabled."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, *, total: int, start: int = 0, enabled: bool = True, title: str = ""):
        self._bar = None
        if enabled:
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

    def update(self, completed: int, **info: float) -> None:
        if self._bar is None:
            return
        text = "  ".join(f"{k} {v:.3g}" for k, v in info.items())
        self._bar.update(self._task, completed=completed, info=text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
