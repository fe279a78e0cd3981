"""A neural reward model end to end: ``grpolab train-rm`` learns a preference task, GRPO is rewarded by it,
iterative RL alternates the two, and process supervision trains a tiny policy.

The preference task is ``max(3,8,1)=`` (max_digit.py): rejected answers are half smaller digits
of the list and half larger digits absent from it, so a rule that ignores the prompt gets 0.60 on the held-out pairs; the
held-out prompts are never seen in training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from max_digit import max_digit_examples, max_digit_preference_pairs, prompt_blind_accuracy

from grpolab.commands.iterative import iterative_rl
from grpolab.commands.train import train
from grpolab.commands.train_rm import read_pairs, split_pairs
from grpolab.config import load_config
from grpolab.rewards import build_reward, score_batch
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics
from grpolab.types import Completion

HERE = Path(__file__).parent


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_max_digit_pairs_defeat_prompt_blind_rules():
    rows = max_digit_preference_pairs(size=200, seed=0)
    assert all(r["chosen"] == max(r["prompt"][4:-2].split(",")) != r["rejected"] for r in rows)
    assert prompt_blind_accuracy(rows) < 0.65  # lists holding 9 have no larger absent digit


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("max_task")
    prompts = [{"prompt": e.prompt, "answer": e.answer} for e in max_digit_examples(size=32, seed=1)]
    return {
        "root": root,
        "pairs": jsonl(root / "pairs.jsonl", max_digit_preference_pairs(size=300, seed=0)),
        "prompts": jsonl(root / "prompts.jsonl", prompts),
        "history": jsonl(root / "history.jsonl", max_digit_preference_pairs(size=50, seed=3)),
    }


@pytest.fixture(scope="module")
def trained_rm(task, tiny_model_dir) -> dict:
    """``grpolab train-rm`` through the CLI, from the tiny causal LM (its one-output head is new)."""
    out = task["root"] / "runs"
    cmd = [
        sys.executable, "-m", "grpolab", "--log-level", "WARNING", "train-rm",
        f"reward_model.base_model={tiny_model_dir}", f"reward_model.data_path={task['pairs']}",
        "reward_model.epochs=10", "reward_model.lr=1e-3", "reward_model.batch_size=16",
        "reward_model.eval_fraction=0.2", f"log.output_dir={out}", "log.run_name=rm",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a 100k-parameter model: one thread is fastest
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = out / "rm" / "reward_model"
    assert f"reward model saved to {folder}" in done.stdout
    history = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {"path": str(folder), "history": history}


def test_train_rm_beats_chance_and_prompt_blind_rules_on_held_out_prompts(trained_rm, task):
    _, held_out = split_pairs(read_pairs(task["pairs"]), 0.2, seed=0)
    blind = prompt_blind_accuracy([p.__dict__ for p in held_out])
    first, last = trained_rm["history"][0], trained_rm["history"][-1]
    assert len(held_out) == 60 and blind <= 0.6  # measured: 0.60
    assert first["epoch"] == 0 and first["eval/pair_accuracy"] < 0.6  # untrained head: about chance
    # measured: 0.967 (58 of 60 held-out prompts) after 10 epochs
    assert last["eval/pair_accuracy"] >= 0.85, trained_rm["history"]
    assert last["train/loss"] < first["eval/loss"]


def test_saved_model_is_a_reward_that_prefers_the_right_answer(trained_rm):
    wr = build_reward("reward_model", kwargs={"path": trained_rm["path"], "batch_size": 3})
    assert wr.reward.num_parameters > 0
    examples = max_digit_examples(size=40, seed=7)[-20:]  # seed 7: not the training lists
    right = [Completion(e.answer, 1) for e in examples]
    wrong = [Completion(str(min(e.meta["digits"])), 1) for e in examples]
    scores = score_batch([wr], right + wrong, examples + examples, timeout_s=None).components["reward_model"]
    wins = sum(r > w for r, w in zip(scores[:20], scores[20:], strict=True))
    assert wins >= 16


def _grpo(task, policy, run_name, out, *extra):
    return [
        f"model.name_or_path={policy}",
        f"data.path={task['prompts']}",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "train.micro_batch_size=8",
        "optim.lr=1e-3",
        f"log.output_dir={out}",
        f"log.run_name={run_name}",
        "log.progress=false",
        "log.tensorboard=false",
        *extra,
    ]


def test_grpo_is_rewarded_by_the_trained_reward_model(trained_rm, task, tiny_model_dir, tmp_path):
    reward = f"reward.functions=[{{name: reward_model, kwargs: {{path: '{trained_rm['path']}'}}}}]"
    result = train(load_config(None, _grpo(task, tiny_model_dir, "grpo_rm", tmp_path, reward)))
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # the only reward, weight 1: the same mean, one in float64 over the scores, one over float32 totals
    assert all(
        r["rewards/reward_model/mean"] == pytest.approx(r["reward"], rel=1e-5, abs=1e-6) for r in rows
    )
    assert rows[0]["reward_std"] > 0  # a real score, not a constant
    info = json.loads((result.run_dir / "run_info.json").read_text())
    assert info["models"]["reward"] > 0


def test_iterative_rl_two_iterations(trained_rm, task, tiny_model_dir, tmp_path):
    overrides = _grpo(
        task,
        tiny_model_dir,
        "iter",
        tmp_path,
        f"reward.functions=[{{name: reward_model, kwargs: {{path: '{trained_rm['path']}'}}}}]",
        "iterative.iterations=2",
        "iterative.steps_per_iteration=2",
        "iterative.label_rewards=[{name: 'toy_rewards:digit_fraction'}]",
        "iterative.pairs_per_group=2",
        f"reward_model.data_path={task['history']}",
        "reward_model.epochs=1",
        "reward_model.lr=1e-3",
        "reward_model.eval_fraction=0.0",
    )
    result = iterative_rl(load_config(None, overrides))
    first, second = result.iterations
    assert first["replayed_pairs"] == 5  # 10% of the 50 historical comparisons
    assert first["new_pairs"] > 0 and second["replayed_pairs"] == round(0.1 * (50 + first["new_pairs"]))
    made = (tmp_path / "iter" / "iter_1" / "rm_comparisons.jsonl").read_text().splitlines()
    assert len(made) == first["new_pairs"] + 5
    # iteration 2 starts from iteration 1's policy (its reference) and is rewarded by the updated model
    cfg2 = load_config(tmp_path / "iter" / "iter_2" / "config.yaml")
    assert cfg2.model.name_or_path == first["policy"] == str(latest_checkpoint(tmp_path / "iter" / "iter_1"))
    assert cfg2.reward.functions[0].kwargs["path"] == first["reward_model"]["path"]
    assert result.reward_model_path == tmp_path / "iter" / "iter_2" / "reward_model"
    assert (result.reward_model_path / "model.safetensors").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "iter" / "iter_2")] == [1, 2]


def test_process_supervision_trains_end_to_end(task, tiny_model_dir, tmp_path):
    overrides = _grpo(
        task,
        tiny_model_dir,
        "ps",
        tmp_path,
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "algo.supervision=process",
        "reward.process={name: 'toy_rewards:digit_steps', delimiter: ','}",
        "rollout.max_completion_length=8",
    )
    result = train(load_config(None, overrides))
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/steps_mean"] >= 1 and 0 <= r["train/step_reward_mean"] <= 1 for r in rows)
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(abs(s["advantage"]) > 0 for s in samples)


def test_a_raising_process_reward_stops_before_any_step(task, tiny_model_dir, tmp_path):
    from grpolab.rewards import RewardError

    overrides = _grpo(
        task,
        tiny_model_dir,
        "ps_bad",
        tmp_path,
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "algo.supervision=process",
        "reward.process={name: 'toy_rewards:broken_steps', delimiter: ','}",
    )
    with pytest.raises(
        RewardError, match=r"process reward 'broken_steps' raised KeyError on example 0 \(prompt: 'max\("
    ):
        train(load_config(None, overrides))
    assert read_metrics(tmp_path / "ps_bad") == []
