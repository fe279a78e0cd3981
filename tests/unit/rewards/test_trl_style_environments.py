"""TRL's ``environments`` argument: each completion's environment object, after its episode, in completion order.

Episodes are scripted (a call to the environment's tool, then an answer), so the state the tool left is known by
hand; the rewards are scored as training scores them (``score_batch`` with a timeout, which sends other rewards to
a worker process)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from grpolab.envs import ToolLimits
from grpolab.envs.trl_env import TrlEnvironment, env_reward, register, unregister
from grpolab.errors import RewardError
from grpolab.rewards import WeightedReward, score_batch
from grpolab.rewards.trl_hooks import TrlHooks
from grpolab.rewards.trl_style import TrlReward
from grpolab.rollout.base import Sampler
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids
from grpolab.tasks.tiny import CHAT_TEMPLATE, DEFAULT_CHARS, build_char_tokenizer
from grpolab.types import Completion, Completions, Episode, Example


class Counter:
    """The model adds to a counter with its tool; the counter starts at the row's ``start``."""

    def reset(self, **row):
        self.count = int(row["start"])

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return self.count / 2


class Bigger(Counter):
    pass


class Scripted(Sampler):
    """Answers a context with a call ``increment(step)`` (step: the row's digit in the prompt) first, then "ok"."""

    def __init__(self, tok):
        self.tok, self.pad_token_id = tok, tok.pad_token_id

    def sample(self, prompt_ids, *, num_generations, generator=None, examples=None):
        rows = []
        for ids in prompt_ids:
            seen = self.tok.decode(ids)
            step = int(seen.split("add ")[1][0])
            call = json.dumps({"name": "increment", "arguments": {"step": step}})
            text = "ok" if "<tool>" in seen else f"<tool_call>{call}</tool_call>"
            rows.append(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[j < len(r) for j in range(width)] for r in rows])
        n = len(rows)
        return Completions([list(p) for p in prompt_ids], ids, mask, -0.5 * mask.float(), ["?"] * n, ["stop"] * n, 1)


def counts(environments, **kwargs):
    """A TRL user's reward: state the tools left in each environment."""
    counts.seen.append(environments)
    return [float(env.count) for env in environments]


counts.seen = []


def any_kwargs(completions, **kwargs):
    return [float(env.count) * 10 for env in kwargs["environments"]]


def plain(completions, **kwargs):
    return [1.0 for _ in completions]


def plain_named(completions):  # names no environments and takes no **kwargs: not passed, runs in its worker
    return [float("environments" in dir()) for _ in completions]


ROWS = [{"prompt": [{"role": "user", "content": f"add {step}"}], "start": start} for step, start in ((2, 10), (3, 20))]


@pytest.fixture
def episodes():
    """Two rows x two episodes each: row 1 (start 10, add 2) ends at 12, row 2 (start 20, add 3) at 23."""
    tok = build_char_tokenizer(DEFAULT_CHARS + '{}"_[]')
    tok.chat_template = CHAT_TEMPLATE
    handle, _ = register(None, Counter)
    make_env = lambda: TrlEnvironment(handle, ToolLimits())  # noqa: E731
    examples = [Example(prompt="", messages=tuple(r["prompt"]), meta={"row": r}) for r in ROWS]
    prompts = episode_prompt_ids(examples, tok, make_env)
    sampler = MultiTurnSampler(Scripted(tok), tok, make_env, max_turns=3, max_episode_tokens=200)
    out = sampler.sample(prompts, num_generations=2, examples=examples)
    yield out.items(), [e for e in examples for _ in range(2)]
    unregister(handle)


def in_run(fn, environments=True) -> TrlReward:
    reward = TrlReward(fn)
    reward.attach_hooks(TrlHooks(max_steps=5, environments=environments))
    return reward


def test_a_reward_reads_the_state_each_episode_s_tool_left_in_completion_order(episodes):
    items, examples = episodes
    assert [c.episode.tool_calls for c in items] == [1, 1, 1, 1]
    counts.seen.clear()
    rewards = [WeightedReward(in_run(f)) for f in (counts, any_kwargs, plain, plain_named)]
    assert [r.reward.in_process for r in rewards] == [True, True, True, False]  # kwargs takes them too, as in TRL
    scores = score_batch(rewards, items, examples, timeout_s=30.0)
    assert scores.components["counts"] == [12.0, 12.0, 23.0, 23.0]
    assert scores.components["any_kwargs"] == [120.0, 120.0, 230.0, 230.0]
    assert scores.components["plain_named"] == [0.0] * 4
    # the very objects of the episodes (the reward ran in this process, where its call was recorded)
    assert [id(e) for e in counts.seen[0]] == [id(c.episode.environment) for c in items]
    assert len({id(e) for e in counts.seen[0]}) == 4


def test_without_environment_factory_environments_is_not_passed_and_a_reward_needing_it_is_one_line(episodes):
    items, examples = episodes
    no_env = in_run(counts, environments=False)
    assert not no_env.in_process
    with pytest.raises(RewardError, match=r"needs \['environments'\].*passed only for the episodes of a training run with environment_factory"):
        no_env.arguments(items, examples)
    alone = TrlReward(counts)  # a reward called on its own (grpolab eval): no run at all
    with pytest.raises(RewardError, match="environment_factory"):
        alone(items, examples)
    assert "environments" not in in_run(any_kwargs, environments=False).arguments(items, examples)


def test_a_completion_without_an_environment_object_is_one_line_and_single_turns_get_none(episodes):
    items, examples = episodes
    bare = [*items[:3], Completion("ok", 2)]
    with pytest.raises(RewardError, match="completion 3 of the batch has no environment object"):
        in_run(counts).arguments(bare, examples)
    single = [Completion("ok", 2)] * 4  # GRPOTrainer.evaluate's single turns in such a run: not passed, as in TRL
    assert "environments" not in in_run(any_kwargs).arguments(single, examples)
    with pytest.raises(RewardError, match=r"needs \['environments'\]"):
        in_run(counts).arguments(single, examples)
    owned = in_run(env_reward(Counter))  # the environment's own reward (trl_env.env_reward): nothing to ask
    assert owned(single, examples) == [None] * 4
    assert owned(items, examples) == [6.0, 6.0, 11.5, 11.5]  # count / 2
    assert in_run(env_reward(Bigger))(items, examples) == [None] * 4  # exactly its class, as TRL matches


def test_a_pickled_episode_carries_no_environment_object(episodes):
    items, _ = episodes
    episode = items[0].episode
    copy = pickle.loads(pickle.dumps(episode))
    assert copy.environment is None and episode.environment.count == 12
    assert copy.messages == episode.messages and copy == episode
    assert Episode((), None, 1).environment is None
