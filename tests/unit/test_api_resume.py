"""The Python API in one process: ``train()`` then ``train(resume_from_checkpoint=True)`` (the first run's reward
worker, a fork, must not keep the run directory's lock), and a dataset column that would be replaced by the
model's completions is refused before any model loads."""

from __future__ import annotations

import json

import pytest

from grpolab.api import GRPOTrainer
from grpolab.rewards import RewardError
from grpolab.rewards.worker import _WORKERS

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(2) for b in range(2)]


def matches(completions, solution, **kwargs):
    return [float(c.strip() == s) for c, s in zip(completions, solution, strict=True)]


def _args(out, steps: int) -> dict:
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 3},
        "train": {"num_steps": steps, "prompts_per_step": 2},
        "log": {"output_dir": str(out), "run_name": "api", "progress": False, "checkpoint_every": 1},
        "reward": {"dry_run_examples": 1},
    }


def test_train_then_resume_in_one_process(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(tiny_model_dir, matches, args=_args(tmp_path, 1), train_dataset=ROWS)
    first = trainer.train()
    assert first.final_step == 1
    assert any(w.pid for w in _WORKERS.values())  # the reward ran in a forked worker, still alive
    again = trainer.train(resume_from_checkpoint=True)  # was: "in use by another run"
    assert again.final_step == 1
    more = GRPOTrainer(tiny_model_dir, matches, args=_args(tmp_path, 2), train_dataset=ROWS)
    assert more.train(resume_from_checkpoint=True).final_step == 2
    steps = [json.loads(line)["step"] for line in (tmp_path / "api" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


@pytest.mark.parametrize("column", ["completions", "prompts", "completion_ids"])
def test_a_column_named_like_a_trl_argument_is_refused(column, tmp_path):
    rows = [{**r, column: "the reference"} for r in ROWS]
    with pytest.raises(RewardError, match=rf"train_dataset has a column named '{column}'.*Rename the column"):
        GRPOTrainer("some/model", matches, args=_args(tmp_path, 1), train_dataset=rows)  # before the model loads


def test_a_grpolab_reward_may_have_a_completions_column(tmp_path, tiny_model_dir):
    rows = [{**r, "completions": "kept"} for r in ROWS]
    trainer = GRPOTrainer(tiny_model_dir, lambda completion, example: 1.0, args=_args(tmp_path, 1), train_dataset=rows)
    assert trainer.train_dataset[0].meta["row"]["completions"] == "kept"


def test_adaptive_entropy_resumes_its_coefficient(tiny_model_dir, tmp_path):
    """The controller's coefficient and last entropy are in the checkpoint: a resumed run goes on moving them
    (an entropy target above any entropy: +delta per step, and the bonus applies from step 2 on)."""
    adaptive = {"entropy_adaptive": True, "entropy_coef": 0.01, "entropy_target": 100.0, "entropy_coef_delta": 0.005}
    trainer = GRPOTrainer(tiny_model_dir, matches, args={**_args(tmp_path, 1), "algo": adaptive}, train_dataset=ROWS)
    assert trainer.entropy_coef == 0.01  # before any step: the starting coefficient
    trainer.train()
    assert trainer.entropy_coef == pytest.approx(0.015)
    more = GRPOTrainer(tiny_model_dir, matches, args={**_args(tmp_path, 2), "algo": adaptive}, train_dataset=ROWS)
    more.train(resume_from_checkpoint=True)
    assert more.entropy_coef == pytest.approx(0.02)  # 0.01 + 2 x 0.005: the first step's move was kept
    rows = [json.loads(line) for line in (tmp_path / "api" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss/entropy_coef_next"] for r in rows] == pytest.approx([0.015, 0.02])
