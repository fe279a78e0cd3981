"""Failed samples in a step (training/sampling.py, training/failures.py): a group with a failed sample is dropped,
never scored 0, and sets no baseline; the step trains on the groups left; each kind is counted in the metrics; more
failed groups than train.max_failed_group_share stop the run with one line, on every rank at once."""

from __future__ import annotations

import math
import time

import pytest
import torch

from grpolab.data import PromptOrder
from grpolab.envs import EnvStep
from grpolab.rewards import WeightedReward
from grpolab.rollout import base
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids
from grpolab.sandbox.runner import SandboxError
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer
from grpolab.training.failures import FailedGroups
from grpolab.training.sampling import sample_step
from grpolab.training.spec import SamplingSpec
from grpolab.types import FAILURE_KINDS, Completions, Example, Failure

G = 4
P = 6


class Sampler(base.Sampler):
    """Prompt k's G samples: "k" for the first 1 + k % 3, "x" for the rest (every group mixed: a signal). The rows of
    the prompts in ``engine_fails`` come back failed, as a server's failed requests do."""

    def __init__(self, engine_fails=()):
        self.engine_fails, self.calls = set(engine_fails), 0

    def sample(self, prompt_ids, *, num_generations, generator):
        self.calls += 1
        texts = [str(ids[0]) if j < 1 + ids[0] % 3 else "x" for ids in prompt_ids for j in range(num_generations)]
        n = len(texts)
        out = Completions(
            prompt_ids=[list(p) for p in prompt_ids for _ in range(num_generations)],
            completion_ids=torch.ones(n, 2, dtype=torch.long), completion_mask=torch.ones(n, 2, dtype=torch.bool),
            logprobs=torch.zeros(n, 2), texts=texts, finish_reasons=["stop"] * n, num_generations=num_generations,
        )  # fmt: skip
        bad = Failure("engine_error", "the vLLM server at http://127.0.0.1:1 answered /v1/completions with 500")
        failures = [bad if ids[0] in self.engine_fails else None for ids in prompt_ids for _ in range(num_generations)]
        out.failures = failures if any(failures) else None
        return out


class Judge:
    """A batched reward, 1 for a right answer, that fails on the prompts in ``fails`` (prompt -> how); the prompts
    it saw, per call."""

    in_process = True

    def __init__(self, fails):
        self.name, self.fails, self.seen = "judge", fails, []

    def __call__(self, completions, examples):
        self.seen.append({int(e.prompt[1:]) for e in examples})
        how = {self.fails[k] for k in self.seen[-1] if k in self.fails}
        values = [float(c.text == e.answer) for c, e in zip(completions, examples, strict=True)]
        if "raise" in how:
            raise ConnectionResetError("the judge's server is gone")
        if "sandbox" in how:
            raise SandboxError("the sandbox process exited with status 1 before running the code")
        if "hang" in how:
            time.sleep(5)
        if "none" in how:
            return None
        return [math.nan if self.fails.get(int(e.prompt[1:])) == "nan" else v for e, v in zip(examples, values, strict=True)]


EXAMPLES = [Example(prompt=f"q{k}", answer=str(k)) for k in range(30)]
PROMPT_IDS = [[k] for k in range(30)]


def _step(fails=None, sampler=None, examples=EXAMPLES, prompt_ids=PROMPT_IDS, **settings):
    spec = SamplingSpec(prompts_per_step=P, num_generations=G, **settings)
    judge = Judge(fails or {})
    step = sample_step(
        spec, sampler=sampler or Sampler(), rewards=[WeightedReward(judge)], examples=examples, prompt_ids=prompt_ids,
        data=PromptOrder(len(examples), seed=0, shuffle=False), generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    return step, judge


def _right(k: int) -> list[float]:
    return [1.0] * (1 + k % 3) + [0.0] * (G - 1 - k % 3)


def test_a_group_whose_reward_failed_is_dropped_never_scored_zero():
    step, judge = _step({2: "raise"})
    assert step.rows == [0, 1, 3, 4, 5] and step.valid.all()  # prompt 2 is not in the step at all
    assert step.rewards.tolist() == [_right(k) for k in (0, 1, 3, 4, 5)]
    # the drawn mean leaves it out too: 9 right of 20 (as 0s it would read 9 of 24)
    assert step.metrics["train/reward_mean_drawn"] == pytest.approx(9 / 20)
    m = step.metrics
    assert (m["failures/reward_error"], m["failures/groups_dropped"], m["failures/retries"]) == (1, 1, P)
    assert m["failures/group_share"] == pytest.approx(1 / 6)
    assert all(m[f"failures/{kind}"] == 0 for kind in FAILURE_KINDS if kind != "reward_error")
    assert judge.seen[0] == set(range(P)) and judge.seen[1:] == [{k} for k in range(P)]  # the batch, then each alone


def test_each_kind_is_counted_under_its_own_key_and_an_engine_failure_is_never_scored():
    fails = {1: "nan", 2: "raise", 3: "sandbox", 4: "none"}
    step, judge = _step(fails, max_failed_group_share=1.0, sampler=Sampler(engine_fails={0}))
    assert step.rows == [5]
    m = step.metrics
    counted = {kind: m[f"failures/{kind}"] for kind in FAILURE_KINDS if m[f"failures/{kind}"]}
    assert counted == {"engine_error": 1, "reward_nan": 1, "reward_error": 1, "sandbox_error": 1, "reward_invalid": 1}
    assert m["failures/groups_dropped"] == 5 and m["failures/group_share"] == pytest.approx(5 / 6)
    assert all(0 not in seen for seen in judge.seen)  # the engine's failed group never reached the reward


class Streaming(Sampler):
    """Hands each group over as it is done (server mode: training/sampling.py scores it while the rest generate)."""

    streams_groups = True

    def sample(self, prompt_ids, *, num_generations, generator, on_group):
        out = super().sample(prompt_ids, num_generations=num_generations, generator=generator)
        for p in reversed(range(len(prompt_ids))):  # in the order they finish, not the prompts'
            on_group(p, out.select(list(range(p * num_generations, (p + 1) * num_generations))))
        return out


def test_groups_scored_as_they_finish_drop_and_count_alike():
    step, judge = _step({4: "raise"}, sampler=Streaming(engine_fails={1}))
    assert step.rows == [0, 2, 3, 5] and step.rewards.tolist() == [_right(k) for k in (0, 2, 3, 5)]
    m = step.metrics
    assert (m["failures/engine_error"], m["failures/reward_error"], m["failures/groups_dropped"]) == (1, 1, 2)
    assert all(1 not in seen for seen in judge.seen)


def test_a_reward_past_its_timeout_drops_its_group():
    step, _ = _step({3: "hang"}, reward_timeout_s=0.3)
    assert step.rows == [0, 1, 2, 4, 5] and step.metrics["failures/reward_timeout"] == 1


def test_more_failed_groups_than_the_limit_stop_with_one_line():
    with pytest.raises(FailedGroups) as err:
        _step({0: "raise", 1: "raise", 2: "raise", 3: "raise"})
    message = str(err.value)
    assert message.startswith(
        "4 of 6 groups (67%) were dropped for failed samples (reward_error 4; the first: reward 'judge' raised "
        "ConnectionResetError on a batch of 4 (first example 0 (prompt: 'q0')): the judge's server is gone."
    )
    assert message.endswith(
        "more than train.max_failed_group_share=0.5. Fix what failed, give it more retries (reward.max_retries, "
        "env.max_retries), or raise train.max_failed_group_share"
    )
    assert "\n" not in message
    step, _ = _step({0: "raise", 1: "raise", 2: "raise"})  # 3 of 6 is not more than half: it trains on 3
    assert step.rows == [3, 4, 5]
    step, _ = _step({0: "raise", 1: "raise", 2: "raise", 3: "raise"}, max_failed_group_share=0.7)
    assert step.rows == [4, 5]


def test_a_step_with_no_group_left_stops_even_at_share_one():
    with pytest.raises(FailedGroups, match=r"^6 of 6 groups \(100%\) were dropped .*, and a rank has no group left"):
        _step(dict.fromkeys(range(P), "raise"), max_failed_group_share=1.0)


def test_dynamic_sampling_fills_the_place_of_a_failed_group():
    step, _ = _step({2: "raise"}, dynamic_sampling=True)
    assert step.rows == [0, 1, 3, 4, 5, 6] and step.metrics["train/sampling_rounds"] == 2
    assert step.metrics["failures/reward_error"] == 1 and step.metrics["train/groups_drawn"] == 2 * P


class Remote:
    """One turn, reward 1 when the answer is right; the service behind prompt "q2" is gone."""

    tools: list = []

    def reset(self, example):
        self.example = example
        return [{"role": "user", "content": example.prompt}]

    async def step(self, model_turn):
        if self.example.prompt == "q2":
            raise ConnectionResetError("[Errno 104] Connection reset by peer")
        return EnvStep(reward=float(model_turn == self.example.answer), done=True)


class Turns(base.Sampler):
    """An inner sampler for episodes: every turn "1" + EOS."""

    def __init__(self, tok):
        self.tok, self.pad_token_id = tok, tok.pad_token_id

    def sample(self, prompt_ids, *, num_generations, generator=None):
        turn = self.tok("1", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        ids = torch.tensor([turn] * len(prompt_ids))
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Completions([list(p) for p in prompt_ids], ids, mask, -mask.float(), ["1"] * len(ids), ["stop"] * len(ids), 1)


def test_an_environment_whose_service_is_gone_drops_its_group_after_the_retries():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    examples = [Example(f"q{k}", "1") for k in range(P)]
    sampler = MultiTurnSampler(Turns(tok), tok, Remote, max_turns=1, max_episode_tokens=32)
    step, judge = _step(
        None, sampler=sampler, examples=examples, prompt_ids=episode_prompt_ids(examples, tok, Remote)
    )
    assert step.rows == [0, 1, 3, 4, 5]
    m = step.metrics
    assert (m["failures/env_error"], m["failures/groups_dropped"]) == (1, 1)
    assert m["failures/retries"] == G  # each of q2's episodes ran again once; the reward never failed
    assert all(2 not in seen for seen in judge.seen)


def _rank_steps(rank: int, world: int, port: int, out: str) -> None:
    """A rank of a 2-process gloo job: a step where rank 1's share has a failed group, and one with too many."""
    import os

    import torch.distributed as tdist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    from grpolab.distributed import dist

    with dist.session("cpu"):
        step, _ = _step({4: "raise"})  # rank 0 draws prompts 0-2, rank 1 prompts 3-5
        mine = {"rows": step.rows, **{k: v for k, v in step.metrics.items() if k.startswith("failures/")}}
        try:
            _step({3: "raise", 4: "raise"}, max_failed_group_share=0.3)
            mine["stopped"] = None
        except FailedGroups as err:
            mine["stopped"] = str(err)
        every = [None] * world
        tdist.all_gather_object(every, mine)
        if rank == 0:
            torch.save(every, out)


def test_two_ranks_drop_alike_count_alike_and_stop_together(tmp_path):
    """Rank 1 keeps 2 groups of its 3, so both ranks train on 2 (DDP / FSDP need equal forwards); the counts are
    the step's, over both ranks, on both; and a stop is raised on both ranks with the same line."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "steps.pt"
    mp.start_processes(_rank_steps, args=(2, port, str(out)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = torch.load(out, weights_only=False)
    assert r0["rows"] == [0, 1] and r1["rows"] == [3, 5]
    for r in (r0, r1):
        assert (r["failures/reward_error"], r["failures/groups_dropped"]) == (1, 1)
        assert r["failures/group_share"] == pytest.approx(1 / 6)
    assert r0["stopped"] == r1["stopped"] and r0["stopped"].startswith(
        "2 of 6 groups (33%) were dropped for failed samples (reward_error 2; the first: reward 'judge' raised "
        "ConnectionResetError on a batch of 4 (first example 0 (prompt: 'q3'))"
    )  # rank 1's first failure (rank 0 had none): its group 0, retried alone
