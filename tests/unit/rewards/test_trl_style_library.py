"""TRL's own reward functions (trl.rewards) as GRPOTrainer reward_funcs, unchanged, and open-r1's
(grpolab.rewards.open_r1), each called on completions whose rewards are worked out by hand below."""

from __future__ import annotations

import pytest

from grpolab.api import build_reward_funcs
from grpolab.config import DataConfig
from grpolab.data import examples_from_rows
from grpolab.rewards import open_r1
from grpolab.types import Completion

trl_rewards = pytest.importorskip("trl.rewards", reason="TRL's reward functions need trl installed")
pytest.importorskip("math_verify", reason="TRL's accuracy rewards use math-verify")

ROWS = [  # conversational, as TRL's math datasets: completions reach the functions as [{"role", "content"}]
    {"prompt": [{"role": "user", "content": "1/3 as a fraction?"}], "solution": r"\frac{1}{3}"},
    {"prompt": [{"role": "user", "content": "1/3 again?"}], "solution": r"\frac{1}{3}"},
]


def _scores(reward_funcs, texts, ids=((1,), (1,))):
    """What GRPOTrainer(reward_funcs=..., train_dataset=ROWS) builds from them, called on ``texts``."""
    examples = examples_from_rows(ROWS, DataConfig(answer_field=None), origin="train_dataset")
    completions = [Completion(text=t, num_tokens=len(i), token_ids=tuple(i)) for t, i in zip(texts, ids, strict=True)]
    return {w.name: w.reward(completions, examples) for w in build_reward_funcs(reward_funcs)}


def test_accuracy_and_think_format_rewards_run_unchanged():
    texts = [r"<think>so</think>The answer is \boxed{\frac{1}{3}}", r"The answer is \boxed{\frac{1}{2}}"]
    got = _scores([trl_rewards.accuracy_reward, trl_rewards.think_format_reward, trl_rewards.reasoning_accuracy_reward], texts)
    assert got["accuracy_reward"] == [1.0, 0.0]
    assert got["think_format_reward"] == [1.0, 0.0]  # only the first opens and closes one think block
    # reasoning_accuracy_reward grades only what follows </think>; the second never closes one: 0
    assert got["reasoning_accuracy_reward"] == [1.0, 0.0]


def test_the_factories_rewards_run_unchanged():
    overlong = trl_rewards.get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    cosine = trl_rewards.get_cosine_scaled_reward(max_len=100)
    repetition = trl_rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    texts = [r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}"]
    got = _scores([overlong, cosine, repetition], texts, ids=(range(8), [5] * 50))
    # soft overlong: 0 up to 10 - 4 = 6 tokens, then (6 - n) / 4: 8 tokens -> -0.5; 50 tokens (> 10) -> -1
    assert got[overlong.__name__] == [-0.5, -1.0]
    # cosine at 8/100 and 50/100 of max_len: correct 0.5 + 0.5 * (1 + cos(0.08 pi)) / 2; wrong (50%) -0.75
    import math

    by_name = {k: v for k, v in got.items() if k not in (overlong.__name__, repetition.__name__)}
    (cos,) = by_name.values()
    assert cos[0] == pytest.approx(0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * 0.08)), abs=1e-9)
    assert cos[1] == pytest.approx(-0.75, abs=1e-9)
    # repetition over token-id 2-grams: 0..7 repeats none -> 0; fifty 5s: 49 bigrams, 1 distinct -> -(1 - 1/49)
    assert got[repetition.__name__] == [pytest.approx(0.0), pytest.approx(-48 / 49)]


def test_open_r1s_rewards_as_copied_score_as_open_r1_defines_them():
    good = "<think>\nFirst, 1/3.\nNext, done.\n</think>\n<answer>\n\\boxed{\\frac{1}{3}}\n</answer>"
    loose = "<think>so</think> <answer>\\boxed{\\frac{1}{2}}</answer>"  # grpolab's r1_format would pass it
    completions = [[{"role": "assistant", "content": good}], [{"role": "assistant", "content": loose}]]
    solution = [r"\frac{1}{3}", r"\frac{1}{3}"]
    assert open_r1.accuracy_reward(completions, solution) == [1.0, 0.0]
    assert open_r1.accuracy_reward(completions[:1], ["no answer here"]) == [None]  # a gold that does not parse: skipped
    assert open_r1.format_reward(completions) == [1.0, 0.0]  # open-r1 wants its newlines
    # tags with their newlines: all four once in the first; the second has none of them (no newlines)
    assert open_r1.tag_count_reward(completions) == [1.0, 0.0]
    # "First," and "Next," -> 2 of 3 steps; none in the second
    assert open_r1.reasoning_steps_reward(completions) == [pytest.approx(2 / 3), 0.0]
