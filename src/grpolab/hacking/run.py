"""``grpolab hacking``: train against the proxy reward, watch the gold reward, write the overoptimisation report.

One run per (algo.beta, seed) of the grid, one after another in this process, each a plain
``grpolab train`` run with ``reward.gold`` logged (train/gold.py), written to
``<log.output_dir>/<log.run_name>/beta<beta>_seed<seed>/``; ``report.md`` and ``plots/`` beside them
(hacking/report.py). The gold curve is the train-time gold score of each step's on-policy samples,
not a separate evaluation of checkpoints: the same samples the proxy scored, at every step, for free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpolab.config import Config, ConfigError


@dataclass
class HackingResult:
    report: Path
    run_dirs: dict[str, Path]
    """Run name (beta<beta>_seed<seed>) -> its run directory."""


def run_name(beta: float, seed: int) -> str:
    return f"beta{beta:g}_seed{seed}"


def grid_configs(cfg: Config, betas: Sequence[float] = (), seeds: Sequence[int] = ()) -> dict[str, Config]:
    """One config per (beta, seed), all validated before anything runs; empty = the config's own value.

    Needs reward.gold: without a gold reward there is nothing to watch.
    """
    if not cfg.reward.gold:
        raise ConfigError(
            "grpolab hacking needs reward.gold, the reward to watch but not train on, e.g. "
            "reward.gold=[{name: math_accuracy}] (reward.functions holds the proxy it trains on)"
        )
    betas = list(betas) or [cfg.algo.beta]
    seeds = list(seeds) or [cfg.seed]
    if any(b < 0 for b in betas) or len(set(betas)) != len(betas) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--betas and --seeds take distinct values, betas >= 0; got {betas} and {seeds}")
    out = {}
    for beta in betas:
        for seed in seeds:
            name = run_name(beta, seed)
            log_cfg = dataclasses.replace(cfg.log, output_dir=str(cfg.run_dir), run_name=name)
            algo = dataclasses.replace(cfg.algo, beta=float(beta))
            out[name] = dataclasses.replace(cfg, algo=algo, seed=int(seed), log=log_cfg)
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
    from grpolab.hacking.report import write_report
    from grpolab.train.loop import train

    configs = grid_configs(cfg, betas, seeds)
    run_dirs = {}
    for name, run_cfg in configs.items():
        result = train(run_cfg)
        if result.stopped_by is not None:
            raise KeyboardInterrupt
        run_dirs[name] = result.run_dir
    report = write_report(cfg.run_dir, run_dirs, title=title, setup=setup)
    return HackingResult(report=report, run_dirs=run_dirs)
