"""The generation engines, chosen by ``rollout.engine`` from one visible dict of records.

``ENGINES`` maps an engine name to its ``EngineRecord`` (rollout/base.py): the builder of its sampler, the
builder of its server's client (``rollout.mode=server``), its config section, its checks before any model
loads, and the package it needs. Every builder has one signature (``SamplerBuilder``, rollout/base.py) and
reads the run through an ``EngineSpec`` (rollout/base.py; runtime/engine_spec.py builds it from the config).
An engine whose package is optional names it in ``requires``: ``check_engine`` then fails on a missing
engine with one line, before any model loads. docs/layout.md says what a new engine provides.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch

from grpolab.config import ConfigError
from grpolab.distributed import parallel, sequence
from grpolab.rollout.base import EngineRecord, EngineSpec, Sampler
from grpolab.rollout.hf import sampler_from_config
from grpolab.rollout.vllm.record import VLLM


class UnshardedSampler(Sampler):
    """The hf sampler over an FSDP2 model: each ``sample`` runs with every layer unsharded
    (``parallel.gathered``), then the shards are put back for training. The rest is the inner sampler's.

    ``awake`` holds the layers gathered over several ``sample`` calls (a multi-turn batch's turns), so a
    batch gathers once, however many turns its episodes take: the gathers are collectives, and ranks whose
    episodes end at different turns would otherwise wait for each other; ``take_part`` (a rank that does not
    sample while another does) gathers once as well."""

    takes_examples = False
    streams_groups = False

    def __init__(self, sampler: Sampler, model: torch.nn.Module):
        self.sampler, self.model = sampler, model
        self.pad_token_id = sampler.pad_token_id
        self._gathered = False

    def sample(self, *args, **kwargs):
        with self.awake():
            return self.sampler.sample(*args, **kwargs)

    def take_part(self) -> None:
        with self.awake():
            self.sampler.take_part()

    @contextlib.contextmanager
    def awake(self):
        if self._gathered:
            yield
            return
        with parallel.gathered(self.model), self.sampler.awake():
            self._gathered = True
            try:
                yield
            finally:
                self._gathered = False

    def send_pending(self) -> None:
        self.sampler.send_pending()

    def update_weights(self, model: torch.nn.Module) -> None:
        self.sampler.update_weights(model)

    def close(self) -> None:
        self.sampler.close()


def build_hf_sampler(
    spec: EngineSpec[None],
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> Sampler:
    """grpolab's own decoder over the live policy (rollout/hf.py): it reads the trained weights as they are,
    so it needs no weight sync. Under FSDP every ``sample`` runs with the layers gathered (distributed/parallel.py)
    and samples from the sharded fp32 weights themselves (no low-precision copy)."""

    sharded = wrapped is not None and parallel.is_sharded(wrapped)
    sampler = sampler_from_config(
        policy,
        tokenizer,
        spec.rollout,
        autocast_dtype=autocast_dtype,
        temperature=temperature,
        cast_weights=False if sharded else None,
    )
    return UnshardedSampler(sampler, wrapped) if sharded else sampler


class Onlooker(Sampler):
    """The sampler of a rank that never samples: the other ranks of a sequence-parallel group, whose first rank
    samples for them (training/sampling.py, eval/runner.py). It builds no engine and holds nothing (no
    inference copy of the weights, no KV cache); ``take_part`` runs what a ``sample`` of the hf engine runs
    with the other ranks: under FSDP2 the layers' gathers (``UnshardedSampler``), nothing otherwise."""

    takes_examples = False
    streams_groups = False

    def __init__(self, pad_token_id: int, wrapped: torch.nn.Module | None = None):
        self.pad_token_id = pad_token_id
        self.wrapped = wrapped if wrapped is not None and parallel.is_sharded(wrapped) else None
        """The FSDP2 policy whose layers a ``sample`` gathers on the sampling rank; None: no gathers."""

    def sample(self, *args, **kwargs):
        raise RuntimeError("this rank does not sample (distributed/sequence.py samples): call take_part")

    def take_part(self) -> None:
        if self.wrapped is not None:
            with parallel.gathered(self.wrapped):
                pass

    def update_weights(self, model: torch.nn.Module) -> None:
        """Nothing: the hf engine reads the live policy, no sync to line up."""

    def close(self) -> None:
        """Nothing held."""


def build_hf_onlooker(
    spec: EngineSpec,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> Sampler:
    """The hf engine's ``Onlooker`` (``EngineRecord.onlooker``)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Onlooker(pad, wrapped)


HF = EngineRecord(build=build_hf_sampler, onlooker=build_hf_onlooker)
"""``rollout.engine=hf``: grpolab's own decoder, colocated only; its settings are rollout.*."""

ENGINES: dict[str, EngineRecord] = {"hf": HF, "vllm": VLLM}
"""rollout.engine -> its record. A new engine: its package (with its record) and one entry here."""


def check_engine(name: str, spec: EngineSpec | None = None) -> None:
    """A ConfigError (one line, with the fix) when engine ``name`` cannot be built here, or (given ``spec``)
    cannot run ``spec``'s model with its settings; call it before any model loads."""
    record = ENGINES.get(name)
    requires = record.requires if record is not None else None
    if record is None or (requires is not None and importlib.util.find_spec(requires[0]) is None):
        how = requires[1] if requires is not None else f"choose one of {', '.join(sorted(ENGINES))}"
        raise ConfigError(
            f"rollout.engine={name} is not available in this installation: {how} "
            "(or set rollout.engine=hf, grpolab's own decoder)"
        )
    if spec is None:
        return
    if spec.rollout.mode == "server" and record.build_server is None:
        raise _no_server_mode(name)
    if record.check is not None:
        record.check(spec)


def build_sampler(
    spec: EngineSpec,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
) -> Sampler:
    """The sampler of ``spec.rollout.engine`` (``SamplerBuilder`` in rollout/base.py says what the arguments
    are). rollout.mode=server and a training policy (``wrapped``): the record's ``build_server``, the client
    of the engine's server; an evaluation (no ``wrapped``) runs the colocated engine, so it never changes the
    weights a server serves. On a rank that never samples (sequence parallelism's other ranks) the record's
    ``onlooker`` where it has one: no engine is built there."""
    check_engine(spec.rollout.engine)
    record = ENGINES[spec.rollout.engine]
    server = spec.rollout.mode == "server" and wrapped is not None
    builder = record.build_server if server else record.build
    if not server and not sequence.samples() and record.onlooker is not None:
        builder = record.onlooker  # another rank of its sequence-parallel group samples for this one
    if builder is None:
        raise _no_server_mode(spec.rollout.engine)
    return builder(
        spec,
        policy=policy,
        tokenizer=tokenizer,
        autocast_dtype=autocast_dtype,
        wrapped=wrapped,
        temperature=temperature,
    )


def _no_server_mode(name: str) -> ConfigError:
    return ConfigError(f"rollout.engine={name} has no server mode (rollout.mode=server): set rollout.mode=colocated")
