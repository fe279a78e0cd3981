"""The sampler contract (rollout/base.py ``Sampler``): every sampler class in rollout/ subclasses it and states
its capabilities, so the training loop reads them as attributes (no probes)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import SimpleNamespace

import pytest

import grpolab.rollout
from grpolab.envs import ToolLimits, build_environment
from grpolab.rollout.base import Sampler, engine_eos
from grpolab.rollout.engines import Onlooker, UnshardedSampler
from grpolab.rollout.hf import HFSampler
from grpolab.rollout.multiturn import MultiTurnSampler
from grpolab.rollout.vllm.client import ServerSampler
from grpolab.rollout.vllm.engine import VLLMSampler
from grpolab.rollout.vllm.server_client import ServerClient
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer

CAPABILITIES = ("takes_examples", "streams_groups")


def sampler_classes() -> dict[str, type]:
    """Every class defined in a module of grpolab.rollout that has ``sample`` and ``update_weights``."""
    found = {}
    for info in pkgutil.walk_packages(grpolab.rollout.__path__, "grpolab.rollout."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            own = inspect.isclass(cls) and cls.__module__ == module.__name__ and cls is not Sampler
            if own and callable(getattr(cls, "sample", None)) and callable(getattr(cls, "update_weights", None)):
                found[cls.__name__] = cls
    return found


def test_the_scan_finds_every_sampler_of_the_engines():
    assert set(sampler_classes()) == {
        "HFSampler", "UnshardedSampler", "VLLMSampler", "ServerSampler", "MultiTurnSampler", "Onlooker"
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(sampler_classes()))
def test_every_sampler_subclasses_the_contract_and_states_its_capabilities(name):
    cls = sampler_classes()[name]
    assert Sampler in cls.__mro__, f"{name} does not subclass grpolab.rollout.base.Sampler"
    for capability in CAPABILITIES:
        assert isinstance(vars(cls).get(capability), bool), f"{name} does not set {capability} = True/False itself"


def calc_env():
    return build_environment("calculator", {"call_format": "python"}, ToolLimits())


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE  # an environment's messages are laid out with one
    return tok


def test_every_sampler_built_has_every_member_of_the_contract(model, chat_tok):
    """Instances, not classes: ``pad_token_id`` (and the server's ``version``) are set in ``__init__``."""
    tok, eos = chat_tok, [chat_tok.eos_token_id]
    hf = HFSampler(model, tok, max_completion_length=4)
    server = ServerSampler(ServerClient("http://127.0.0.1:9", timeout_s=1), tok, max_completion_length=4, eos_token_ids=eos)
    samplers = {
        "hf": hf,
        "unsharded": UnshardedSampler(hf, model),
        "vllm": VLLMSampler(None, tok, max_completion_length=4, eos_token_ids=eos),
        "server": server,
        "multiturn": MultiTurnSampler(server, tok, calc_env(), max_turns=2, max_episode_tokens=16),
        "onlooker": Onlooker(tok.pad_token_id),
    }
    for name, s in samplers.items():
        assert isinstance(s, Sampler), name  # runtime_checkable: every member is there
        assert s.pad_token_id == tok.pad_token_id and s.last_sync_bytes == 0, name
        assert s.version is None, name  # no weights sent yet
        with s.awake():
            pass
    assert [n for n, s in samplers.items() if s.streams_groups] == ["server"]
    assert [n for n, s in samplers.items() if s.takes_examples] == ["multiturn"]
    server.version, server.last_sync_bytes = 3, 1024  # the wrapper has its inner sampler's versions
    assert samplers["multiturn"].version == 3 and samplers["multiturn"].last_sync_bytes == 1024
    server.close()


def test_the_wrappers_forward_send_pending_to_the_sampler_they_wrap(model, chat_tok):
    """The contract's default ``send_pending`` does nothing: a wrapper that did not forward it would keep the
    server's first weights from going before the background sampler starts (training/ahead.py)."""
    calls = []

    class Inner(Sampler):
        takes_examples = False
        streams_groups = False
        pad_token_id = 0

        def sample(self, prompt_ids, *, num_generations, generator=None):
            raise AssertionError("not sampled here")

        def send_pending(self):
            calls.append("send_pending")

    MultiTurnSampler(Inner(), chat_tok, calc_env(), max_turns=2, max_episode_tokens=16).send_pending()
    UnshardedSampler(Inner(), model).send_pending()
    assert calls == ["send_pending", "send_pending"]
    assert Sampler.send_pending(Inner()) is None and len(calls) == 2


def test_a_rank_that_takes_part_runs_the_collectives_of_one_batch(model, chat_tok, monkeypatch):
    """``take_part`` (the other ranks of a sequence-parallel group, while the first samples): the default
    sends the held-back weights, the wrappers forward it, and FSDP2's hf wrapper gathers once for it, as it
    does for a whole multi-turn batch however many turns (``awake``): the gathers are collectives, so a
    rank that takes part must run as many as the rank that samples."""
    import contextlib

    from grpolab.rollout import engines

    calls = []

    @contextlib.contextmanager
    def gathered(m):
        calls.append("gather")
        yield m
        calls.append("reshard")

    monkeypatch.setattr(engines.parallel, "gathered", gathered)

    class Inner(Sampler):
        takes_examples = False
        streams_groups = False
        pad_token_id = 0

        def sample(self, prompt_ids, *, num_generations, generator=None):
            calls.append("sample")

        def send_pending(self):
            calls.append("send_pending")

    unsharded = UnshardedSampler(Inner(), model)
    with unsharded.awake():  # a multi-turn batch: two turns
        unsharded.sample([[1]], num_generations=1)
        unsharded.sample([[1]], num_generations=1)
    assert calls == ["gather", "sample", "sample", "reshard"]
    calls.clear()
    unsharded.take_part()
    MultiTurnSampler(unsharded, chat_tok, calc_env(), max_turns=2, max_episode_tokens=16).take_part()
    Inner().take_part()
    assert calls == ["gather", "send_pending", "reshard"] * 2 + ["send_pending"]


def test_an_engine_samplers_eos_and_pad_ids():
    """engine_eos: the ids as ints; the tokenizer's pad id, else the first EOS id; none at all is one ValueError."""
    assert engine_eos(SimpleNamespace(pad_token_id=0), [5.0, 7]) == ([5, 7], 0)  # a pad id of 0 is kept
    assert engine_eos(SimpleNamespace(pad_token_id=None), (7, 5)) == ([7, 5], 7)
    with pytest.raises(ValueError, match="^eos_token_ids is empty: pass the ids that end a completion$"):
        engine_eos(SimpleNamespace(pad_token_id=0), [])
    for sampler in (VLLMSampler, ServerSampler):  # both take their EOS and pad ids from it
        with pytest.raises(ValueError, match="eos_token_ids is empty"):
            sampler(None, SimpleNamespace(pad_token_id=0), max_completion_length=4, eos_token_ids=[])
