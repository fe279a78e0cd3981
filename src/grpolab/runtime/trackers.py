"""Experiment trackers behind the run logger: TensorBoard, Weights & Biases, Trackio.

Each is chosen by name in ``log.report_to`` and imported only then. A tracker gets the project and
run name, the resolved config, every metric (non-finite values left out, as TensorBoard cannot hold
them), and the completions table (prompt, completion, total reward, reward per component, advantage)
every ``log.samples_every`` steps.

A resumed run continues the same tracker run: the first start writes each tracker's run id to
``trackers.json`` in the run directory and a resume reads it back (wandb ``id=`` with
``resume="allow"``; trackio resumes by run name and its id is checked). TensorBoard purges events
past the resumed step; wandb and trackio cannot rewind a run, so rows logged after the last
checkpoint of a killed run stay there and the resumed steps follow them.

Metric names: metrics.jsonl holds TRL's log names (``reward``, ``kl``); trackers chart them as TRL's
trackers do, with ``train/`` in front (``tracker_key``).

Tracker runs are opened by the RunLogger, which only the process that writes the run directory
creates.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from grpolab import jsonio
from grpolab.errors import ConfigError

log = logging.getLogger(__name__)

STATE_FILE = "trackers.json"
TABLE_KEY = "completions"


@dataclass(frozen=True)
class TrackerRun:
    """What every tracker is opened with."""

    run_dir: Path
    project: str
    name: str
    config: Mapping[str, Any]
    resume_step: int | None
    """The step a resumed run continues after; None for a fresh run."""
    state: Mapping[str, Any]
    """This tracker's entry of trackers.json from the previous start (empty when fresh)."""


class Tracker(Protocol):
    state: dict[str, Any]
    """Written to trackers.json under the tracker's name: enough to continue the same run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None: ...

    def close(self) -> None: ...


GRPOLAB_NAMESPACES = ("train", "loss", "rollout", "sys", "eval", "sft")
"""The prefixes of grpolab's own metrics; every other key is one of TRL GRPOTrainer's names."""


def tracker_key(key: str) -> str:
    """The name a tracker charts a metric under: TRL's names get ``train/`` in front, as transformers'
    TensorBoard, wandb and trackio callbacks write them for TRL (``reward`` -> ``train/reward``), so
    a TRL user's charts keep their names; grpolab's own (``sys/peak_mem_mb``) are charted as logged."""
    return key if key.split("/", 1)[0] in GRPOLAB_NAMESPACES and "/" in key else f"train/{key}"


def finite_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoardTracker:
    def __init__(self, run: TrackerRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.state: dict[str, Any] = {}
        self.writer = SummaryWriter(str(run.run_dir / "tb"), purge_step=run.resume_step)
        if run.resume_step is None:
            self.writer.add_text("config", "```\n" + jsonio.dumps(run.config, indent=2) + "\n```", 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in finite_scalars(metrics).items():
            self.writer.add_scalar(k, v, step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """TensorBoard has no tables: the rows go to the Text tab as a markdown table."""
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text(TABLE_KEY, "\n".join(lines), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """wandb.init with a persisted id; offline when WANDB_MODE=offline (then nothing logs in)."""

    def __init__(self, run: TrackerRun) -> None:
        wandb = _import("wandb")
        run_id = run.state.get("id") if run.resume_step is not None else None
        self.wandb = wandb
        try:
            self.run = wandb.init(
                project=run.project,
                name=run.name,
                id=run_id,  # None: wandb makes one, saved in trackers.json for a resume
                resume="allow" if run_id else None,
                config=dict(run.config),
                dir=os.environ.get("WANDB_DIR") or str(run.run_dir),  # read now: wandb caches its first setup
            )
        except Exception as err:  # no API key, no network: say how to go on without them
            raise ConfigError(
                f"log.report_to: wandb could not start a run ({type(err).__name__}: {err}). Run `wandb login`, "
                "or set WANDB_MODE=offline to log locally (`wandb sync` uploads later)"
            ) from err
        self.state = {"id": self.run.id}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(finite_scalars(metrics), step=step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({TABLE_KEY: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """trackio's local store (TRACKIO_DIR, default ~/.cache/huggingface/trackio), or a Space it is set to."""

    def __init__(self, run: TrackerRun) -> None:
        trackio = _import("trackio")
        check_trackio_store()
        resuming = run.resume_step is not None and bool(run.state)
        self.trackio = trackio
        self.run = trackio.init(
            project=run.project,
            name=run.state.get("name", run.name) if resuming else run.name,
            config=dict(run.config),
            resume="allow" if resuming else "never",
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )
        if resuming and run.state.get("id") not in (None, self.run.id):
            log.warning(
                "trackio resumed run %r with id %s, not %s as before",
                self.run.name,
                self.run.id,
                run.state["id"],
            )
        self.state = {"name": self.run.name, "id": self.run.id}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(finite_scalars(metrics), step=step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({TABLE_KEY: self.trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[[TrackerRun], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "trackio": TrackioTracker,
}


def _missing(module: str) -> ConfigError:
    return ConfigError(
        f"log.report_to names {module}, which is not installed: pip install 'grpolab[{module}]' "
        f"(or remove it from log.report_to)"
    )


MODULES = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "trackio": "trackio"}
"""What each tracker imports."""


def _import(module: str, name: str | None = None):
    """The tracker's module; one that is missing or breaks while importing is a ConfigError."""
    name = name or module
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise _missing(name) from err
    except Exception as err:  # noqa: BLE001 - a broken install raises anything (SyntaxError, AttributeError...)
        raise ConfigError(
            f"log.report_to names {name}, but importing it failed ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}); reinstall it (pip install --force-reinstall {name}) or remove "
            "it from log.report_to"
        ) from err


def check_trackers(names: Sequence[str]) -> None:
    """Before any model loads: every tracker of log.report_to imports, and trackio's store is writable."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"log.report_to: unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
        _import(MODULES[name], name)
        if name == "trackio":
            check_trackio_store()


def check_trackio_store() -> None:
    """trackio writes its local store from a background thread that drops what it cannot write: an
    unwritable store would lose every metric with exit status 0, so it is tested here."""
    from trackio import utils

    store = Path(utils.TRACKIO_DIR)
    try:
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=store, prefix=".grpolab_check_"):
            pass
    except OSError as err:
        raise ConfigError(
            f"log.report_to: trackio's store {store} cannot be written ({err.strerror or err}); set TRACKIO_DIR "
            "to a writable folder, fix its permissions, or remove trackio from log.report_to"
        ) from err


def open_trackers(
    names: Sequence[str],
    *,
    run_dir: Path,
    project: str,
    run_name: str,
    config: Mapping[str, Any],
    resume_step: int | None,
) -> dict[str, Tracker]:
    """Open each named tracker and record its run ids in ``run_dir/trackers.json``."""
    state_path = Path(run_dir) / STATE_FILE
    saved = _read_state(state_path) if resume_step is not None else {}
    opened: dict[str, Tracker] = {}
    try:
        for name in names:
            run = TrackerRun(Path(run_dir), project, run_name, config, resume_step, saved.get(name, {}))
            opened[name] = TRACKERS[name](run)
    except BaseException:
        for tracker in opened.values():
            tracker.close()
        raise
    if names:
        state = {**saved, **{name: t.state for name, t in opened.items() if t.state}}
        tmp = state_path.with_name(STATE_FILE + ".tmp")
        tmp.write_text(jsonio.dumps(state, indent=2) + "\n")
        os.replace(tmp, state_path)
    return opened


def _read_state(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON; the trackers start new runs", path)
        return {}
    return state if isinstance(state, dict) else {}
