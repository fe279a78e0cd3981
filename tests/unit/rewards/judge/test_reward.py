"""The judge rewards against a fake OpenAI-compatible server on loopback (fake_judge.py): what they ask, what
they make of the replies, the cache, and every failure as a failed sample or, for a judge that is down, a stop."""

from __future__ import annotations

import math
import re
import socket

import pytest
from fake_judge import HANG, FakeJudge, chat, user_text

from grpolab.rewards import WeightedReward, build_reward, score_batch
from grpolab.rewards.errors import RewardServiceDown
from grpolab.rewards.isolate import score_groups
from grpolab.rewards.judge import JudgeFailed
from grpolab.rewards.trl_hooks import TrlHooks
from grpolab.types import Completion, Example


@pytest.fixture
def judge_server():
    made = []

    def make(answer):
        server = FakeJudge(answer)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def judge(url: str, **kwargs) -> WeightedReward:
    kwargs = {"base_url": url, "model": "j", "template": "Q: {question}\nA: {completion}\nRef: {answer}", **kwargs}
    return build_reward("group_judge" if "{completions}" in kwargs["template"] else "judge", kwargs=kwargs)


def texts(*words: str) -> list[Completion]:
    return [Completion(text=w, num_tokens=1) for w in words]


def score_from_answer(body):
    """Scores the completion by the digit after 'A: ' (the test's completions are '0'..'9' or words)."""
    found = re.search(r"A: (\d)", user_text(body))
    return (200, chat(f"Score: {found.group(1)}")) if found else (200, chat("I cannot tell."))


def test_scores_are_normalised_and_repeats_are_asked_once(judge_server):
    server = judge_server(score_from_answer)
    wr = judge(server.url, output_range=[-1, 1])
    ex = Example(prompt="What is 2+2?", answer="4")
    values = wr.reward(texts("4", "2", "4", "10"), [ex] * 4)  # "10": its first digit, 1
    assert values == pytest.approx([-0.2, -0.6, -0.2, -0.8])  # -1 + 2 * score / 10
    assert server.calls == 3
    assert wr.reward.counts == {"requests": 3.0, "cached": 1.0, "failed": 0.0, "prompt_tokens": 30.0, "completion_tokens": 9.0}
    assert sorted(user_text(b) for b in server.bodies) == [f"Q: What is 2+2?\nA: {a}\nRef: 4" for a in ("10", "2", "4")]
    assert {(b["model"], b["temperature"]) for b in server.bodies} == {("j", 0.0)}
    wr.reward(texts("4"), [ex])  # the same step (no run): from the cache
    assert server.calls == 3


def test_the_cache_is_cleared_at_each_training_step(judge_server):
    server = judge_server(score_from_answer)
    wr = judge(server.url)
    hooks = TrlHooks(max_steps=5)
    wr.reward.attach_hooks(hooks)
    ex = Example(prompt="p", answer="1")
    hooks.begin_step(1)
    wr.reward(texts("3", "3"), [ex, ex])
    wr.reward(texts("3"), [ex])
    assert server.calls == 1
    hooks.begin_step(2)
    wr.reward(texts("3"), [ex])
    assert server.calls == 2


def test_template_fields_columns_system_and_key(judge_server, monkeypatch):
    server = judge_server(lambda body: (200, chat("yes")))
    monkeypatch.setenv("JUDGE_KEY", "sekrit")
    wr = judge(server.url, template="{question}|{prompt}|{a}|{topic}|{completion}", system="Be strict.",
               score="verdict", api_key_env="JUDGE_KEY")  # fmt: skip
    ex = Example(prompt="<chat>Add</chat>", answer="5", meta={"a": 2, "question": "Add", "row": {"topic": "sums"}})
    assert wr.reward(texts("5"), [ex]) == [1.0]
    assert server.bodies[0]["messages"] == [{"role": "system", "content": "Be strict."},
                                            {"role": "user", "content": "Add|<chat>Add</chat>|2|sums|5"}]  # fmt: skip
    assert server.headers[0]["Authorization"] == "Bearer sekrit"
    with pytest.raises(JudgeFailed, match=r"names \{topic\}, which example 0 .* has no column"):
        wr.reward(texts("5"), [Example(prompt="p", meta={"a": 1})])
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(RewardServiceDown, match=r"the environment variable JUDGE_KEY \(api_key_env\) is not set"):
        score_batch([wr], texts("5"), [ex], timeout_s=30)


def test_yes_probability_asks_for_one_token_with_logprobs(judge_server):
    top = [{"token": "Yes", "logprob": math.log(0.3)}, {"token": "No", "logprob": math.log(0.6)}]
    server = judge_server(lambda body: (200, chat("Yes", top=top)))
    wr = judge(server.url, score="yes_probability", top_logprobs=5)
    assert wr.reward(texts("x"), [Example(prompt="p")]) == pytest.approx([1 / 3])
    body = server.bodies[0]
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"]) == (True, 5, 1)
    no_logprobs = judge_server(lambda body: (200, chat("Yes")))
    with pytest.raises(JudgeFailed, match="no top_logprobs") as err:
        judge(no_logprobs.url, score="yes_probability").reward(texts("x"), [Example(prompt="p")])
    assert err.value.failure_kind == "reward_invalid"


def test_an_unparseable_reply_fails_its_group_and_only_failed_requests_go_again(judge_server):
    server = judge_server(score_from_answer)
    wr = judge(server.url)
    a, b = Example(prompt="a"), Example(prompt="b")
    result = score_groups([wr], texts("1", "2", "huh", "4"), [a, a, b, b], group_size=2, timeout_s=30, max_retries=1)
    assert result.total[:2] == pytest.approx([0.1, 0.2]) and result.total[2:] == [None, None]
    assert result.failures[:2] == [None, None]
    assert result.failures[2].kind == "reward_invalid" and "I cannot tell" in result.failures[2].message
    assert result.retries == 2
    # the first call asked 4; each group's retry asked only what was not cached: group 0 nothing, group 1 "huh"
    assert server.calls == 5


def test_a_judge_that_hangs_is_a_timeout_failure_not_a_zero(judge_server):
    server = judge_server(lambda body: HANG if "slow" in user_text(body) else score_from_answer(body))
    wr = judge(server.url, timeout_s=0.3, max_retries=0)
    a, b = Example(prompt="a"), Example(prompt="b")
    result = score_groups([wr], texts("1", "slow", "3", "4"), [a, a, b, b], group_size=2, timeout_s=30, max_retries=1)
    assert result.total[2:] == pytest.approx([0.3, 0.4]) and result.total[:2] == [None, None]
    assert result.failures[0].kind == "reward_timeout"
    assert "did not answer within 0.3 s" in result.failures[0].message


def test_server_errors_are_retried_and_rejections_are_not(judge_server):
    seen = []

    def flaky(body):
        seen.append(1)
        return (503, {"error": "overloaded"}) if len(seen) == 1 else (200, chat("Score: 5"))

    server = judge_server(flaky)
    assert judge(server.url, max_retries=1).reward(texts("x"), [Example(prompt="p")]) == [0.5]
    assert server.calls == 2
    rejecting = judge_server(lambda body: (400, {"error": "prompt too long"}))
    with pytest.raises(JudgeFailed, match="refused the request with 400: .*prompt too long") as err:
        judge(rejecting.url, max_retries=3).reward(texts("x"), [Example(prompt="p")])
    assert rejecting.calls == 1 and err.value.failure_kind == "reward_error"
    garbled = judge_server(lambda body: (200, b"<html>hello</html>"))
    with pytest.raises(JudgeFailed, match="not JSON"):
        judge(garbled.url).reward(texts("x"), [Example(prompt="p")])


def test_a_judge_nobody_listens_on_stops_the_run_naming_the_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    wr = judge(url, max_retries=1)
    ex = Example(prompt="p")
    with pytest.raises(RewardServiceDown, match=rf"the judge at {re.escape(url)} is down: none of its 2 requests"):
        score_groups([wr], texts("1", "2"), [ex, ex], group_size=2, timeout_s=30, max_retries=1)
    with pytest.raises(RewardServiceDown):  # not made a RewardError by the contract's checks
        score_batch([wr], texts("1"), [ex], timeout_s=30)


def test_group_judge_asks_once_per_group_and_keeps_the_groups_order(judge_server):
    def rank(body):  # scores each completion by its digit, listed best first (not in the group's order)
        shown = re.findall(r"Completion (\d+):\n(\d)", user_text(body))
        lines = sorted(((int(i), int(d)) for i, d in shown), key=lambda p: -p[1])
        return 200, chat("\n".join(f"Completion {i}: {d}" for i, d in lines))

    server = judge_server(rank)
    wr = judge(server.url, template="Question: {question}\n{completions}\nScore each of the {group_size}.")
    assert wr.name == "group_judge"
    a, b = Example(prompt="a"), Example(prompt="b")
    values = wr.reward(texts("2", "9", "5", "1", "7", "3"), [a, a, a, b, b, b])  # groups told apart by example
    assert values == pytest.approx([0.2, 0.9, 0.5, 0.1, 0.7, 0.3])
    assert server.calls == 2
    asked = sorted(user_text(b) for b in server.bodies)  # sent concurrently: in any order
    assert asked[0] == "Question: a\nCompletion 1:\n2\n\nCompletion 2:\n9\n\nCompletion 3:\n5\nScore each of the 3."
    wr.reward.group_size = 2  # set by the run (rollout.num_generations): whole groups of 2, one example or not
    assert wr.reward(texts("4", "6", "8", "1"), [a, a, a, a]) == pytest.approx([0.4, 0.6, 0.8, 0.1])
    assert server.calls == 4
    assert wr.reward(texts("3", "5", "7"), [a, b, b]) == pytest.approx([0.3, 0.5, 0.7])  # not whole: by example
    assert server.calls == 6
