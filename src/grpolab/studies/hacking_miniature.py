"""The hacking miniature (``grpolab hacking --miniature``): reward-model overoptimisation on a CPU, in minutes.

Built from the embedded default's pieces (grpolab/configs/demo.yaml, the demo's tiny model and SFT start):

1. the demo's tiny model, SFT'd on reversed 3-digit addition to greedy dev accuracy 0.65 (``<out>/sft``);
2. ``train-rm`` from the SFT model on a deliberately narrow preference set
   (tasks.preferences.length_shortcut_pairs: chosen = the answer, rejected = the answer less one digit),
   so the reward model can rank every pair by length alone (``<out>/reward_model``);
3. GRPO against that reward model (the proxy) with exact match as the gold reward, for each beta and
   seed of the grid (studies/hacking.py), then the report (studies/hacking_report.py) in ``<out>/report.md``.

Room to exploit the shortcut: rollout.max_completion_length is 8 (the demo's 5 fits the 4-digit sums).
A stage whose output folder already exists is reused (delete it to redo it): the grid can be rerun, or
extended, without the minutes of SFT and reward-model training.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpolab import jsonio
from grpolab.commands.demo import SIZES, demo_config
from grpolab.commands.packaged import with_model
from grpolab.commands.sft import sft
from grpolab.commands.train_rm import train_reward_model
from grpolab.config import Config, config_to_dict, derive
from grpolab.data import load_examples, split_eval
from grpolab.runtime.logging import read_metrics
from grpolab.studies.hacking import grid_configs, hacking
from grpolab.tasks.preferences import length_shortcut_pairs
from grpolab.tasks.tiny import save_tiny

log = logging.getLogger(__name__)

OVERRIDES = [
    "data.eval_size=200",
    "rollout.num_generations=8",
    "rollout.max_completion_length=8",
    "train.num_steps=150",
    "train.prompts_per_step=16",
    "train.micro_batch_size=128",
    "log.checkpoint_every=0",
    "reward.gold=[{name: exact_match, kwargs: {extract: none}}]",
    "reward_model.epochs=2",
    "reward_model.batch_size=32",
    "reward_model.lr=1.0e-3",
    "reward_model.max_length=32",
    "sft.target_accuracy=0.3",
    "sft.check_every=10",
]
"""On top of demo.yaml: a smaller step (16 prompts x 8), room for longer answers, and the SFT stop the
miniature has always run with (greedy dev accuracy 0.3, checked every 10 steps; the demo now stops
earlier, docs/demo.md)."""

NUM_PAIRS = 2000
DEFAULT_BETAS = (0.0, 0.04)
DEFAULT_SEEDS = (0, 1, 2)


def miniature_config(out_dir: str | Path, overrides: Sequence[str] = ()) -> Config:
    """The miniature's base config: demo.yaml, OVERRIDES, the output folder, then the caller's overrides."""

    return demo_config(out_dir, "full", [*OVERRIDES, *overrides])


def run_miniature(
    out_dir: str | Path = "runs/hacking_mini",
    betas: Sequence[float] = DEFAULT_BETAS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    overrides: Sequence[str] = (),
):
    """SFT, the narrow reward model, then the (beta, seed) grid of GRPO runs and the report."""

    base = miniature_config(out_dir, overrides)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    sft_dir, sft_note = _sft_stage(base)
    seconds["sft"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    rm_dir, rm_note = _reward_model_stage(base, sft_dir)
    seconds["reward model"] = time.perf_counter() - t1
    proxy = {**config_to_dict(base.reward.gold[0]), "name": "reward_model", "kwargs": {"path": str(rm_dir)}}
    cfg = derive(base, {"model.name_or_path": str(sft_dir), "reward.functions": [proxy]})
    grid_configs(cfg, betas, seeds)  # a bad grid fails before the GRPO runs
    setup = {"SFT": sft_note, "reward model": rm_note, **_grpo_lines(cfg)}
    t2 = time.perf_counter()
    result = hacking(
        cfg, betas, seeds, title="grpolab hacking miniature: a length-biased reward model", setup=setup
    )
    seconds["grpo grid"] = time.perf_counter() - t2
    log.info("hacking miniature: %s", ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    return result


def _sft_stage(base: Config) -> tuple[Path, str]:

    if (base.sft_dir / "config.json").exists():
        log.warning("reusing the SFT model in %s (delete it to train it again)", base.sft_dir)
    else:
        init = save_tiny(base.run_dir / "init_model", seed=base.seed, **SIZES["full"][0])
        done = sft(with_model(base, init), resume=True)
        if done.stopped_by is not None:  # Ctrl-C: the SFT checkpoint is saved; a rerun continues it
            raise KeyboardInterrupt
    return base.sft_dir, _sft_note(base.sft_dir)


def _sft_note(sft_dir: Path) -> str:
    """What the SFT folder's metrics.jsonl says: steps taken and the last greedy dev accuracy."""

    rows = read_metrics(sft_dir)
    dev = [r["sft/dev_greedy_accuracy"] for r in rows if "sft/dev_greedy_accuracy" in r]
    steps = rows[-1]["step"] if rows else "?"
    return f"the demo's tiny model, {steps} SFT steps, greedy dev accuracy {dev[-1] if dev else 'n/a'} ({sft_dir})"


def _reward_model_stage(base: Config, sft_dir: Path) -> tuple[Path, str]:

    rm_cfg = base.reward_model
    out = base.reward_model_dir
    path = base.run_dir / "rm_pairs.jsonl"
    if (out / "config.json").exists() and path.exists():
        log.warning("reusing the reward model in %s (delete it to train it again)", out)
        return out, _rm_note(out, path, rm_cfg.epochs)
    examples, _ = split_eval(load_examples(base.data, seed=base.seed), base.data.eval_size)
    pairs = length_shortcut_pairs(examples[:NUM_PAIRS], seed=base.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(jsonio.dumps(p) + "\n" for p in pairs))
    train_reward_model(derive(base, {"reward_model.base_model": str(sft_dir), "reward_model.data_path": str(path)}))
    return out, _rm_note(out, path, rm_cfg.epochs)


def _rm_note(out: Path, pairs_path: Path, epochs: int) -> str:
    """What the reward-model folder's eval.json says, and how many pairs it learned from."""
    metrics = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else {}
    num_pairs = len(pairs_path.read_text().splitlines())
    return (
        f"train-rm from the SFT model on {num_pairs} pairs (chosen = the sum, rejected = the sum less one "
        f"digit: one character shorter), {epochs} epochs; held-out pair accuracy "
        f"{metrics.get('eval/pair_accuracy', 'n/a')}, mean margin {metrics.get('eval/margin_mean', float('nan')):.2f}"
    )


def _grpo_lines(cfg: Config) -> dict[str, Any]:
    t, r = cfg.train, cfg.rollout
    return {
        "task": "reversed 3-digit addition (demo.yaml), policy = the SFT model",
        "proxy": "the reward model's score (reward.functions)",
        "gold": "exact match of the sum (reward.gold), logged on the same samples, never trained on",
        "GRPO": f"{t.num_steps} steps of {t.prompts_per_step} prompts x G={r.num_generations}, lr {cfg.optim.lr:g}, "
        f"mu {cfg.algo.mu}, T={r.temperature:g}, max_completion_length {r.max_completion_length}",
    }
