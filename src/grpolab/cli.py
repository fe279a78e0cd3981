"""The command line: each verb parses, loads the config with dotted overrides, and calls one library function.

A bad config fails here, before any model loads. The errors a user is expected to fix (ConfigError,
DataError, ModelLoadError, RewardError, TrainingError: any grpolab.errors.GrpolabError) print as one
line, ``grpolab: error: ...``, with exit status 2; any other exception keeps its traceback.

Exit status of ``grpolab train``: 0 when done; 2 for a known error; 130 (SIGINT), 143 (SIGTERM) or 129
(SIGHUP) when a signal stopped it after saving a checkpoint at the end of the current step (128 + signal
number, the shell convention): ``grpolab train --resume`` with the same config continues it exactly.
``compare`` and ``claims`` exit the same way when a signal stops the training process they run.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from grpolab.cli_args import build_parser as build_parser  # the parser, importable from here as before
from grpolab.cli_args import parse_args
from grpolab.config import ConfigError, ConfigWarning, load_config
from grpolab.config.view import render_view
from grpolab.errors import NONDETERMINISTIC_OP, GrpolabError, one_line

VERB_MODULES = {
    "train": "grpolab.commands.train",
    "sft": "grpolab.commands.sft",
    "eval": "grpolab.commands.eval",
    "train-rm": "grpolab.commands.train_rm",
    "train-iterative": "grpolab.commands.iterative",
    "compare": "grpolab.studies.compare",
    "recipe": "grpolab.studies.recipe",
    "claims": "grpolab.studies.claims",
    "demo": "grpolab.commands.demo",
    "demo --agent": "grpolab.commands.agent_demo",
    "hacking": "grpolab.studies.hacking_cli",
    "export": "grpolab.runtime.sharded",
    "import-gguf": "grpolab.models.sources",
    "convert-trl": "grpolab.trl.convert",
    "checkpoint": "grpolab.runtime.checkpoint",
    "serve": "grpolab.commands.serve",
    "preflight": "grpolab.runtime.preflight",
}
"""What each verb runs: the module, imported when the verb runs (``_module``), so that ``grpolab --help``
and a bad config cost no import of torch. The one lazy import of the command line."""


def _module(key: str):
    return importlib.import_module(VERB_MODULES[key])


_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A ConfigWarning (a setting that does less than it says) on one line, as errors are; others as Python shows them."""
    if issubclass(category, ConfigWarning):
        print(f"grpolab: warning: {one_line(message)}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:  # httpx logs each request at INFO: a judge's would bury the run's lines
        logging.getLogger("httpx").setLevel(logging.WARNING)
    warnings.showwarning = _show_warning
    try:
        return _dispatch(args)
    except GrpolabError as err:
        rank = f"[rank {os.environ['RANK']}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""  # torchrun
        print(f"grpolab: error: {rank}{one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in _DISK_ERRORS:
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(
            f"grpolab: error: {err.strerror}{where}; free space, fix the permissions or choose another "
            "log.output_dir (a checkpoint already written is intact: checkpoints are written atomically)",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as err:
        if NONDETERMINISTIC_OP not in str(err):
            raise
        op = str(err).split(NONDETERMINISTIC_OP)[0].strip()
        print(
            f"grpolab: error: train.deterministic=true, but {op} has no deterministic kernel on this device; "
            "set train.deterministic=false (runs then differ in the last bits) or avoid the setting that uses it",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:  # outside train()'s own handling, e.g. while a model loads
        print("grpolab: interrupted", file=sys.stderr)
        return 130


def _demo(args: argparse.Namespace) -> int:
    # Before torch loads: OpenMP threads that sleep instead of spinning. When other processes share the
    # cores, the default spin-wait makes each backward pass many times slower; idle, the cost is small.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.agent:
        agent = _module("demo --agent")
        out = args.out or "runs/demo-agent"
        agent.agent_config(out, args.size, args.overrides)  # a bad override fails before any work
        agent.print_agent_summary(*agent.run_agent_demo(out, args.size, args.overrides))
        return 0
    demo = _module("demo")
    out = args.out or "runs/demo"
    demo.demo_config(out, args.size, args.overrides)  # a bad override fails before any work
    demo.print_summary(demo.run_demo(out, args.size, args.overrides))
    return 0


def _hacking(args: argparse.Namespace) -> int:
    try:
        return _module("hacking").run_hacking(args)
    except _module("compare").CompareStopped as stopped:
        return _stopped("hacking", stopped, "; its finished runs are kept: the same command continues the grid")


def _export(args: argparse.Namespace) -> int:
    print(f"grpolab: exported {_module('export').export(args.checkpoint, args.out, dtype=args.dtype)}")
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    sources = _module("import-gguf")
    print(f"grpolab: wrote {sources.import_gguf(sources.check_source(args.gguf), args.out)}")
    return 0


def _convert_trl(args: argparse.Namespace) -> int:
    _module("convert-trl").write_trl_conversion(
        args.trl_args, args.out, num_processes=args.num_processes, dataset_rows=args.dataset_rows, strict=args.strict
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    """``grpolab serve``: the config's vLLM server until Ctrl-C (docs/server_mode.md)."""
    cfg = load_config(args.config, _overrides(args))
    _module("preflight").check_model_source(cfg.model)  # a missing model is one line, before vLLM starts
    return _module("serve").serve(cfg)


def _config(cfg, args: argparse.Namespace) -> int:
    print(f"# the config grpolab {args.for_verb} reads (grpolab config --for VERB shows another verb's)")
    print(render_view(cfg, args.for_verb), end="")
    return 0


def _sft(cfg, args: argparse.Namespace) -> int:
    done = _module("sft").sft(cfg, resume=args.resume)
    if done.stopped_by is not None:
        print(
            f"grpolab: SFT stopped by {signal.Signals(done.stopped_by).name} after step {done.steps}; checkpoint "
            f"saved in {done.output_dir}/checkpoints; continue with: grpolab sft --resume (same config)",
            file=sys.stderr,
        )
        return 128 + done.stopped_by
    print(
        f"grpolab: SFT {done.steps} steps, dev accuracy {done.dev_accuracy}, format errors {done.dev_format_errors}; "
        f"saved {done.output_dir}"
    )
    return 0


def _eval(cfg, args: argparse.Namespace) -> int:
    for e in _module("eval").evaluate(cfg):
        _print_eval(e)
    print(f"grpolab: eval written to {cfg.eval_dir}")
    return 0


def _train_rm(cfg, args: argparse.Namespace) -> int:
    rm = _module("train-rm").train_reward_model(cfg)
    accuracy = rm.metrics.get("eval/pair_accuracy")
    print(f"grpolab: reward model saved to {rm.output_dir}; held-out pair accuracy {accuracy}")
    return 0


def _train_iterative(cfg, args: argparse.Namespace) -> int:
    done = _module("train-iterative").iterative_rl(cfg)
    print(f"grpolab: {len(done.iterations)} iterations; policy {done.policy_path}")
    print(f"grpolab: reward model {done.reward_model_path}")
    return 0


WITHOUT_CONFIG: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo, "hacking": _hacking, "export": _export, "import-gguf": _import_gguf, "convert-trl": _convert_trl,
    "serve": _serve,
}  # fmt: skip
"""Verbs that read their own arguments (a packaged config, a checkpoint, a TRL file, or serve's config)."""

WITH_CONFIG: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "config": _config,
    "train": lambda cfg, args: _train(cfg, resume=args.resume),
    "claims": lambda cfg, args: _claims(cfg),
    "compare": lambda cfg, args: _compare(cfg, args.algos),
    "recipe": lambda cfg, args: _recipe(cfg, resume=args.resume),
    "sft": _sft,
    "eval": _eval,
    "train-rm": _train_rm,
    "train-iterative": _train_iterative,
}
"""Verbs that take --config with dotted overrides: the config is loaded (and checked) before the verb runs."""


def _dispatch(args: argparse.Namespace) -> int:
    if args.verb in WITHOUT_CONFIG:
        return WITHOUT_CONFIG[args.verb](args)
    return WITH_CONFIG[args.verb](load_config(args.config, _overrides(args)), args)


def _print_eval(e) -> None:
    k = e.ks[-1]
    print(
        f"grpolab: {e.label}: pass@1 {e.pass_at[1]:.3f}, maj@{k} {e.maj_at[k]:.3f}, "
        f"pass@{k} {e.pass_at[k]:.3f}, greedy {e.greedy_accuracy}"
    )
    if e.gold_mean:
        print(f"grpolab: {e.label}: gold " + ", ".join(f"{n} {v:.3f}" for n, v in e.gold_mean.items()))
def _overrides(args: argparse.Namespace) -> list[str]:
    """The dotted overrides, with ``--resume-allow-change K`` as ``log.resume_allow=[K, ...]``."""
    overrides = list(args.overrides)
    allow = getattr(args, "resume_allow_change", None)
    if allow:
        if not args.resume:
            raise ConfigError("--resume-allow-change only applies with --resume")
        overrides.append(f"log.resume_allow=[{', '.join(allow)}]")
    return overrides


def _stopped_message(result) -> str:
    """What a signal left behind: the checkpoint to resume from, or that none was written."""
    name = signal.Signals(result.stopped_by).name
    last = _module("checkpoint").latest_checkpoint(result.run_dir)
    if last is None:
        return f"grpolab: stopped by {name} before step 1; no checkpoint was written (nothing to resume)"
    return (
        f"grpolab: stopped by {name} after step {result.final_step}; checkpoint saved in {result.run_dir} "
        f"({last.name}); continue with: grpolab train --resume (same config)"
    )


def _train(cfg, *, resume: bool) -> int:
    result = _module("train").train(cfg, resume=resume)
    if result.stopped_by is not None:
        print(_stopped_message(result), file=sys.stderr)
        return 128 + result.stopped_by
    print(f"grpolab: trained to step {result.final_step}; run written to {result.run_dir}")
    return 0


def _claims(cfg) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        report, data = _module("claims").run_claims(cfg)
    except _module("compare").CompareStopped as stopped:  # a signal while a training stage ran
        return _stopped("claims", stopped, "; every finished stage is kept and read back: run the same command again")
    except KeyboardInterrupt:
        print(
            "grpolab: claims interrupted; every finished stage is kept and read back: run the same command again",
            file=sys.stderr,
        )
        return 130
    print(f"grpolab: claims: report written to {report} ({sum(data.seconds.values()) / 60:.1f} min)")
    return 0


def _recipe(cfg, *, resume: bool) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the demo: before torch loads (see _demo)
    recipe = _module("recipe")
    try:
        recipe.print_summary(recipe.run_recipe(cfg, resume=resume))
    except KeyboardInterrupt:
        print(
            "grpolab: recipe interrupted; what it finished is kept (eval_base/eval.json, checkpoints); "
            "continue with: grpolab recipe --resume (same config)",
            file=sys.stderr,
        )
        return 130
    return 0


def _stopped(verb: str, stopped, then: str = "") -> int:
    """A signal stopped a training run of ``verb`` (compare.CompareStopped): one line, exit 128 + the signal."""
    last = _module("checkpoint").latest_checkpoint(stopped.run_dir)
    saved = f"its checkpoint: {last}" if last else "it had written no checkpoint yet"
    skipped = f"; not started: {', '.join(stopped.skipped)}" if stopped.skipped else ""
    name = signal.Signals(stopped.signum).name
    print(f"grpolab: {verb} stopped by {name} during {stopped.algo} ({saved}){skipped}{then}", file=sys.stderr)
    return 128 + stopped.signum


def _compare(cfg, algos_arg: str) -> int:
    commands = _module("compare")
    algos = [a.strip() for a in algos_arg.split(",") if a.strip()]
    commands.validate_algos(cfg, algos)  # a ConfigError: the one-line path, before anything runs
    try:
        result = commands.compare(cfg, algos)
    except commands.CompareStopped as stopped:
        return _stopped("compare", stopped)
    print(f"grpolab: compared {', '.join(algos)}; report written to {result.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
