"""A run whose reward is a judge, against a fake OpenAI-compatible server on loopback (no vLLM): the judge scores
every step and its cost is logged; a group judge gets G from the run; when the judge goes away mid-run, the run
stops with one line naming the endpoint, and the last checkpoint is kept."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.commands.train import train
from grpolab.config import RewardSpec, load_config
from grpolab.errors import ConfigError
from grpolab.rewards import build_rewards
from grpolab.runtime.judges import judges, prepare_judges
from grpolab.runtime.logging import read_metrics

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "rewards" / "judge"))
from fake_judge import FakeJudge, chat, user_text  # noqa: E402


def digits_score(body):
    """1 point per digit of the completion (after 'A:'), at most 10; a group: one line per completion."""
    text = user_text(body)
    if "Completion 1:" in text:
        shown = re.split(r"Completion (\d+):\n", text)[1:]
        lines = [f"Completion {i}: {min(sum(c.isdigit() for c in body_), 10)}" for i, body_ in zip(shown[::2], shown[1::2], strict=True)]
        return 200, chat("\n".join(reversed(lines)))
    return 200, chat(f"Score: {min(sum(c.isdigit() for c in text.split('A:', 1)[1]), 10)}")


@pytest.fixture
def fake():
    server = FakeJudge(digits_score)
    yield server
    server.close()


def overrides(model_dir, data, out, url, steps, *extra):
    judge = f"{{name: judge, kwargs: {{base_url: '{url}', model: j, template: 'Q: {{question}} A:{{completion}}', timeout_s: 5, max_retries: 1}}}}"
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}", "data.max_prompt_length=16",
        f"reward.functions=[{judge}]", "rollout.num_generations=4", "rollout.max_completion_length=6",
        "train.prompts_per_step=2", f"train.num_steps={steps}", "optim.lr=1e-2", f"log.output_dir={out}",
        "log.run_name=judged", "log.progress=false", "log.checkpoint_every=1", *extra,
    ]  # fmt: skip


def test_a_run_judged_by_an_endpoint_logs_the_judges_cost(fake, tiny_model_dir, addition_jsonl, tmp_path):
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(8), tmp_path, fake.url, 2, "reward.dry_run_examples=0"))
    result = train(cfg)
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # 8 completions a step: each asked once, or found in the step's cache
        assert row["rewards/judge/requests"] + row["rewards/judge/cached"] == 8
        assert row["rewards/judge/failed"] == 0
        assert row["rewards/judge/prompt_tokens"] == 10 * row["rewards/judge/requests"]
    assert fake.calls == sum(r["rewards/judge/requests"] for r in rows)  # no dry run: every request was logged


def test_a_run_judged_group_by_group(fake, tiny_model_dir, addition_jsonl, tmp_path):
    group = "{name: group_judge, kwargs: {base_url: '" + fake.url + "', model: j, template: 'Q: {question} {completions}'}}"
    cfg = load_config(None, [*overrides(tiny_model_dir, addition_jsonl(8), tmp_path, fake.url, 2), f"reward.functions=[{group}]"])
    rows = read_metrics(train(cfg).run_dir)
    dry_run = 4  # reward.dry_run_examples: each asked alone
    assert [r["rewards/group_judge/requests"] + r["rewards/group_judge/cached"] for r in rows] == [2, 2]  # P requests
    assert fake.calls == dry_run + sum(r["rewards/group_judge/requests"] for r in rows)
    assert all(r["rewards/group_judge/failed"] == 0 for r in rows)


def test_group_judges_get_g_and_a_judge_never_asks_the_policys_server(fake):
    spec = {"base_url": fake.url, "model": "j", "template": "{completions}"}
    cfg = load_config(None, ["rollout.num_generations=3", "rollout.engine=vllm", "rollout.mode=server", f"rollout.server_url={fake.url[:-3]}"])
    rewards = build_rewards([RewardSpec(name="group_judge", kwargs=spec, alias="g")])
    with pytest.raises(ConfigError, match="is the policy's server .*never shares weights"):
        prepare_judges(cfg, rewards)
    cfg = load_config(None, ["rollout.num_generations=3"])
    prepare_judges(cfg, rewards)
    assert [j.group_size for j in judges(rewards)] == [3]


def test_a_judge_gone_mid_run_is_one_line_naming_it(fake, tiny_model_dir, addition_jsonl, tmp_path):
    cmd = [sys.executable, "-m", "grpolab", "train", *overrides(tiny_model_dir, addition_jsonl(16), tmp_path, fake.url, 200)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        run_dir = tmp_path / "judged"
        deadline = time.monotonic() + 300
        while len(read_metrics(run_dir)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never logged two steps"
            time.sleep(0.2)
        fake.close()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2, err[-2000:]
    assert re.match(rf"grpolab: error: reward 'judge': the judge at {re.escape(fake.url)} is down: none of its \d+ requests", last), last
    assert "Traceback" not in err
    assert any((run_dir / "checkpoints").iterdir())


class FakeServed:
    """What runtime/judges.py starts for a judge with serve, standing in for a vLLM server: the fake endpoint."""

    def __init__(self, url: str):
        self.url, self.stopped = url.removesuffix("/v1"), False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


def test_grpolab_eval_serves_a_judge_while_it_grades_and_stops_it(fake, tiny_model_dir, tmp_path, monkeypatch):
    from grpolab.commands.eval import evaluate
    from grpolab.runtime import judges as judges_module

    started = []
    monkeypatch.setattr(judges_module, "start_judge_server", lambda serve: started.append(FakeServed(fake.url)) or started[-1])
    judge = "{name: judge, kwargs: {serve: {model: some/judge}, template: 'Q: {question} A:{completion}'}}"
    cfg = load_config(None, [
        f"model.name_or_path={tiny_model_dir}", "data.source=arithmetic", "data.size=20", "data.eval_size=3",
        f"reward.functions=[{judge}]", "rollout.max_completion_length=5", "eval.num_samples=2",
        "eval.correct_threshold=0.05", f"eval.output_dir={tmp_path}", "log.progress=false",
    ])  # fmt: skip
    [result] = evaluate(cfg)
    assert len(started) == 1 and started[0].stopped
    assert result.num_prompts == 3 and fake.calls > 0
    assert {b["model"] for b in fake.bodies} == {"judge"}  # the name grpolab serves a judge under
