"""The eval command on a tiny random model: metric invariants, files written, gold rewards."""

from __future__ import annotations

import json
import sys

import pytest

from grpolab.commands.eval import evaluate
from grpolab.config import load_config

REWARD_MODULE = '''
def has_digit(completions, **kwargs):
    return [1.0 if any(ch.isdigit() for ch in text) else 0.0 for text in completions]
'''


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    # "correct" = a reply with a digit in it: the random model's 5 characters of 80 hold one about half the
    # time (1 - (70/80)^5 = 0.49), whatever the random stream, so every metric is away from 0 and 1. (A
    # length-based grade is not: this model almost never emits its EOS, 96% of replies run to the limit.)
    (out / "eval_test_rewards.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(out))
    cfg = load_config(
        None,
        [
            "data.source=arithmetic",
            "data.size=40",
            "data.eval_size=6",
            "reward.functions=[{name: 'eval_test_rewards:has_digit'}]",
            "reward.gold=[{name: 'eval_test_rewards:has_digit', weight: 2.0}]",
            "rollout.max_completion_length=5",
            "eval.num_samples=8",
            "eval.prompts_per_batch=4",
            "eval.blind_grader=answer_anywhere",
            f"eval.output_dir={out}",
            "log.progress=false",
        ],
    )
    try:
        return evaluate(cfg, [tiny_model_dir, tiny_model_dir], labels=["a", "b"]), out
    finally:
        sys.path.remove(str(out))


def test_metrics_are_consistent(results):
    evals, _ = results
    for e in evals:
        assert e.ks == [1, 2, 4, 8] and e.num_prompts == 6 and e.num_samples == 8
        assert e.maj_at[1] == pytest.approx(e.pass_at[1])
        passes = [e.pass_at[k] for k in e.ks]
        assert passes == sorted(passes) and 0 < passes[0] < 1
        assert all(e.pass_at[1] <= e.pass_at[k] for k in e.ks)
        assert 0 <= e.greedy_accuracy <= 1 and 1 <= e.mean_length <= 5
        assert e.samples[0]["prompt"].endswith("=") and len(e.samples[0]["sampled"]) == 8
    # same weights and the same seeded stream: identical numbers
    assert evals[0].pass_at == evals[1].pass_at and evals[0].maj_at == evals[1].maj_at


def test_files_written(results):
    _, out = results
    data = json.loads((out / "eval.json").read_text())
    assert [d["label"] for d in data] == ["a", "b"] and set(data[0]["pass_at"]) == {"1", "2", "4", "8"}
    assert (out / "pass_maj.png").read_bytes()[:4] == b"\x89PNG"


def test_gold_rewards_score_the_same_samples_without_grading_them(results):
    evals, out = results
    for e in evals:
        # the gold here is the grading reward itself, weighted 2 in its total: same samples, same values
        assert e.gold_mean["has_digit"] == pytest.approx(e.reward_mean)
        assert e.gold_mean["gold_total"] == pytest.approx(2 * e.reward_mean)
    assert json.loads((out / "eval.json").read_text())[0]["gold_mean"]["has_digit"] == pytest.approx(
        evals[0].reward_mean
    )


def test_the_blind_grader_grades_the_same_samples_a_second_time(results):
    evals, out = results
    for e in evals:
        assert e.blind_grader == "answer_anywhere" and sorted(e.blind_pass_at) == e.ks == sorted(e.blind_maj_at)
        assert len(e.blind_per_prompt["pass"][8]) == 6 and 0 <= e.format_error_share <= 1
        assert e.greedy_blind_accuracy is not None and e.greedy_format_error_share is not None
    assert evals[0].blind_pass_at == evals[1].blind_pass_at  # same samples, same grades
    assert set(json.loads((out / "eval.json").read_text())[0]["blind_maj_at"]) == {"1", "2", "4", "8"}


def test_an_unknown_blind_grader_is_one_config_error():
    from grpolab.config import ConfigError
    from grpolab.runtime.eval_spec import build_grader

    cfg = load_config(None, ["reward.functions=[{name: exact_match}]", "eval.blind_grader=answer_anywher"])
    with pytest.raises(ConfigError, match="eval.blind_grader='answer_anywher': unknown reward .*answer_anywhere"):
        build_grader(cfg)
