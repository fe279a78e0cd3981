"""Colocated vLLM's memory order (rollout/vllm/engine.py), against a recording stand-in for the engine: after each
rollout the engine sleeps at level 2 (weights discarded, not copied to host); a sync wakes the weights
alone, loads them, and the KV cache wakes only for the next rollout; a rollout after a level-2 sleep with
no sync in between (DAPO's extra rounds, an evaluation on the same engine) syncs first, so no sample ever
comes from discarded weights. An engine that never had weights synced keeps them: level 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="SamplingParams comes from vLLM (pip install 'grpolab[vllm]')")

from grpolab.rollout.vllm import engine as vllm_module  # noqa: E402
from grpolab.rollout.vllm.engine import VLLMSampler  # noqa: E402
from grpolab.rollout.vllm.sync import policy_weights as real_policy_weights  # noqa: E402
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


class RecordingEngine:
    """Sleep / wake / reload / generate as vLLM's LLM does them, recorded; weights are "valid" only after a
    reload since the last level-2 sleep."""

    def __init__(self):
        self.calls, self.asleep, self.weights_valid = [], set(), True
        self.llm_engine = SimpleNamespace(is_sleeping=lambda: bool(self.asleep), model_config=SimpleNamespace(dtype=torch.float32))

    def sleep(self, level=1):
        self.calls.append(f"sleep{level}")
        self.asleep = {"weights", "kv_cache"}
        self.weights_valid = self.weights_valid and level == 1

    def wake_up(self, tags=None):
        self.calls.append("wake:" + ",".join(tags or ["all"]))
        self.asleep -= set(tags or self.asleep)

    def collective_rpc(self, name, kwargs):
        assert "weights" not in self.asleep, "weights loaded into sleeping memory"
        assert "kv_cache" in self.asleep or not self.calls or self.calls[-1] == "init", "KV cache awake during the sync"
        list(kwargs["weights_iterator"])
        self.weights_valid = True
        self.calls.append("reload")

    def apply_model(self, fn):
        return [fn(torch.nn.Linear(2, 2))]  # one in-process worker; an fp32 model, as model_config says

    def reset_prefix_cache(self):
        pass

    def generate(self, requests, params, use_tqdm=False):
        assert not self.asleep and self.weights_valid, "sampled from a sleeping engine or discarded weights"
        self.calls.append("generate")
        out = SimpleNamespace(token_ids=[5, 2], logprobs=[{5: SimpleNamespace(logprob=-1.0)}, {2: SimpleNamespace(logprob=-0.5)}])
        return [SimpleNamespace(outputs=[out] * params.n) for _ in requests]  # one request per prompt, n samples


def _sampler(engine, weights_from=None):
    tok = build_char_tokenizer()
    return VLLMSampler(engine, tok, max_completion_length=4, eos_token_ids=[2], weights_from=weights_from, sleep_mode=True), tok


def test_level_2_sleep_and_the_wake_order_of_a_training_loop():
    engine = RecordingEngine()
    engine.calls.append("init")
    policy = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    sampler, _ = _sampler(engine, weights_from=policy)
    try:
        sampler.sample([[5, 6]], num_generations=2)  # step 1: the pending sync, then the rollout
        sampler.update_weights(policy)  # after the update
        sampler.sample([[5, 6]], num_generations=2)  # step 2
        sampler.sample([[7]], num_generations=2)  # another round with no update in between
        second, _ = _sampler(engine)  # an evaluation's sampler on the same engine
        second.sample([[8]], num_generations=1)
    finally:
        vllm_module.ENGINE_STATE.pop(id(engine), None)
    assert engine.calls == [
        "init", "reload", "generate", "sleep2",
        "wake:weights", "reload", "wake:all", "generate", "sleep2",
        "wake:weights", "reload", "wake:all", "generate", "sleep2",  # synced again: the weights were discarded
        "wake:weights", "reload", "wake:all", "generate", "sleep2",
    ]  # fmt: skip


def test_an_engine_never_synced_keeps_its_weights_at_level_1():
    engine = RecordingEngine()
    sampler, _ = _sampler(engine)
    sampler.sample([[5]], num_generations=1)
    sampler.sample([[5]], num_generations=1)
    assert engine.calls == ["generate", "sleep1", "wake:all", "generate", "sleep1"]


def test_turns_held_awake_sync_once_and_sleep_once():
    """A multi-turn batch's turns (rollout/multiturn.py holds the sampler ``awake``): one sync before the first
    turn, no reload between turns (under torchrun a reload is FSDP2's gathers, collectives, and ranks' episodes
    end at different turns), one level-2 sleep after the last."""
    engine = RecordingEngine()
    engine.calls.append("init")
    policy = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    sampler, _ = _sampler(engine, weights_from=policy)
    try:
        with sampler.awake():
            for _ in range(3):  # three turns
                sampler.sample([[5, 6]], num_generations=1)
        sampler.sample([[5, 6]], num_generations=1)  # the next batch: the weights were discarded, synced again
    finally:
        vllm_module.ENGINE_STATE.pop(id(engine), None)
    assert engine.calls == [
        "init", "reload", "generate", "generate", "generate", "sleep2",
        "wake:weights", "reload", "wake:all", "generate", "sleep2",
    ]  # fmt: skip


def test_a_multi_turn_batch_holds_the_sampler_awake():
    from grpolab.envs.base import EnvStep
    from grpolab.rollout.multiturn import MultiTurnSampler
    from grpolab.tasks.tiny import CHAT_TEMPLATE
    from grpolab.types import Example

    class Nag:
        """Never done: three model turns per episode."""

        tools: list = []

        def reset(self, example):
            return [{"role": "user", "content": example.prompt}]

        def step(self, model_turn):
            return EnvStep([{"role": "user", "content": "again"}])

    engine = RecordingEngine()
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    policy = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2)
    sampler = VLLMSampler(engine, tok, max_completion_length=4, eos_token_ids=[2], weights_from=policy, sleep_mode=True)
    turns = MultiTurnSampler(sampler, tok, Nag, max_turns=3, max_episode_tokens=200)
    try:
        turns.sample([tok.encode("2*3=")], num_generations=2, examples=[Example("2*3=")])
    finally:
        vllm_module.ENGINE_STATE.pop(id(engine), None)
    assert engine.calls == ["reload", "generate", "generate", "generate", "sleep2"]


def test_a_rank_that_takes_part_syncs_where_the_sampling_rank_does_and_never_generates():
    """The other ranks of a sequence-parallel group call ``take_part`` where the first calls ``sample``: their
    engines sync at the same calls as the first test's (the pending weights, after the update, and in a round
    after a level-2 sleep; under FSDP2 a sync's gathers are collectives, so a rank syncing alone would wait
    forever) and sleep after each, but never generate."""
    engine = RecordingEngine()
    engine.calls.append("init")
    policy = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    sampler, _ = _sampler(engine, weights_from=policy)
    try:
        sampler.take_part()  # step 1
        sampler.update_weights(policy)
        sampler.take_part()  # step 2
        sampler.take_part()  # another round with no update in between
    finally:
        vllm_module.ENGINE_STATE.pop(id(engine), None)
    assert engine.calls == [
        "init", "reload", "sleep2",
        "wake:weights", "reload", "sleep2",
        "wake:weights", "reload", "sleep2",  # synced again, as the sampling rank does: the weights were discarded
    ]  # fmt: skip


class AwakeEngine(RecordingEngine):
    """An engine without sleep mode: it loads weights while its KV cache is allocated."""

    def collective_rpc(self, name, kwargs):
        list(kwargs["weights_iterator"])
        self.calls.append("reload")


def _training_and_evaluation(engine, policy, log: list, *, idle: bool, sleep_mode: bool = True) -> None:
    """A run's calls on one rank: the pending sync, an update, a round with no update, a multi-turn batch held
    awake, then an evaluation's sampler on the same engine; ``idle``: a rank that only takes part."""
    tok = build_char_tokenizer()

    def sampler_of():
        return VLLMSampler(engine, tok, max_completion_length=4, eos_token_ids=[2], weights_from=policy,
                           sleep_mode=sleep_mode, idle=idle)  # fmt: skip

    def act(sampler):
        log.append("call")
        sampler.take_part() if idle else sampler.sample([[5, 6]], num_generations=2)

    train = sampler_of()
    act(train)
    train.update_weights(policy)
    act(train)
    act(train)
    with train.awake():
        act(train)
        act(train)
    act(train)  # after the held batch's sleep
    evaluation = sampler_of()
    act(evaluation)
    act(evaluation)


@pytest.mark.parametrize("sleep_mode", [True, False])
def test_an_idle_rank_gathers_where_the_sampling_rank_syncs_and_its_engine_never_takes_weights(monkeypatch, sleep_mode):
    """The other ranks of a sequence-parallel group have an idle sampler (rollout/vllm/setup.py): their engine was
    built (a collective of every torchrun rank) but never loads weights, wakes or generates, and with sleep mode
    sleeps at level 2 from the start (weights and KV cache freed). Each sync of the sampling rank is a pass over
    ``policy_weights`` there (under FSDP2 its gathers are collectives): in the same calls, as many."""
    policy = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    logs: dict = {}
    for idle in (False, True):
        log, engine = logs.setdefault(idle, []), (RecordingEngine if sleep_mode else AwakeEngine)()
        engine.calls.append("init")

        def drained(model, *args, log=log, **kwargs):
            log.append("gather")
            yield from real_policy_weights(model, *args, **kwargs)

        monkeypatch.setattr(vllm_module, "policy_weights", drained)
        try:
            _training_and_evaluation(engine, policy, log, idle=idle, sleep_mode=sleep_mode)
        finally:
            vllm_module.ENGINE_STATE.pop(id(engine), None)
            vllm_module.IDLE_AWAKE.pop(id(engine), None)
        if idle:
            assert engine.calls == (["init", "sleep2"] if sleep_mode else ["init"])
            with pytest.raises(RuntimeError, match="does not sample"):
                VLLMSampler(engine, build_char_tokenizer(), max_completion_length=4, eos_token_ids=[2], idle=True).sample(
                    [[5]], num_generations=1
                )
        else:
            assert engine.calls.count("generate") == 8
    assert logs[True] == logs[False]
    # the pending sync, the update, the round after a level-2 sleep, the held batch's first call, the call after
    # it, the evaluation's pending weights and its second call after a sleep; without sleep mode only the
    # pending weights (of each sampler) and the update
    want = ["call", "gather", "gather", "call", "call", "gather", "call", "gather", "call", "call", "gather",
            "call", "gather", "call", "gather"]  # fmt: skip
    if not sleep_mode:
        want = ["call", "gather", "gather", "call", "call", "call", "call", "call", "call", "gather", "call"]
    assert logs[True] == want
