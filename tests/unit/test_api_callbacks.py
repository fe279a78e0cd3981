"""transformers TrainerCallbacks given to GRPOTrainer (grpolab.api_callbacks), periodic evaluation during
train(), and the trainer's reward attributes."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from grpolab.api import GRPOTrainer
from grpolab.errors import ConfigError

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(2) for b in range(2)]


def one_per_char(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _args(out, steps: int, **more) -> dict:
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 3},
        "train": {"num_steps": steps, "prompts_per_step": 2},
        "log": {"output_dir": str(out), "run_name": "api", "progress": False, "checkpoint_every": 0},
        "reward": {"dry_run_examples": 1},
        **more,
    }


class Recorder(TrainerCallback):
    """Records each event with the step it saw; stops after ``stop_at`` steps when given."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.logs: list[dict] = []
        self.stop_at = stop_at

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("train_begin", state.global_step))
        assert isinstance(kwargs["model"], torch.nn.Module)

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))
        if self.stop_at is not None and state.global_step >= self.stop_at:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step))
        self.logs.append(logs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.events.append(("evaluate", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


def test_callbacks_see_each_step_and_the_end(tiny_model_dir, tmp_path):
    recorder = Recorder()
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path, 2), train_dataset=ROWS, callbacks=[recorder])
    trainer.train()
    assert recorder.events == [
        ("train_begin", 0), ("step_end", 1), ("log", 1), ("step_end", 2), ("log", 2), ("log", 2), ("train_end", 2)
    ]  # fmt: skip
    assert "reward" in recorder.logs[0] and "train_loss" in recorder.logs[-1]  # a step's metrics, then the end row


def test_should_training_stop_ends_the_run_after_that_step(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path, 3), train_dataset=ROWS, callbacks=[Recorder(stop_at=1)])
    result = trainer.train()
    assert result.final_step == 1 and result.stopped_by is None
    assert [p.name for p in (tmp_path / "api" / "checkpoints").iterdir()] == ["step_1"]  # checkpoint_every=0: the stop's


def test_eval_steps_evaluates_during_training(tiny_model_dir, tmp_path):
    recorder = Recorder()
    trainer = GRPOTrainer(
        tiny_model_dir, one_per_char, args=_args(tmp_path, 2, eval={"every": 2}), train_dataset=ROWS,
        eval_dataset=ROWS[:1], callbacks=[recorder],
    )  # fmt: skip
    trainer.train()
    assert ("evaluate", 2) in recorder.events and ("evaluate", 1) not in recorder.events
    steps = [(row["step"], "eval_reward" in row) for row in trainer.state.log_history]
    assert steps[:3] == [(1, False), (2, False), (2, True)]  # the eval row after its step's, as TRL's history


def test_a_callback_that_is_not_one_is_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"callbacks\[0\] is a function: give a transformers.TrainerCallback"):
        GRPOTrainer(tiny_model_dir, one_per_char, train_dataset=ROWS, callbacks=[one_per_char])


def test_reward_names_and_weights_as_trl(tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir, [one_per_char, "r1_format"], train_dataset=ROWS, reward_weights=[1.0, 0.5])
    assert trainer.reward_func_names == ["one_per_char", "r1_format"]
    torch.testing.assert_close(trainer.reward_weights, torch.tensor([1.0, 0.5]))
