import json

import pytest

from grpolab.config import DataConfig
from grpolab.data import DataError, PromptOrder, load_examples, split_eval, tokenize_prompts
from grpolab.tasks.tiny import build_char_tokenizer


def _jsonl(tmp_path, rows, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_rows_become_templated_examples(tmp_path):
    path = _jsonl(tmp_path, [{"q": "1+1", "a": 2, "extra": "x"}, {"q": "2+2", "a": 4}])
    cfg = DataConfig(path=path, prompt_field="q", answer_field="a", template="Question: {prompt}\nAnswer:")
    ex = load_examples(cfg, seed=0)
    assert ex[0].prompt == "Question: 1+1\nAnswer:" and ex[0].answer == "2"
    assert ex[0].meta["row"]["extra"] == "x" and ex[0].meta["question"] == "1+1"


def test_hf_dataset_saved_to_disk(tmp_path):
    import datasets

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(5)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    ex = load_examples(DataConfig(source="hf", path=str(tmp_path / "ds")), seed=0)
    assert [e.answer for e in ex] == ["1", "2", "3", "4", "5"]
    with pytest.raises(DataError, match="has no split 'test'"):
        load_examples(DataConfig(source="hf", path=str(tmp_path / "ds"), split="test"), seed=0)


@pytest.mark.parametrize(
    ("rows", "cfg_kwargs", "message"),
    [
        ([{"question": "x", "answer": "1"}], {}, "row 1 has no field 'prompt' (data.prompt_field)"),
        (['{"prompt": "x", "answer": 1}', "{not json"], {}, ":2 is not valid JSON"),
        (["[1, 2]"], {}, ":1 must be a JSON object"),
    ],
)
def test_bad_rows_name_the_row_and_the_fix(tmp_path, rows, cfg_kwargs, message):
    cfg = DataConfig(path=_jsonl(tmp_path, rows), **cfg_kwargs)
    with pytest.raises(DataError) as err:
        load_examples(cfg, seed=0)
    assert message in str(err.value)


def test_missing_file_and_prompt_too_long(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_examples(DataConfig(path=str(tmp_path / "nope.jsonl")), seed=0)
    ex = load_examples(DataConfig(path=_jsonl(tmp_path, [{"prompt": "123456789", "answer": "1"}])), seed=0)
    with pytest.raises(DataError, match="prompt of 9 tokens, over data.max_prompt_length=4"):
        tokenize_prompts(ex, build_char_tokenizer(), DataConfig(max_prompt_length=4))


def test_split_eval_holds_out_the_tail():
    ex = load_examples(DataConfig(source="arithmetic", size=10), seed=0)
    train, held = split_eval(ex, 3)
    assert len(train) == 7 and held == ex[7:]
    with pytest.raises(DataError, match="leaves no training examples"):
        split_eval(ex, 10)


def test_prompt_sampler_covers_each_epoch_and_resumes_exactly():
    a = PromptOrder(size=5, seed=3)
    first = a.next(5)
    assert sorted(first) == [0, 1, 2, 3, 4]
    a.next(2)
    state = a.state_dict()
    b = PromptOrder(size=5, seed=3)
    b.load_state_dict(state)
    assert a.next(7) == b.next(7)
    assert a.drawn == b.drawn == 14  # sys/samples_seen counts from it: every prompt drawn, across epochs


def test_a_seed_near_the_limit_shuffles():
    from grpolab.data import PromptOrder

    sampler = PromptOrder(10, seed=9223372036854000000)
    assert sorted(sampler.next(10)) == list(range(10))
    assert PromptOrder(10, seed=-5).next(10) == PromptOrder(10, seed=-5).next(10)
