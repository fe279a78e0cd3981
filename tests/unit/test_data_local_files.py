"""Local parquet / csv / json / jsonl files load through datasets' builders under either source; a TRL dataset
without an answer column loads, and only a reward that needs the answer complains, naming itself."""

import json

import pytest

from grpolab.config import DataConfig
from grpolab.data import DataError, load_examples
from grpolab.rewards import build_reward, dry_run
from grpolab.types import Completion

datasets = pytest.importorskip("datasets")
ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}]


def _write(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    else:
        ds = datasets.Dataset.from_list(ROWS)
        {".parquet": ds.to_parquet, ".csv": lambda p: ds.to_csv(p, index=False)}[suffix](str(path))
    return str(path)


@pytest.mark.parametrize("source", ["hf", "jsonl"])
@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json", ".jsonl"])
def test_a_local_file_loads_by_its_suffix(tmp_path, source, suffix):
    examples = load_examples(DataConfig(source=source, path=_write(tmp_path, suffix)), seed=0)
    assert [(e.prompt, e.answer) for e in examples] == [("1+1=", "2"), ("2+3=", "5")]


def test_a_missing_or_unreadable_local_file_is_one_line_not_a_hub_lookup(tmp_path):
    with pytest.raises(DataError, match=r"data.path: .*nope.parquet does not exist"):
        load_examples(DataConfig(source="hf", path=str(tmp_path / "nope.parquet")), seed=0)
    fake = tmp_path / "fake.parquet"
    fake.write_text("prompt,answer\n1,2\n")
    with pytest.raises(DataError) as err:
        load_examples(DataConfig(source="jsonl", path=str(fake)), seed=0)
    assert "could not be read as a parquet file" in str(err.value) and "UTF-8" not in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unreachable_hub_dataset_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="could not be read as a Hugging Face dataset"):
        load_examples(DataConfig(source="hf", path="nobody/no-such-dataset"), seed=0)


def test_a_trl_dataset_without_answers_loads_and_only_an_answer_reward_fails(tmp_path):
    path = tmp_path / "trl.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "Say hi"}]}) + "\n")
    examples = load_examples(DataConfig(path=str(path)), seed=0)  # data.answer_field keeps its default
    assert examples[0].answer is None
    comps = [Completion(text="hi", num_tokens=1)]
    dry_run([build_reward("r1_format")], comps, examples, timeout_s=None)  # needs no answer
    with pytest.raises(Exception, match=r"no 'answer' field \(data.answer_field\), which reward 'exact_match' needs"):
        dry_run([build_reward("exact_match")], comps, examples, timeout_s=None)
