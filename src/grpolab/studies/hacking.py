"""``grpolab hacking``: train against the proxy reward, watch the gold reward, write the overoptimisation report.

One run per (algo.beta, seed) of the grid, one after another in this process, each a plain
``grpolab train`` run with ``reward.gold`` logged (training/gold.py), written to
``<log.output_dir>/<log.run_name>/beta<beta>_seed<seed>/``; ``report.md`` and ``plots/`` beside them
(studies/hacking_report.py). The gold curve is the train-time gold score of each step's on-policy samples,
not a separate evaluation of checkpoints: the same samples the proxy scored, at every step, for free.

The same command again trains only what is missing: a finished run of the same config is read back, and a
run a signal stopped (exit 128 + the signal, compare.CompareStopped) continues from its checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpolab.commands.train import train
from grpolab.config import Config, ConfigError, derive, dump_config
from grpolab.runtime.checkpoint import list_checkpoints
from grpolab.runtime.logging import read_metrics
from grpolab.studies.compare import CompareStopped
from grpolab.studies.hacking_analysis import effective_beta
from grpolab.studies.hacking_report import write_report

log = logging.getLogger(__name__)


@dataclass
class HackingResult:
    report: Path
    run_dirs: dict[str, Path]
    """Run name (beta<beta>_seed<seed>) -> its run directory."""


def finished(cfg: Config) -> bool:
    """True when cfg's run folder holds a run of this exact config whose metrics reach train.num_steps.

    So an interrupted grid, rerun, trains only what is missing (the report reads metrics and samples).
    """
    saved = cfg.run_dir / "config.yaml"
    if not saved.exists() or saved.read_text() != dump_config(cfg):
        return False
    rows = read_metrics(cfg.run_dir)
    return bool(rows) and rows[-1].get("step") == cfg.train.num_steps


def _continues(name: str, cfg: Config) -> bool:
    """True when cfg's run folder holds checkpoints of a run of this exact config that a signal stopped: it is
    resumed. Checkpoints of another config are replaced with log.overwrite=true, else refused (this verb has no
    --resume for train's own refusal to suggest)."""
    if not list_checkpoints(cfg.run_dir):
        return False
    saved = cfg.run_dir / "config.yaml"
    if saved.is_file() and saved.read_text() == dump_config(cfg):
        log.warning("%s: continuing the run a signal stopped (%s)", name, cfg.run_dir)
        return True
    if not cfg.log.overwrite:
        raise ConfigError(
            f"{name}: {cfg.run_dir} holds checkpoints of a run with another config; set log.overwrite=true to "
            "train it again (the finished runs of this config are kept), or choose another log.run_name"
        )
    return False


def run_name(beta: float, seed: int) -> str:
    """beta<beta>_seed<seed>, the beta written short (0.04) unless that loses digits (0.040000001): two
    betas never share a folder."""
    short = f"{beta:g}"
    return f"beta{short if float(short) == beta else repr(float(beta))}_seed{seed}"


def grid_configs(cfg: Config, betas: Sequence[float] = (), seeds: Sequence[int] = ()) -> dict[str, Config]:
    """One config per (beta, seed), all validated before anything runs; empty = the config's own value.

    Needs reward.gold: without a gold reward there is nothing to watch.
    """
    if not cfg.reward.gold:
        raise ConfigError(
            "grpolab hacking needs reward.gold, the reward to watch but not train on, e.g. "
            "reward.gold=[{name: math_accuracy}] (reward.functions holds the proxy it trains on)"
        )
    betas = list(betas) or [effective_beta(cfg)]
    seeds = list(seeds) or [cfg.seed]
    if any(b < 0 for b in betas) or len(set(betas)) != len(betas) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--betas and --seeds take distinct values, betas >= 0; got {betas} and {seeds}")
    names = [run_name(b, s) for s in seeds for b in betas]
    if len(set(names)) != len(names):  # a guard: run_name is lossless, so this cannot happen
        raise ConfigError(f"--betas {betas} and --seeds {seeds} give two runs one folder name")
    out = {}
    for seed in seeds:  # seed-major: a grid stopped early has every beta for the seeds it ran
        for beta in betas:
            name = run_name(beta, seed)
            out[name] = derive(
                cfg,
                {"log.output_dir": str(cfg.run_dir), "log.run_name": name, "algo.beta": float(beta), "seed": int(seed)},
            )
    return out


def hacking(
    cfg: Config,
    betas: Sequence[float] = (),
    seeds: Sequence[int] = (),
    *,
    title: str | None = None,
    setup=None,
) -> HackingResult:
    """Train every (beta, seed) of the grid in turn, then write report.md beside the runs."""

    configs = grid_configs(cfg, betas, seeds)
    run_dirs = {}
    for i, (name, run_cfg) in enumerate(configs.items()):
        if finished(run_cfg):
            log.warning("%s: already trained with this config (%s), not run again", name, run_cfg.run_dir)
            run_dirs[name] = run_cfg.run_dir
            continue
        result = train(run_cfg, resume=_continues(name, run_cfg))
        if result.stopped_by is not None:
            raise CompareStopped(result.stopped_by, name, result.run_dir, list(configs)[i + 1 :])
        run_dirs[name] = result.run_dir
    report = write_report(cfg.run_dir, run_dirs, title=title, setup=setup)
    return HackingResult(report=report, run_dirs=run_dirs)
