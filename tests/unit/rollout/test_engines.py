"""The engine records (rollout/engines.py ``ENGINES``): one per engine, and every mode of a run goes through them."""

from __future__ import annotations

import dataclasses

import pytest

from grpolab.config import Config, ConfigError, load_config
from grpolab.distributed import sequence
from grpolab.rollout.base import EngineRecord
from grpolab.rollout.engines import ENGINES, Onlooker, build_hf_onlooker, build_sampler, check_engine
from grpolab.rollout.hf import HFSampler
from grpolab.rollout.vllm.server_setup import build_server_sampler
from grpolab.rollout.vllm.setup import build_vllm_sampler, check_vllm_config
from grpolab.runtime.engine_spec import engine_spec


def test_every_record_is_whole():
    sections = {f.name for f in dataclasses.fields(Config)}
    for name, record in ENGINES.items():
        assert isinstance(record, EngineRecord) and callable(record.build), name
        assert record.section is None or record.section in sections, f"{name}: no config section {record.section}"
        assert record.requires is None or all(isinstance(part, str) and part for part in record.requires), name
    assert ENGINES["vllm"] == EngineRecord(
        build=build_vllm_sampler, build_server=build_server_sampler, section="vllm", check=check_vllm_config,
        requires=ENGINES["vllm"].requires,
    )  # fmt: skip
    assert ENGINES["hf"].build_server is None and ENGINES["hf"].section is None and ENGINES["hf"].requires is None


def _recording(calls: list, label: str):
    def build(spec, **kwargs):
        calls.append((label, kwargs["wrapped"], kwargs["temperature"]))
        return label

    return build


def test_server_mode_builds_the_records_server_client_and_evaluation_its_colocated_engine(monkeypatch, model, tok):
    calls: list = []
    record = EngineRecord(build=_recording(calls, "colocated"), build_server=_recording(calls, "server"))
    monkeypatch.setitem(ENGINES, "vllm", record)
    spec = engine_spec(load_config(None, ["rollout.engine=vllm", "rollout.mode=server", "vllm.dtype=float32"]))
    assert build_sampler(spec, policy=model, tokenizer=tok, autocast_dtype=None, wrapped=model) == "server"
    assert build_sampler(spec, policy=model, tokenizer=tok, autocast_dtype=None, temperature=0.0) == "colocated"
    assert calls == [("server", model, None), ("colocated", None, 0.0)]


def test_an_engine_without_a_server_builder_refuses_server_mode_in_one_line(monkeypatch, model, tok):
    monkeypatch.setitem(ENGINES, "vllm", EngineRecord(build=_recording([], "colocated")))
    spec = engine_spec(load_config(None, ["rollout.engine=vllm", "rollout.mode=server", "vllm.dtype=float32"]))
    with pytest.raises(ConfigError, match=r"^rollout.engine=vllm has no server mode \(rollout.mode=server\): set rollout.mode=colocated$"):
        check_engine("vllm", spec)
    with pytest.raises(ConfigError, match="has no server mode"):
        build_sampler(spec, policy=model, tokenizer=tok, autocast_dtype=None, wrapped=model)


def test_the_records_checks_run_with_the_spec(monkeypatch):
    seen = []
    monkeypatch.setitem(ENGINES, "vllm", dataclasses.replace(ENGINES["hf"], check=seen.append, requires=None))
    spec = engine_spec(load_config(None, ["rollout.engine=vllm"]))
    check_engine("vllm")  # no spec: only whether it can be built here
    check_engine("vllm", spec)
    assert seen == [spec]


def test_an_unknown_engine_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"rollout.engine=sglang is not available in this installation: choose one of hf, vllm"):
        check_engine("sglang")


def test_the_hf_record_builds_the_hf_sampler(model, tok):
    spec = engine_spec(load_config(None, ["rollout.max_completion_length=3"]))
    sampler = build_sampler(spec, policy=model, tokenizer=tok, autocast_dtype=None)
    assert isinstance(sampler, HFSampler) and sampler.max_completion_length == 3


def test_a_rank_that_never_samples_gets_the_records_onlooker_and_no_engine(monkeypatch, model, tok):
    """Rank 1 of a sequence-parallel group (distributed/sequence.py ``samples``): the hf engine's ``Onlooker``, its
    sampler never built (no inference copy of the weights); an engine without an onlooker (colocated vLLM, whose
    construction is a collective of every torchrun rank) and a server's client are built as on the first rank."""
    assert ENGINES["hf"].onlooker is build_hf_onlooker and ENGINES["vllm"].onlooker is None
    calls: list = []
    monkeypatch.setattr(sequence, "_LAYOUT", sequence.Layout(2, 1, None))
    monkeypatch.setitem(ENGINES, "hf", dataclasses.replace(ENGINES["hf"], build=_recording(calls, "hf")))
    onlooker = build_sampler(engine_spec(load_config(None, [])), policy=model, tokenizer=tok, autocast_dtype=None, wrapped=model)
    assert isinstance(onlooker, Onlooker) and onlooker.wrapped is None and calls == []  # not sharded: no gathers
    onlooker.take_part()
    with pytest.raises(RuntimeError, match="does not sample"):
        onlooker.sample([[5]], num_generations=1)
    record = EngineRecord(build=_recording(calls, "colocated"), build_server=_recording(calls, "server"))
    monkeypatch.setitem(ENGINES, "vllm", record)
    for mode in ("colocated", "server"):
        spec = engine_spec(load_config(None, ["rollout.engine=vllm", f"rollout.mode={mode}", "vllm.dtype=float32"]))
        assert build_sampler(spec, policy=model, tokenizer=tok, autocast_dtype=None, wrapped=model) == mode
    monkeypatch.setattr(sequence, "_LAYOUT", sequence.Layout(2, 0, None))  # the group's first rank
    assert build_sampler(engine_spec(load_config(None, [])), policy=model, tokenizer=tok, autocast_dtype=None) == "hf"
