"""grpolab hacking with a judge as the proxy and the rule reward as gold, against a fake OpenAI-compatible server on
loopback (no vLLM): the grid trains on the judge, logs the rule as gold, and writes the report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grpolab.config import load_config
from grpolab.runtime.logging import read_metrics
from grpolab.studies.hacking import hacking

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "rewards" / "judge"))
from fake_judge import FakeJudge, chat, user_text  # noqa: E402


@pytest.fixture
def fake():
    """A judge that pays for length: 1 point per character of the completion, at most 10 (a judge to game)."""
    server = FakeJudge(lambda body: (200, chat(f"Score: {min(len(user_text(body).split('A:', 1)[1]), 10)}")))
    yield server
    server.close()


def test_grpolab_hacking_takes_a_judge_as_the_proxy_and_the_rule_as_gold(fake, tiny_model_dir, addition_jsonl, tmp_path):
    judge = f"{{name: judge, kwargs: {{base_url: '{fake.url}', model: j, template: 'Q: {{question}} A:{{completion}}'}}}}"
    cfg = load_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.autocast=none", f"data.path={addition_jsonl(8)}",
        "data.max_prompt_length=16", f"reward.functions=[{judge}]", "rollout.num_generations=4",
        "rollout.max_completion_length=6", "train.prompts_per_step=2", "train.num_steps=3", "optim.lr=1e-2",
        f"log.output_dir={tmp_path}", "log.run_name=hack", "log.progress=false",
        "reward.gold=[{name: exact_match, kwargs: {extract: last_number}}]",
    ])  # fmt: skip
    result = hacking(cfg, [0.0], [0])
    rows = read_metrics(result.run_dirs["beta0_seed0"])
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("train/gold/exact_match" in r and r["rewards/judge/requests"] + r["rewards/judge/cached"] == 8 for r in rows)
    report = result.report.read_text()
    assert "| beta0_seed0 | 0 | 0 |" in report and (result.report.parent / "plots" / "hacking.png").exists()
