"""Gold rewards (reward.gold) are scored and logged on every step but never change an update."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from grpolab.config import ConfigError, load_config
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics
from grpolab.commands.train import train

GOLD = "reward.gold=[{name: exact_match}, {name: 'toy_rewards:digit_fraction', weight: 0.5}]"


def _overrides(model_dir, dataset, out, name, *extra) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "train.micro_batch_size=8",
        "optim.lr=1e-3",
        f"log.output_dir={out}",
        f"log.run_name={name}",
        "log.checkpoint_every=0",
        "log.progress=false",
        "log.tensorboard=false",
        *extra,
    ]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_gold_rewards_are_logged_but_leave_the_updates_unchanged(
    tiny_model_dir, addition_jsonl, tmp_path, algo
):
    data = addition_jsonl(64)
    extra = ["algo.beta=0.0"] if algo == "grpo" else ["algo.name=ppo", "algo.beta=0.04"]
    runs = {}
    for name, gold in (("plain", []), ("gold", [GOLD])):
        cfg = load_config(None, _overrides(tiny_model_dir, data, tmp_path, name, *extra, *gold))
        runs[name] = train(cfg).run_dir
    plain = load_file(latest_checkpoint(runs["plain"]) / "model.safetensors")
    gold = load_file(latest_checkpoint(runs["gold"]) / "model.safetensors")
    # Same code path, same seed, one thread: the gold scoring and the measurement-only reference
    # (beta = 0) touch no RNG and no tensor of the update, so the weights are bit-identical.
    assert plain.keys() == gold.keys() and all(torch.equal(plain[k], gold[k]) for k in plain)
    rows_plain, rows_gold = read_metrics(runs["plain"]), read_metrics(runs["gold"])
    assert [r["reward"] for r in rows_plain] == [r["reward"] for r in rows_gold]
    assert not any(k.startswith("train/gold") or k == "train/kl_seq" for k in rows_plain[0])
    for row in rows_gold:
        em, frac = row["train/gold/exact_match"], row["train/gold/digit_fraction"]
        assert 0 <= em <= 1 and 0 <= frac <= 1
        assert row["train/gold_total"] == pytest.approx(em + 0.5 * frac)
        # the proxy here is digit_fraction itself: the gold copy scores the same completions
        assert frac == pytest.approx(row["reward"])
        assert abs(row["train/kl_seq"]) < 50
    # step 1 samples from the reference itself: only autocast rounding separates the two log-probs
    assert abs(rows_gold[0]["train/kl_seq"]) < 0.05
    samples = [json.loads(line) for line in (runs["gold"] / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 8 and all("gold" in s for s in samples)
    step1 = [s["gold"] for s in samples if s["step"] == 1]
    assert sum(step1) / len(step1) == pytest.approx(rows_gold[0]["train/gold_total"])


def test_measure_kl_alone_logs_the_kl_without_gold(tiny_model_dir, addition_jsonl, tmp_path):
    cfg = load_config(
        None,
        _overrides(
            tiny_model_dir, addition_jsonl(64), tmp_path, "kl", "algo.beta=0.0", "reward.measure_kl=true"
        ),
    )
    rows = read_metrics(train(cfg).run_dir)
    assert all("train/kl_seq" in r for r in rows) and not any(k.startswith("train/gold") for k in rows[0])


def test_a_bad_gold_reward_names_its_key(tiny_model_dir, addition_jsonl, tmp_path):
    cfg = load_config(
        None,
        _overrides(tiny_model_dir, addition_jsonl(64), tmp_path, "bad", "reward.gold=[{name: exact_mach}]"),
    )
    with pytest.raises(ConfigError, match=r"reward.gold\[0\].*did you mean 'exact_match'"):
        train(cfg)
