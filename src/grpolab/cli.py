"""The command line: each verb parses, loads the config with dotted overrides, and calls one library function.

A bad config fails here, before any model loads.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from grpolab.config import ConfigError, dump_config, load_config


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.beta=0.0 train.num_steps=10")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpolab", description="GRPO and PPO fine-tuning of causal LMs")
    parser.add_argument("--log-level", default="INFO", help="python logging level")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("train", help="GRPO, PPO and variants (algo.name=...)")
    _config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint of the run")
    p = sub.add_parser("config", help="print the resolved, validated config and exit")
    _config_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"grpolab: config error: {err}", file=sys.stderr)
        return 2
    if args.verb == "config":
        print(dump_config(cfg), end="")
        return 0
    if args.verb == "train":
        from grpolab.train.loop import train

        result = train(cfg, resume=args.resume)
        print(f"grpolab: trained to step {result.final_step}; run written to {result.run_dir}")
        return 0
    raise AssertionError(args.verb)


if __name__ == "__main__":
    sys.exit(main())
