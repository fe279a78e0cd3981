"""Run GRPO and PPO (and any other algo.name) on one task, model, seed and sample budget, one at a time.

Each algorithm trains in its own ``grpolab train`` subprocess, one after another, so the peak memory a
run reports (process RSS on CPU, max allocated on a GPU; ``sys/peak_mem_mb``) is that algorithm's
alone. Each algorithm's config is derived from the settings the user wrote with ``algo.name`` changed
(``derive``), so every field its preset fills takes that preset's value unless the user set it: the
same config as ``grpolab train`` with ``algo.name=<algo>`` on the same file and overrides. Runs go to ``<log.output_dir>/<log.run_name>/<algo>/``, the report beside them.

Signals: each child runs in its own session, so a Ctrl-C at the terminal reaches only this process,
which forwards SIGINT / SIGTERM / SIGHUP (the terminal hung up) to the running child and waits for it:
the child finishes its step, saves a checkpoint and exits (130 / 143 / 129), then ``compare`` raises
CompareStopped and the algorithms after it do not start. A second signal is forwarded too and stops the child at once, as it would a
``grpolab train`` run alone. (Without this, ``subprocess.run`` killed the child on KeyboardInterrupt,
before it could write its checkpoint.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import statistics
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpolab.config import AlgoName, Config, ConfigError, derive, dump_config
from grpolab.errors import GrpolabError
from grpolab.runtime.guards import STOP_SIGNALS, detach_from_terminal
from grpolab.runtime.logging import read_metrics
from grpolab.studies.compare_report import write_report

log = logging.getLogger(__name__)

DEFAULT_ALGOS = ("grpo", "ppo")
MODEL_ROLES = ("policy", "reference", "reward", "value")


class CompareError(GrpolabError, RuntimeError):
    """An algorithm's training run failed; the message names it, its log and the log's last error."""


class CompareStopped(Exception):
    """A signal stopped ``compare``; the running child saved its checkpoint and exited."""

    def __init__(self, signum: int, algo: str, run_dir: Path, skipped: Sequence[str]) -> None:
        super().__init__(f"{signal.Signals(signum).name} stopped compare during {algo}")
        self.signum, self.algo, self.run_dir, self.skipped = signum, algo, run_dir, list(skipped)


@dataclass
class AlgoRun:
    algo: str
    run_dir: Path
    wall_s: float
    """Seconds the subprocess took, start-up and model loading included."""
    info: dict[str, Any]
    """run_info.json: models loaded and parameter counts, baseline memory."""
    metrics: list[dict[str, Any]]
    """metrics.jsonl rows."""


@dataclass
class Comparison:
    report: Path
    runs: list[AlgoRun]
    summary: list[dict[str, Any]]


def algo_config(cfg: Config, algo: str, out: Path, changes: Mapping[str, Any] | None = None) -> Config:
    """cfg derived with algo.name=algo and ``changes`` (dotted keys), written under out/<algo> (or the
    ``log.run_name`` of ``changes``), without a progress bar: the preset's fields the user left unset take
    ``algo``'s values, the ones the user set keep theirs (config/resolve.py)."""
    return derive(
        cfg, {"algo.name": algo, "log.output_dir": str(out), "log.run_name": algo, "log.progress": False, **(changes or {})}
    )


def validate_algos(cfg: Config, algos: Sequence[str]) -> dict[str, Config]:
    """Each algorithm's config, all validated before anything runs (ConfigError / ValueError otherwise)."""
    known = typing.get_args(AlgoName)
    if not algos or len(set(algos)) != len(algos):
        raise ConfigError(f"compare --algos: give distinct algo.name values, got {list(algos)}")
    for a in algos:
        if a not in known:
            raise ConfigError(f"compare --algos: unknown algorithm '{a}': choose from {', '.join(known)}")
    return {a: algo_config(cfg, a, cfg.run_dir) for a in algos}


def compare(cfg: Config, algos: Sequence[str] = DEFAULT_ALGOS) -> Comparison:
    """Train each algorithm in turn in its own process, then write report.md and plots/ beside the runs."""

    configs = validate_algos(cfg, algos)
    out = cfg.run_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, a in enumerate(algos):
        try:
            runs.append(train_in_child(configs[a], out))
        except CompareStopped as stopped:
            stopped.skipped = list(algos[i + 1 :])
            raise
    summary = [summarise(r) for r in runs]
    report = write_report(out, cfg, runs, summary)
    return Comparison(report=report, runs=runs, summary=summary)


def train_in_child(cfg: Config, out: Path) -> AlgoRun:
    """``grpolab train`` on ``cfg`` in a subprocess (its peak memory its own), named by log.run_name: the
    config and log go to ``out/<name>.yaml`` / ``.log``, the run to cfg.run_dir. Signals reach the child."""
    algo = cfg.log.run_name
    config_path, log_path = out / f"{algo}.yaml", out / f"{algo}.log"
    config_path.write_text(dump_config(cfg))
    cmd = [sys.executable, "-m", "grpolab", "train", "--config", str(config_path)]
    log.info("training %s (%d steps), log in %s", algo, cfg.train.num_steps, log_path)
    t0 = time.perf_counter()
    with log_path.open("w") as fh:
        child = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        with _forward_signals(child) as received:
            returncode = child.wait()
    wall = time.perf_counter() - t0
    if received:
        raise CompareStopped(received[0], algo, cfg.run_dir, [])
    if returncode != 0:
        lines = log_path.read_text(errors="replace").splitlines()
        last = next((ln for ln in reversed(lines) if ln.startswith("grpolab: error:")), lines[-1] if lines else "")
        raise CompareError(
            f"{algo}: `grpolab train` exited with code {returncode} (log: {log_path}); last line: {last}"
        )
    info = json.loads((cfg.run_dir / "run_info.json").read_text())
    return AlgoRun(algo=algo, run_dir=cfg.run_dir, wall_s=wall, info=info, metrics=read_metrics(cfg.run_dir))


@contextlib.contextmanager
def _forward_signals(child: subprocess.Popen) -> Iterator[list[int]]:
    """While the block runs, SIGINT / SIGTERM / SIGHUP go to ``child`` (recorded in the yielded list) instead of here."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if signum == signal.SIGHUP:  # the closing line must not fail on the terminal that hung up
            detach_from_terminal()
        log.warning("compare: %s received, passing it to the running training process", signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


SETTINGS_SHOWN = (
    "advantage", "loss_agg", "policy_loss", "importance_level", "kl_in", "kl_estimator", "beta", "clip_low",
    "clip_high", "mu", "num_minibatches", "dynamic_sampling", "mask_truncated",
)  # fmt: skip
"""The algo fields a preset fills: what the report shows of each algorithm's resolved config."""


def ran_settings(run_dir: Path) -> dict[str, Any]:
    """The resolved algo fields of the config the run saved (config.yaml): what actually trained."""
    algo = yaml.safe_load((run_dir / "config.yaml").read_text()).get("algo", {})
    return {k: algo.get(k) for k in SETTINGS_SHOWN}


def summarise(run: AlgoRun) -> dict[str, Any]:
    """One row of the report: models and parameters, peak memory, mean time per step by phase, reward.

    Times are means over steps 2.. (step 1 carries one-off warm-up costs) when there are several steps.
    """
    rows = run.metrics
    steady = rows[1:] or rows
    models = run.info["models"]
    loaded = {k: models.get(k) for k in MODEL_ROLES}
    tail = rows[-max(1, len(rows) // 5) :]
    value_update = _mean(steady, "sys/time_value_update_s") or 0.0
    return {
        "algo": run.algo,
        "settings": ran_settings(run.run_dir),
        "models_loaded": [k for k, v in loaded.items() if v is not None],
        **{f"params_{k}": v for k, v in loaded.items()},
        "params_total": sum(v for v in loaded.values() if v),
        "peak_mem_mb": max((r.get("sys/peak_mem_mb") or 0.0) for r in rows) if rows else None,
        "baseline_mem_mb": run.info.get("baseline_mem_mb"),
        "device": run.info.get("device"),
        "time_generation_s": _mean(steady, "sys/time_generation_s"),
        "time_scoring_s": _mean(steady, "sys/time_scoring_s"),
        "time_reference_s": _mean(steady, "sys/time_reference_s"),
        "time_value_forward_s": _mean(steady, "sys/time_value_forward_s"),
        "time_policy_update_s": (_mean(steady, "sys/time_training_s") or 0.0) - value_update,
        "time_value_update_s": value_update,
        "time_step_s": _mean(steady, "sys/step_time_s"),
        "steps": len(rows),
        "samples": rows[-1].get("sys/samples_seen") if rows else 0,
        "reward_first": rows[0].get("reward") if rows else None,
        "reward_last": _mean(tail, "reward"),
        "wall_s": run.wall_s,
    }
