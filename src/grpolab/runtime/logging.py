"""Run outputs: metrics.jsonl (one object per step), samples.jsonl, and the trackers of log.report_to."""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grpolab import jsonio
from grpolab.distributed import dist
from grpolab.runtime.trackers import open_trackers, tracker_key


def peak_memory_mb(device: torch.device) -> float:
    """Peak process RSS on CPU; peak allocated memory on a GPU (since the last reset: PhaseMemory)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's own peak RSS in MB: Linux's VmHWM, the high-water mark of the memory map exec made.

    Not getrusage's ru_maxrss: on Linux it carries the parent's RSS across fork and exec, so a run started by
    a study holding 11 GB reported a peak of 11 GB whatever it used (make claims' PPO and GRPO alike).
    Elsewhere (no /proc) ru_maxrss, in KiB on Linux and bytes on macOS."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def memory_before_models_mb(device: torch.device) -> float:
    """What the process holds before any model loads (run_info's baseline_mem_mb): on a GPU the memory
    allocated now (the peak counter may hold an earlier run's in this process), on a CPU the peak RSS."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return peak_memory_mb(device)


class PhaseMemory:
    """Peak memory of each phase of a step (rollout, reference, train), for the step's metrics.

    On CUDA each phase starts from a reset of the allocator's peak statistics, so a figure is that
    phase's own, not the run's lifetime maximum, and the reserved memory (what the caching allocator
    holds from the driver; what an out-of-memory error is about) is logged beside the allocated:
    ``sys/peak_mem_<phase>_mb``, ``sys/peak_reserved_<phase>_mb``, and over the step ``sys/peak_mem_mb``
    and ``sys/peak_reserved_mb``. A colocated vLLM engine's KV cache counts in the phases it is awake.
    On a CPU ``sys/peak_mem_mb`` stays the process's peak RSS, as before (the kernel's high-water mark).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: dict[str, tuple[float, float]] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            if cuda:
                mb = 2**20
                self.peaks[name] = (torch.cuda.max_memory_allocated(self.device) / mb, torch.cuda.max_memory_reserved(self.device) / mb)

    def metrics(self) -> dict[str, float]:
        """The step's figures; the phases are forgotten for the next step."""
        peaks, self.peaks = self.peaks, {}
        if not peaks:
            return {"sys/peak_mem_mb": peak_memory_mb(self.device)}
        out = {"sys/peak_mem_mb": max(a for a, _ in peaks.values()), "sys/peak_reserved_mb": max(r for _, r in peaks.values())}
        for name, (allocated, reserved) in peaks.items():
            out[f"sys/peak_mem_{name}_mb"] = allocated
            out[f"sys/peak_reserved_{name}_mb"] = reserved
        return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunLogger:
    """Appends metrics and samples to the run directory; on resume, drops rows past the resumed step.

    Under torchrun only rank 0 writes; on the other ranks every method does nothing."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        resume_step: int | None = None,
        report_to: Sequence[str] | None = None,
        project: str = "grpolab",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        """``report_to`` names the trackers (run.trackers.TRACKERS); None means TensorBoard when ``tensorboard``."""
        self.run_dir = Path(run_dir)
        self.enabled = dist.is_main()
        self.trackers: dict = {}
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        if resume_step is not None:
            for path in (self.metrics_path, self.samples_path):
                _truncate_after(path, resume_step)
        else:
            for path in (self.metrics_path, self.samples_path):
                path.unlink(missing_ok=True)
        names = (("tensorboard",) if tensorboard else ()) if report_to is None else tuple(report_to)
        self.trackers = open_trackers(
            names,
            run_dir=self.run_dir,
            project=project,
            run_name=run_name or self.run_dir.name,
            config=dict(config or {}),
            resume_step=resume_step,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **metrics}
        with self.metrics_path.open("a") as fh:
            fh.write(jsonio.dumps_row(row) + "\n")  # non-finite values as null, counted
        charted = {tracker_key(k): v for k, v in metrics.items()} if self.trackers else {}
        for tracker in self.trackers.values():
            tracker.log(step, charted)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Rows to samples.jsonl, and to every tracker as one table."""
        if not self.enabled:
            return
        with self.samples_path.open("a") as fh:
            for row in rows:
                fh.write(jsonio.dumps_row({"step": step, **row}) + "\n")
        if self.trackers and rows:
            columns, table = completions_table(rows)
            for tracker in self.trackers.values():
                tracker.table(step, columns, table)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()
        self.trackers = {}


def completions_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Columns (every key of any row, in first-seen order) and rows for a tracker table."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return columns, [[_jsonable(row.get(c)) for c in columns] for row in rows]


def _truncate_after(path: Path, step: int) -> None:
    """Keep the rows up to ``step``. A kill mid-write leaves a torn last line: it is dropped too.

    Rewritten through a temporary file and os.replace, so a kill here loses no row.
    """
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("step", 0) <= step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir``'s metrics.jsonl. A last line without its newline is left out: it is being written
    (a reader polling a live run can see part of a write) or was cut by a kill."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    *complete, _partial = path.read_text().split("\n")  # "" after the last newline when the file is whole
    return [json.loads(line) for line in complete if line]
