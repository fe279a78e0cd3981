"""The reasoning-gym task (tasks/reasoning_gym.py): examples, templates, unknown datasets."""

import pytest

from grpolab.tasks import reasoning_gym as gym


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


def test_unknown_dataset_and_bad_params():
    with pytest.raises(ValueError, match=r"no dataset 'chain_sums'; did you mean chain_sum"):
        gym.gym_examples("chain_sums", size=1, seed=0, params=None, template="r1")
    with pytest.raises(ValueError, match=r"rejected params \{'min_term': 2\}.*its params are: min_terms"):
        gym.gym_examples("chain_sum", size=1, seed=0, params={"min_term": 2}, template="r1")
