"""The ``grpolab hacking`` verb: parse the grid, validate everything, then run (kept out of cli.py)."""

from __future__ import annotations

import argparse
import os

from grpolab.config import ConfigError, load_config
from grpolab.studies.hacking import grid_configs, hacking
from grpolab.studies.hacking_miniature import DEFAULT_BETAS, DEFAULT_SEEDS, miniature_config, run_miniature


def _values(text: str, kind, flag: str) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ConfigError(f"{flag}={text!r}: give comma-separated numbers, e.g. {flag}=0,0.04") from err


def run_hacking(args: argparse.Namespace) -> int:
    betas = _values(args.betas, float, "--betas")
    seeds = _values(args.seeds, int, "--seeds")
    if args.miniature:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the demo: a shared CPU

        miniature_config(args.out, args.overrides)  # a bad override fails before any work
        result = run_miniature(args.out, betas or DEFAULT_BETAS, seeds or DEFAULT_SEEDS, args.overrides)
    else:

        cfg = load_config(args.config, args.overrides)
        grid_configs(cfg, betas, seeds)  # fails before any model loads
        result = hacking(cfg, betas, seeds)
    print(f"grpolab: hacking: {len(result.run_dirs)} runs; report written to {result.report}")
    return 0
