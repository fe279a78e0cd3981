import pytest

from grpolab.rewards import RewardError, build_reward, score_batch
from grpolab.tasks import reasoning_gym as gym
from grpolab.types import Completion, Example


@pytest.fixture(scope="module")
def examples():
    return gym.gym_examples("chain_sum", size=4, seed=3, params={"min_terms": 2, "max_terms": 3})


def test_examples_carry_answer_and_entry(examples):
    assert len(examples) == 4
    for i, ex in enumerate(examples):
        entry = ex.meta["gym_entry"]
        assert ex.answer == str(entry["answer"])
        assert ex.prompt.endswith(f"User: {entry['question'].strip()}. Assistant:")
        assert ex.meta["gym_dataset"] == "chain_sum" and ex.meta["gym_index"] == i
        assert ex.meta["gym_params"] == {"min_terms": 2, "max_terms": 3}
    again = gym.gym_examples("chain_sum", size=4, seed=3, params={"min_terms": 2, "max_terms": 3})
    assert [e.prompt for e in again] == [e.prompt for e in examples]


def test_template_without_tags_gets_instruction():
    (ex,) = gym.gym_examples("leg_counting", size=1, seed=0, params=None, template="none")
    assert ex.prompt.endswith(gym.ANSWER_INSTRUCTION)
    assert ex.prompt.startswith("Your task is to count")


def grade(examples, texts):
    reward = build_reward("reasoning_gym")
    completions = [Completion(t, 5) for t in texts]
    return score_batch([reward], completions, examples, timeout_s=None).components["reasoning_gym"]


def test_gym_score(examples):
    ex = examples[0]
    wrong = str(int(ex.answer) + 1)
    texts = [
        f"<think>adding</think><answer>{ex.answer}</answer>",
        f"<answer>{wrong}</answer>",
        ex.answer,  # no tag
        f"<think><answer>{ex.answer}</answer></think>",  # only inside the think block
    ]
    scores = grade([ex] * 4, texts)
    assert scores[0] == 1.0 and scores[1] < 1.0 and scores[2] == 0.0 and scores[3] == 0.0


def test_gym_score_rebuilds_dataset_from_meta(examples, monkeypatch):
    monkeypatch.setattr(gym, "_DATASETS", {})  # as in a fresh process
    assert grade(examples[:1], [f"<answer>{examples[0].answer}</answer>"]) == [1.0]


def test_gym_score_needs_gym_meta():
    with pytest.raises(RewardError, match="example meta lacks gym_dataset.*gym_examples"):
        grade([Example("q", "1")], ["<answer>1</answer>"])


def test_unknown_dataset_and_bad_params():
    with pytest.raises(ValueError, match=r"no dataset 'chain_sums'; did you mean chain_sum"):
        gym.gym_examples("chain_sums", size=1, seed=0, params=None, template="r1")
    with pytest.raises(ValueError, match=r"rejected params \{'min_term': 2\}.*its params are: min_terms"):
        gym.gym_examples("chain_sum", size=1, seed=0, params={"min_term": 2}, template="r1")
