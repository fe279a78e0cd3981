"""From TRL: a conversational dataset, TRL-style rewards used unchanged, wandb (offline) and trackio logging, resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracker_records import trackio_logs

from grpolab.config import load_config
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model
from grpolab.commands.train import train

REWARDS = ["conversational_format_reward", "conversational_accuracy_reward", "length_penalty"]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("chat_model")
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture
def chat_jsonl(tmp_path) -> Path:
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}?"}], "solution": f"${a + b}$", "level": a}
        for a in range(1, 5)
        for b in range(1, 3)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(model_dir, data, out, steps):
    functions = ", ".join(f"{{name: 'trl_rewards:{n}'}}" for n in REWARDS)
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.path={data}",
            "data.answer_field=null",
            f"reward.functions=[{functions}]",
            "rollout.num_generations=2",
            "rollout.max_completion_length=4",
            "train.prompts_per_step=2",
            f"train.num_steps={steps}",
            "log.checkpoint_every=1",
            "log.progress=false",
            f"log.output_dir={out}",
            "log.run_name=chat",
            "log.project=grpolab-e2e",
            "log.report_to=[wandb, trackio]",
        ],
    )


def test_conversational_trl_rewards_wandb_and_trackio_through_a_resume(
    chat_model_dir, chat_jsonl, tmp_path, wandb_offline, trackio_dir, monkeypatch
):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "unit" / "rewards"))  # trl_rewards.py
    train(_cfg(chat_model_dir, chat_jsonl, tmp_path, steps=1))
    result = train(_cfg(chat_model_dir, chat_jsonl, tmp_path, steps=2), resume=True)
    assert result.final_step == 2

    metrics = read_metrics(result.run_dir)
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and len(samples) == 2 * 4
    assert all(s["prompt"].startswith("user: ") for s in samples)
    assert {f"reward/{n}" for n in REWARDS} <= set(samples[0])
    expected_rows = [{k: s[k] for k in ("prompt", "completion", "reward", "advantage", *[f"reward/{n}" for n in REWARDS])} for s in samples]

    runs = wandb_offline.runs()
    assert len(runs) == 2 and runs[0].run_id == runs[1].run_id  # the resume continued the same run
    assert runs[0].config["algo"]["beta"] == pytest.approx(0.04) and runs[0].config["log"]["run_name"] == "chat"
    history = runs[0].history + runs[1].history
    logged = {h["_step"]: h["train/reward"] for h in history if "train/reward" in h}  # as TRL's wandb charts
    assert logged == pytest.approx({m["step"]: m["reward"] for m in metrics})
    tables = [row for h in history for row in h.get("completions", [])]
    _assert_rows_match(tables, expected_rows)

    logs = trackio_logs("grpolab-e2e", "chat")
    logged = {r["step"]: r["train/reward"] for r in logs if "train/reward" in r}
    assert logged == pytest.approx({m["step"]: m["reward"] for m in metrics})
    _assert_rows_match([row for r in logs for row in r.get("completions", [])], expected_rows)


def _assert_rows_match(rows, expected):
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert {k: row[k] for k in ("prompt", "completion")} == {k: want[k] for k in ("prompt", "completion")}
        for k in want.keys() - {"prompt", "completion"}:
            assert row[k] == pytest.approx(want[k], abs=1e-6), k
