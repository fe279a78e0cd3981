"""GRPOTrainer.evaluate() (grpolab.api_eval): TRL's eval_* statistics, hand-computed, and an evaluation of the
tiny model on an eval_dataset."""

from __future__ import annotations

import math

import pytest

from grpolab.api import GRPOTrainer
from grpolab.api_eval import trl_eval_metrics
from grpolab.data import DataError
from grpolab.errors import ConfigError

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(2) for b in range(2)]


def test_the_statistics_are_trls():
    # two groups of 2: rewards [1, 3] and [2, 2]; one completion of the second group has no "fmt" reward
    got = trl_eval_metrics(
        [1.0, 3.0, 2.0, 2.0],
        {"acc": [1.0, 3.0, 2.0, 2.0], "fmt": [0.0, 1.0, None, 1.0]},
        lengths=[4, 8, 2, 6],
        truncated=[False, True, False, False],
        num_generations=2,
    )
    assert got["reward"] == pytest.approx(2.0)
    assert got["reward_std"] == pytest.approx(math.sqrt(2 / 3))  # unbiased: squares 1+1+0+0 over n-1 = 3
    assert got["frac_reward_zero_std"] == pytest.approx(0.5)  # the second group
    assert got["rewards/fmt/mean"] == pytest.approx(2 / 3)  # the None left out
    assert got["rewards/fmt/std"] == pytest.approx(math.sqrt((4 / 9 + 1 / 9 + 1 / 9) / 2))  # 0, 1, 1 about 2/3
    assert (got["completions/mean_length"], got["completions/min_length"], got["completions/max_length"]) == (5.0, 2.0, 8.0)
    assert got["completions/clipped_ratio"] == pytest.approx(0.25)
    assert got["completions/mean_terminated_length"] == pytest.approx(4.0)  # 4, 2, 6


def _args(out, **eval_keys) -> dict:
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 3},
        "train": {"num_steps": 1, "prompts_per_step": 2},
        "log": {"output_dir": str(out), "run_name": "api", "progress": False},
        "reward": {"dry_run_examples": 1},
        **({"eval": eval_keys} if eval_keys else {}),
    }


def one_per_char(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_evaluate_samples_num_generations_per_eval_prompt(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path, num_samples=3), train_dataset=ROWS, eval_dataset=ROWS[:2])
    assert trainer.num_generations_eval == 3  # eval.num_samples, TRL's num_generations_eval
    trainer.model.train()  # as between training steps
    metrics = trainer.evaluate()
    assert metrics["eval_samples_per_second"] * metrics["eval_runtime"] == pytest.approx(6)  # 2 prompts x 3
    # the reward is the completion's character count: its mean is positive, its bound the 3 tokens' text
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/one_per_char/mean"])
    assert 0 < metrics["eval_completions/mean_length"] <= 3
    # TRL's eval loss: at the sampling weights the ratio is 1, so grpo's per-sequence mean of -A averages each
    # group's advantages, which sum to 0, and the policy is still its reference (KL 0): 0 to rounding
    assert metrics["eval_loss"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.model.training  # sampled in eval mode, then left as it was found


def test_num_generations_eval_defaults_to_num_generations(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path), train_dataset=ROWS)
    assert trainer.num_generations_eval == 2
    with pytest.raises(ConfigError, match="evaluate\\(\\) needs an eval_dataset"):
        trainer.evaluate()
    assert trainer.evaluate(ROWS[:1], metric_key_prefix="test")["test_samples_per_second"] > 0


def test_a_dict_of_eval_datasets_and_streams_are_evaluated_each_under_its_name(tiny_model_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    stream = datasets.Dataset.from_list(ROWS[:2]).to_iterable_dataset()
    given = datasets.DatasetDict({"small": datasets.Dataset.from_list(ROWS[:1]), "pair": datasets.Dataset.from_list(ROWS[:2])})
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path), train_dataset=ROWS, eval_dataset=given)
    assert trainer.eval_dataset is given  # TRL's attribute: what was given
    metrics = trainer.evaluate()
    # transformers' names for a dict: eval_<name>_<metric>; 1 and 2 prompts x num_generations 2
    assert metrics["eval_small_samples_per_second"] * metrics["eval_small_runtime"] == pytest.approx(2)
    assert metrics["eval_pair_samples_per_second"] * metrics["eval_pair_runtime"] == pytest.approx(4)
    assert "eval_small_loss" in metrics and "eval_pair_loss" in metrics
    streamed = trainer.evaluate(eval_dataset=stream)  # an IterableDataset is read whole
    assert streamed["eval_samples_per_second"] * streamed["eval_runtime"] == pytest.approx(4)


def test_a_streamed_train_dataset_is_read_up_to_the_runs_length(tiny_model_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": f"{a}+{b}="} for a in range(5) for b in range(2)]
    stream = datasets.Dataset.from_list(rows).to_iterable_dataset()
    trainer = GRPOTrainer(tiny_model_dir, one_per_char, args=_args(tmp_path), train_dataset=stream)
    assert [e.prompt for e in trainer.train_dataset] == ["0+0=", "0+1="]  # num_steps 1 x prompts_per_step 2
    with pytest.raises(DataError, match="train_dataset is an IterableDataset, which has no length: set the run's length"):
        GRPOTrainer(tiny_model_dir, one_per_char, args={**_args(tmp_path), "train": {}}, train_dataset=stream)
