"""Iterative RL with GRPO (DeepSeekMath Sec. 4.1.4, Algorithm 1, arXiv 2402.03300).

    for iteration i = 1..I:
        pi_ref <- pi_theta
        M GRPO steps, rewarded by the reward model r_phi
        r_phi <- continual training on comparisons from the policy's samples, replaying 10% of history

Composed from ``train`` and ``train_reward_model``: iteration i is one ``train()`` run (in
``<run_dir>/iter_<i>``) whose ``model.name_or_path`` is the previous iteration's final checkpoint, so the
reference train() builds is that policy (the reset of Algorithm 1). Its reward is the
``reward.functions`` entry named ``reward_model``, pointed at the latest reward model.

Choices where the paper is silent (and why):
* New comparisons come from the iteration's own samples (samples.jsonl holds every completion of every
  step). In each group (a prompt at a step) completions are ranked by ``iterative.label_rewards``, a
  rule or gold signal, never the reward model being trained (it would only confirm itself); the pairs
  are best vs worst, second-best vs second-worst, ..., up to ``pairs_per_group``, ties skipped.
* "a replay mechanism that incorporates 10% of historical data": each update draws a fresh random
  ``replay_fraction`` of all earlier comparisons (``reward_model.data_path``, if set, and the new ones of
  every earlier iteration) and trains on them with the new ones, starting from the current reward model.
* Each iteration's train() starts a fresh optimizer and schedule and uses seed + i - 1, so iterations
  draw different prompt orders.
* LoRA is refused: the reference of a LoRA run is the adapter-disabled base, not the previous policy.
"""

from __future__ import annotations

import json
import logging
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab import jsonio
from grpolab.commands.train import train
from grpolab.commands.train_rm import PreferencePair, read_pairs, train_reward_model, write_pairs
from grpolab.config import Config, ConfigError, config_to_dict, derive
from grpolab.data import load_examples
from grpolab.rewards import WeightedReward, build_rewards, score_batch
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.types import Completion, Example

log = logging.getLogger(__name__)


@dataclass
class IterativeResult:
    run_dir: Path
    policy_path: Path
    """The final policy checkpoint."""
    reward_model_path: Path
    """The final reward model folder."""
    iterations: list[dict[str, Any]] = field(default_factory=list)
    """Per iteration: its run folder, policy, comparisons made and replayed, reward-model metrics."""


def iterative_rl(cfg: Config) -> IterativeResult:
    """Alternate GRPO on the policy and continual training of the reward model (see the module docstring)."""
    it = cfg.iterative
    rm_index = _reward_model_index(cfg)
    if not it.label_rewards:
        raise ConfigError(
            "iterative.label_rewards is empty: name the rule or gold reward that ranks a group's completions "
            "to make new comparisons, e.g. iterative.label_rewards=[{name: exact_match}]"
        )
    if cfg.model.lora.enabled:
        raise ConfigError(
            "iterative RL resets the reference to the policy, which LoRA cannot: set model.lora.enabled=false"
        )
    labels = build_rewards(it.label_rewards, key="iterative.label_rewards")  # ConfigError naming the entry
    history = read_pairs(cfg.reward_model.data_path) if cfg.reward_model.data_path else []
    policy = cfg.model.name_or_path
    rm_path = str(cfg.reward.functions[rm_index].kwargs["path"])
    rng = random.Random(cfg.seed)
    done: list[dict[str, Any]] = []
    for i in range(1, it.iterations + 1):
        icfg = _iteration_config(cfg, i, policy, rm_path, rm_index)
        result = train(icfg)
        policy = str(latest_checkpoint(result.run_dir))
        examples = {e.prompt: e for e in load_examples(icfg.data, seed=icfg.seed)}
        rows = _read_samples(result.run_dir / "samples.jsonl")
        new = comparisons_from_samples(
            rows, examples, labels, pairs_per_group=it.pairs_per_group, timeout_s=cfg.reward.timeout_s
        )
        replay = rng.sample(history, round(it.replay_fraction * len(history)))
        summary = {"iteration": i, "run_dir": str(result.run_dir), "policy": policy, "new_pairs": len(new)}
        summary.update(
            {"replayed_pairs": len(replay), "reward": result.last_metrics.get("reward")}
        )
        if new:
            rm_path, rm_metrics = _update_reward_model(cfg, i, rm_path, [*new, *replay], result.run_dir)
            summary["reward_model"] = {"path": rm_path, **rm_metrics}
        else:
            log.warning("iteration %d: every group tied on the label rewards; the reward model is kept", i)
        history.extend(new)
        done.append(summary)
        log.info("iterative RL: %s", json.dumps(summary))
    (cfg.run_dir / "iterative.json").write_text(jsonio.dumps(done, indent=2) + "\n")
    return IterativeResult(cfg.run_dir, Path(policy), Path(rm_path), done)


def _reward_model_index(cfg: Config) -> int:
    found = [i for i, s in enumerate(cfg.reward.functions) if s.name == "reward_model"]
    if len(found) != 1 or "path" not in cfg.reward.functions[found[0]].kwargs:
        raise ConfigError(
            "iterative RL updates a neural reward model: reward.functions needs exactly one entry "
            "{name: reward_model, kwargs: {path: <folder from grpolab train-rm>}}"
        )
    return found[0]


def _iteration_config(cfg: Config, i: int, policy: str, rm_path: str, rm_index: int) -> Config:
    """Iteration i's train() config: start from ``policy`` (so pi_ref = it), reward by ``rm_path``."""
    functions = config_to_dict(cfg.reward.functions)
    functions[rm_index]["kwargs"] = {**functions[rm_index]["kwargs"], "path": rm_path}
    return derive(
        cfg,
        {
            "model.name_or_path": policy,
            "reward.functions": functions,
            "train.num_steps": cfg.iterative.steps_per_iteration,
            "log.output_dir": str(cfg.run_dir),  # the iterations' runs in the run's folder: <run>/iter_<i>
            "log.run_name": f"iter_{i}",
            "log.samples_every": 1,
            "seed": cfg.seed + i - 1,
        },
    )


def _update_reward_model(cfg: Config, i: int, rm_path: str, pairs, run_dir: Path) -> tuple[str, dict]:
    """Continue training the reward model at ``rm_path`` on ``pairs``; returns the new folder and metrics."""
    data = run_dir / "rm_comparisons.jsonl"
    write_pairs(data, pairs)
    changes = {
        "reward_model.base_model": rm_path,
        "reward_model.tokenizer": None,
        "reward_model.data_path": str(data),
        "reward_model.output_dir": str(run_dir / "reward_model"),
        "seed": cfg.seed + i - 1,
    }
    result = train_reward_model(derive(cfg, changes))
    return str(result.output_dir), result.metrics


def _read_samples(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def comparisons_from_samples(
    rows: Sequence[dict[str, Any]],
    examples: dict[str, Example],
    labels: Sequence[WeightedReward],
    *,
    pairs_per_group: int,
    timeout_s: float | None,
) -> list[PreferencePair]:
    """Pairs (higher-labelled, lower-labelled completion) of the same prompt at the same step."""
    rows = [r for r in rows if r["prompt"] in examples]
    completions = [
        Completion(
            r["completion"], int(r.get("num_tokens", len(r["completion"]))), r.get("finish_reason", "stop")
        )
        for r in rows
    ]
    scored = score_batch(
        labels, completions, [examples[r["prompt"]] for r in rows], timeout_s=timeout_s
    ).total
    groups: dict[tuple[int, str], list[tuple[float, str]]] = defaultdict(list)
    for row, label in zip(rows, scored, strict=True):
        if label is not None:
            groups[(row["step"], row["prompt"])].append((label, row["completion"]))
    pairs = []
    for (_, prompt), members in groups.items():
        ranked = sorted(members, key=lambda m: -m[0])
        for (hi, chosen), (lo, rejected) in list(zip(ranked, reversed(ranked), strict=True))[
            :pairs_per_group
        ]:
            if hi > lo and chosen != rejected:
                pairs.append(PreferencePair(prompt, chosen, rejected))
    return pairs
