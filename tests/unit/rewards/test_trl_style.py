"""TRL-style reward functions (fn(completions, **kwargs) -> list), written as TRL's docs write them, used unchanged."""

import pytest
import trl_rewards  # tests/unit/rewards/trl_rewards.py, on sys.path as the test's folder

from grpolab.rewards import (
    Aliased,
    RewardError,
    TrlReward,
    WeightedReward,
    build_reward,
    dry_run,
    score_batch,
)
from grpolab.rewards.trl_hooks import TrlHooks, attach_hooks
from grpolab.types import Completion, Example

ROWS = [
    {"prompt": "What is 2+2?", "solution": "$4$", "level": 1},
    {"prompt": "What is 3*3?", "solution": "$9$", "level": 2},
]
EXAMPLES = [Example(prompt=r["prompt"], answer=r["solution"], meta={"row": r}) for r in ROWS]


def _score(names, completions, examples=EXAMPLES, timeout_s=5.0):
    rewards = [build_reward(f"trl_rewards:{n}") for n in names]
    return score_batch(rewards, completions, examples, timeout_s=timeout_s)


def test_docs_style_rewards_score_text_completions():
    completions = [
        Completion("<think>2+2</think><answer>The answer is $4$</answer>", 7, "stop", (5, 6, 7, 8, 9, 10, 2)),
        Completion("I think it is $10$", 3, "length", (5, 6, 7)),
    ]
    scores = _score(["format_reward", "accuracy_reward", "length_penalty"], completions)
    assert scores.components["format_reward"] == [1.0, 0.0]
    assert scores.components["accuracy_reward"] == [1.0, 0.0]
    # target 4 tokens: |4 - 7| / 4 and |4 - 3| / 4, from completion_ids, not from the text
    assert scores.components["length_penalty"] == pytest.approx([-0.75, -0.25])
    assert scores.total == pytest.approx([1.0 + 1.0 - 0.75, 0.0 + 0.0 - 0.25])


def test_every_dataset_column_prompts_and_completion_ids_reach_the_function():
    completions = [Completion("a", 1, "stop", (11,)), Completion("bc", 2, "stop", (12, 13))]
    _score(["echo_columns"], completions, timeout_s=None)  # called here: what it saw is read back from it
    seen = trl_rewards.echo_columns.seen
    assert seen["prompts"] == ["What is 2+2?", "What is 3*3?"]
    assert seen["completions"] == ["a", "bc"]
    assert seen["completion_ids"] == [[11], [12, 13]]
    assert seen["solution"] == ["$4$", "$9$"] and seen["level"] == [1, 2]
    assert "prompt" not in seen  # TRL leaves the prompt column out: it is `prompts`


def test_conversational_examples_give_message_lists():
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"})
    ex = Example(prompt="user: What is 2+2?", answer="4", meta={"row": {"solution": "4"}}, messages=messages)
    completions = [Completion("<think>x</think><answer>4</answer>", 9), Completion("4", 1)]
    scores = _score(["conversational_format_reward", "echo_columns"], completions, [ex, ex], timeout_s=None)
    assert scores.components["conversational_format_reward"] == [1.0, 0.0]
    seen = trl_rewards.echo_columns.seen
    assert seen["prompts"] == [list(messages)] * 2
    assert seen["completions"][1] == [{"role": "assistant", "content": "4"}]


def test_signature_detection_and_explicit_kind():
    assert isinstance(build_reward("trl_rewards:format_reward").reward, TrlReward)
    native = build_reward("trl_rewards:looks_native").reward
    assert not isinstance(native, TrlReward)
    assert native([Completion("abc", 3)], [EXAMPLES[0]]) == [3.0]
    assert isinstance(build_reward("trl_rewards:looks_native", kind="trl").reward, TrlReward)
    with pytest.raises(ValueError, match="too many positional"):  # native = fn(completion, example)
        build_reward("trl_rewards:format_reward", kind="native")
    with pytest.raises(ValueError, match="kind: trl"):
        build_reward("exact_match", kind="trl")
    with pytest.raises(ValueError, match="does not accept kwargs"):
        build_reward("trl_rewards:no_kwargs", kwargs={"target": 3})
    penalty = build_reward("trl_rewards:length_penalty", kwargs={"target": 2})  # kwargs bound by name
    assert penalty.reward([Completion("ab", 2, "stop", (1, 2))], [EXAMPLES[0]]) == [0.0]


def test_a_function_without_kwargs_gets_only_what_it_names():
    scores = _score(["no_kwargs"], [Completion("$4$", 3), Completion("x", 1)])
    assert scores.components["no_kwargs"] == [1.0, 0.0]


def test_async_rewards_are_awaited_together():
    trl_rewards.reset_meeting()
    left, right = build_reward("trl_rewards:async_left"), build_reward("trl_rewards:async_right")
    assert left.reward.is_async and right.reward.is_async
    sync = build_reward("trl_rewards:format_reward")
    # each waits until the other has started: run one after the other, the first would raise
    scores = score_batch([left, sync, right], [Completion("a", 1)] * 2, EXAMPLES, timeout_s=5.0)
    assert list(scores.components) == ["async_left", "format_reward", "async_right"]
    assert scores.total == pytest.approx([0.75, 0.75])


def test_async_alone_runs_in_the_dry_run():
    trl_rewards.reset_meeting()
    trl_rewards._arrived.append("right")  # alone, the left one has nobody to meet: pretend
    assert dry_run([build_reward("trl_rewards:async_left")], [Completion("a", 1)], EXAMPLES[:1], timeout_s=5.0)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("wrong_length", "returned 1 values for 2 completions"),
        ("returns_nan", "return a finite float"),
        ("raises", "raised KeyError"),
        ("needs_trainer_state", r"needs \['trainer_state'\].*are passed only inside a training run"),
    ],
)
def test_bad_trl_rewards_fail_with_the_native_messages(name, message):
    with pytest.raises(RewardError, match=message):
        _score([name], [Completion("a", 1), Completion("b", 1)])


def test_a_missing_column_is_named():
    bare = [Example(prompt="q", answer=None, meta={"row": {"prompt": "q"}})]
    with pytest.raises(RewardError, match=r"needs \['solution'\].*add those columns"):
        _score(["accuracy_reward"], [Completion("4", 1)], bare)


def test_task_examples_offer_answer_and_meta():
    ex = Example(prompt="q", answer="7", meta={"entry": {"x": 1}})
    _score(["echo_columns"], [Completion("a", 1)], [ex], timeout_s=None)
    assert trl_rewards.echo_columns.seen["answer"] == ["7"]
    assert trl_rewards.echo_columns.seen["entry"] == [{"x": 1}]


def test_a_slow_trl_reward_is_interrupted_in_the_main_thread():
    import signal

    before = signal.getsignal(signal.SIGUSR2)
    with pytest.raises(RewardError, match="took longer than 0.2 s"):
        _score(["slow"], [Completion("a", 1)], EXAMPLES[:1], timeout_s=0.2)
    assert signal.getsignal(signal.SIGUSR2) is before


def _logs(completions, log_metric, log_extra, **kwargs):
    log_metric("custom_accuracy", len(completions[0]) / 4)
    log_extra("first_char", [c[:1] for c in completions])
    return [0.0] * len(completions)


@pytest.mark.parametrize("timeout_s", [5.0, None], ids=["in a worker process", "in the trainer"])
def test_in_a_run_trl_rewards_get_trainer_state_log_metric_and_log_extra(timeout_s):
    rewards = [
        build_reward("trl_rewards:needs_trainer_state"),
        build_reward("trl_rewards:no_kwargs"),
        WeightedReward(Aliased(TrlReward(_logs), "logs"), 1.0),
    ]
    with pytest.raises(RewardError, match=r"needs \['trainer_state'\].*passed only inside a training run"):
        score_batch(rewards[:1], [Completion("a", 1)] * 2, EXAMPLES, timeout_s=timeout_s)
    hooks = TrlHooks(max_steps=10)
    attach_hooks(rewards, hooks)
    pair = [Completion("ab", 2), Completion("cd", 2)]
    score_batch(rewards, pair, EXAMPLES, timeout_s=timeout_s)  # before the first step: the dry run
    hooks.begin_step(3)
    assert hooks.take_metrics() == {} and hooks.take_extra() == {}  # the dry run's are dropped
    scores = score_batch(rewards, pair, EXAMPLES, timeout_s=timeout_s)
    assert scores.components["needs_trainer_state"] == [2.0, 2.0]  # the steps done before step 3
    score_batch(rewards, [Completion("abcd", 4)] * 2, EXAMPLES, timeout_s=timeout_s)  # a second round of the step
    assert hooks.take_metrics() == {"custom_accuracy": pytest.approx((0.5 + 1.0) / 2)}
    assert hooks.take_extra() == {"first_char": ["a", "c", "a", "a"]}
    assert hooks.take_metrics() == {} and hooks.take_extra() == {}
    hooks.begin_step(4)
    assert score_batch(rewards, pair, EXAMPLES, timeout_s=timeout_s).components["needs_trainer_state"] == [3.0, 3.0]
    hooks.detach()  # the run is over: the function is called as outside a run again
    with pytest.raises(RewardError, match=r"passed only inside a training run"):
        score_batch(rewards[:1], pair, EXAMPLES, timeout_s=timeout_s)
