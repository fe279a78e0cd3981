"""The sampler contract: prompt token ids in, a prompt-major group of completions out; the record of an
engine that builds samplers (``EngineRecord``), and what its builders read of a run (``EngineSpec``).

The engines that implement it, and how one is chosen (``rollout.engine``), are in rollout/engines.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

from grpolab.config import ModelConfig, RolloutConfig
from grpolab.errors import GrpolabError, TrainingError
from grpolab.types import Completions, FinishReason


class SamplerFailed(TrainingError):
    """Sampling cannot go on; the training loop adds the step, the model and the last good checkpoint
    (run.guards.sampling_guard). ``remedy``: what to do, said after those."""

    remedy = ""


class NonFiniteLogits(SamplerFailed):
    """The model gave NaN or +inf logits while sampling (NaN weights, or an fp16 overflow). The sampler
    raises it instead of drawing from a NaN distribution (torch.multinomial's traceback on a CPU, a
    device assert on CUDA)."""

    remedy = (
        "Check the model's weights are finite (a damaged file, a diverged run), or use model.dtype=bfloat16 / "
        "float32 instead of float16."
    )


class EngineDied(SamplerFailed):
    """The inference engine (vLLM) died: its process or its core ended (vLLM's EngineDeadError)."""

    remedy = (
        "The engine's own log above says why (out of memory is the usual cause: lower vllm.gpu_memory_utilization "
        "or vllm.kv_cache_space_gb); then continue with grpolab train --resume."
    )


class SampleFailed(GrpolabError, RuntimeError):
    """A sample failed where its group cannot be dropped (evaluation: the missing answers would bias pass@k)."""


def without_failures(completions: Completions, what: str) -> Completions:
    """``completions``, or SampleFailed naming ``what`` was sampled and the first failed row's failure. Training
    drops a failed sample's group instead (docs/training.md, "Failed samples"); other callers stop here."""
    failure = completions.first_failure
    if failure is not None:
        raise SampleFailed(f"{what}: a sample failed ({failure.kind}): {failure.message}")
    return completions


@runtime_checkable
class Sampler(Protocol):
    """Samples G completions for each of P prompts: everything the training loop asks of an engine.

    Rows are prompt-major: row ``p * G + g`` of every [N, ...] field is sample g of prompt p.
    ``logprobs`` are the log-probs the sampler assigned to the sampled tokens (see
    ``grpolab.types``); the trainer uses them as ``old_logprobs``.

    A sample that failed (its engine request, its environment, after the sampler's own retries) is a row of
    its group like the others, named in ``Completions.failures``; the caller drops its group
    (training/sampling.py) or stops (``without_failures``).

    Every sampler class subclasses this Protocol (a test checks each one in rollout/), so the members with a
    default below hold for an engine that does not set them; the loop reads them as attributes, never with a
    probe. The capabilities name the keyword arguments ``sample`` then takes besides its own signature; the
    loop passes them only to a sampler that declares them, so every other one keeps this signature.
    """

    takes_examples: bool = False
    """``sample`` takes ``examples=`` [P], the task items of the prompts (an environment sampler resets its
    episodes with them: grpolab.rollout.multiturn)."""
    streams_groups: bool = False
    """``sample`` takes ``on_group=``, called ``on_group(p, group)`` with prompt p's G completions (on the host) as
    soon as they are done, while the others still generate (server mode: training/sampling.py scores them then)."""
    pad_token_id: int
    """The id that fills ``completion_ids`` past a row's length (a wrapper pads its own rows with it)."""
    version: int | None = None
    """The weight version the engine serves (0 = the first sync, +1 per ``update_weights``), recorded on every
    sample (``Completions.weight_versions``; bounded staleness: training/ahead.py); None for an engine
    without versions (hf reads the live model; colocated vLLM takes every update before the next sample)."""
    last_sync_bytes: int = 0
    """The bytes the last weight sync sent (``sys/weight_sync_bytes`` beside the staleness metrics)."""

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
    ) -> Completions: ...

    def send_pending(self) -> None:
        """Take the weights given at construction now, if not taken yet (the first ``sample`` would). The
        background sampler's owner calls it before its thread starts (training/ahead.py), so that the sync's
        collectives (FSDP2 gathers, the ranks' barrier) run on the main thread. Default: nothing held back."""
        return None

    def take_part(self) -> None:
        """What a rank runs in place of ``sample`` when another rank samples for it (the other ranks of a
        sequence-parallel group: training/sampling.py): the collectives ``sample`` would run (a held-back
        weight sync, FSDP2's gathers) and none of the sampling, so the ranks' collectives still pair up.
        Default: the held-back weights, which the first ``sample`` would send."""
        self.send_pending()

    def awake(self) -> AbstractContextManager[None]:
        """Several ``sample`` calls as one batch (a multi-turn batch's turns: rollout/multiturn.py): an engine
        that sleeps after each ``sample`` (colocated vLLM's sleep mode) sleeps once, at the end. Default:
        nothing to hold."""
        return contextlib.nullcontext()

    def update_weights(self, model: torch.nn.Module) -> None:
        """Take the policy's current weights. The loop calls it after every policy update (after the
        step's optimizer steps, before the next ``sample``) and once after a resume, with the policy
        as the trainer holds it (possibly DDP- or FSDP-wrapped). A sampler that reads the live model
        (hf) does nothing."""
        ...

    def close(self) -> None:
        """Release what the engine holds (memory, processes) at the end of a run; hf: nothing."""
        ...


Section = TypeVar("Section")


@dataclass(frozen=True)
class EngineSpec(Generic[Section]):
    """What an engine's builders and checks read of a run (``EngineRecord``), read from the config once, at
    assembly (runtime/engine_spec.py): typed, frozen sections and plain values, never the whole ``Config``."""

    model: ModelConfig
    """model.*: the source the engine loads (name_or_path, tokenizer, revision, trust_remote_code), its dtype,
    the device and autocast it resolves to, and LoRA's settings."""
    rollout: RolloutConfig
    """rollout.*: the engine's name and mode, the sampling settings (``sampling_settings``), server mode's."""
    section: Section
    """The engine's own settings, the config section its record names (``EngineRecord.section``; vllm: a
    ``VLLMConfig``); None for an engine without one (hf)."""
    seed: int
    """The run's seed (vLLM seeds its engine with it)."""
    max_prompt_length: int
    """data.max_prompt_length: the longest prompt, in tokens."""
    max_episode_tokens: int
    """env.max_episode_tokens when an environment runs (a turn's prompt is the episode so far), else 0."""

    @property
    def longest_sequence(self) -> int:
        """The most tokens one engine call holds: the longest prompt, the episode so far and a whole completion."""
        return self.max_prompt_length + self.max_episode_tokens + self.rollout.max_completion_length


class SamplerBuilder(Protocol):
    """How an engine builds its sampler; ``ENGINES`` (rollout/engines.py) calls every builder so.

    * ``spec``: the run's ``EngineSpec`` (its ``section``: the engine's own settings);
    * ``policy``: the plain (unwrapped) policy, a transformers model or its PEFT wrapper;
    * ``wrapped``: the same policy as the trainer holds it (DDP / FSDP2), or None outside training;
    * ``temperature``: None = ``rollout.temperature``; evaluation passes its own (0 = greedy).
    """

    def __call__(
        self,
        spec: EngineSpec,
        *,
        policy: torch.nn.Module,
        tokenizer,
        autocast_dtype: torch.dtype | None,
        wrapped: torch.nn.Module | None = None,
        temperature: float | None = None,
    ) -> Sampler: ...


@dataclass(frozen=True)
class EngineRecord:
    """Everything grpolab knows of one generation engine: its entry in ``ENGINES`` (rollout/engines.py), which
    ``rollout.engine`` names. docs/layout.md says what an engine must provide."""

    build: SamplerBuilder
    """The sampler of ``rollout.mode=colocated`` (the engine in the training process), and of every evaluation."""
    build_server: SamplerBuilder | None = None
    """The client of the engine's server (``rollout.mode=server``, a training policy); None = no server mode."""
    section: str | None = None
    """The Config section of the engine's own settings (``vllm``: config/engine.py), which its ``EngineSpec``
    carries; None = rollout.* only."""
    check: Callable[[EngineSpec], None] | None = None
    """Checks of its settings against the model's config.json (architecture, memory), before any model loads:
    a ConfigError with the fix."""
    requires: tuple[str, str] | None = None
    """An optional engine: (the package it imports, the command that installs it); None = always available."""
    onlooker: SamplerBuilder | None = None
    """The sampler of a rank that never samples (the other ranks of a sequence-parallel group: distributed/
    sequence.py ``samples``): no engine, only the collectives of ``sample`` (``take_part``). None: the engine's
    own sampler is built there too, because building the engine is itself a collective (colocated vLLM under
    torchrun: docs/distributed.md, "Long sequences")."""


def check_sampling(
    *, max_completion_length: int, temperature: float, top_p: float, top_k: int, min_p: float = 0.0,
    repetition_penalty: float = 1.0,
) -> None:
    """The sampling settings every engine takes, with the same meaning (0 / 1 = off), checked alike."""
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")


def sampling_settings(rollout: RolloutConfig, temperature: float | None = None) -> dict[str, Any]:
    """The settings of ``check_sampling`` from rollout.*, as every engine's sampler takes them (keywords);
    ``temperature`` overrides rollout.temperature (an evaluation: greedy, eval.temperature)."""
    return {
        "max_completion_length": rollout.max_completion_length,
        "temperature": rollout.temperature if temperature is None else temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "min_p": rollout.min_p,
        "repetition_penalty": rollout.repetition_penalty,
    }


def check_prompts(prompt_ids: list[list[int]], num_generations: int) -> None:
    """What every engine's ``sample`` needs of its inputs: G >= 1 and at least one token in every prompt."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: pass at least one prompt")
    empty = [i for i, p in enumerate(prompt_ids) if len(p) == 0]
    if empty:
        raise ValueError(f"prompts {empty} have no tokens: start every prompt with at least one token (e.g. BOS)")


def engine_eos(tokenizer, eos_token_ids: Sequence[int]) -> tuple[list[int], int]:
    """(the EOS ids, the pad id) of a sampler over an engine that is given its EOS ids (vLLM colocated and a
    server's client): a ValueError when there are none; the pad id is the tokenizer's, else the first EOS id."""
    if not eos_token_ids:
        raise ValueError("eos_token_ids is empty: pass the ids that end a completion")
    ids = [int(i) for i in eos_token_ids]
    return ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ids[0]


def resolve_eos(model, tokenizer, eos_token_ids: Sequence[int] | None) -> list[int]:
    """The EOS token ids a sampler stops at: ``eos_token_ids`` when given, else the tokenizer's EOS and the
    model's ``generation_config.eos_token_id`` (one id or a list), without repeats. Every engine stops at
    the same ids, so a sample ends at the same token whichever engine drew it."""
    if eos_token_ids is not None:
        ids = list(eos_token_ids)
    else:
        ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids += config_eos if isinstance(config_eos, list) else [config_eos] if config_eos is not None else []
    ids = list(dict.fromkeys(int(i) for i in ids))
    if not ids:
        raise ValueError(
            "no EOS token: the tokenizer and generation_config have none; pass eos_token_ids=[...]"
        )
    return ids


def package_completions(
    prompt_ids: Sequence[Sequence[int]],
    group: int,
    tokens: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    tokenizer,
    device: torch.device,
    min_width: int = 0,
    texts: Sequence[str] | None = None,
) -> Completions:
    """An engine's sampled token ids and their log-probs ([N] lists, prompt-major) as Completions: right-padded
    [N, T] tensors on ``device``, "stop" where the last token is an EOS (left out of the text), else "length".
    Shared by the colocated vLLM engine and the server client, so both read a sample the same way. ``texts``:
    the samples' texts when decoded already (a group scored as it finished), else decoded here."""
    n = len(tokens)
    width = max(min_width, max(len(t) for t in tokens))
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    lp = torch.zeros((n, width), dtype=torch.float32)
    eos = set(eos_token_ids)
    reasons: list[FinishReason] = []
    text_ids = []
    for i, (toks, values) in enumerate(zip(tokens, logprobs, strict=True)):
        toks = list(toks)
        if toks:
            ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            mask[i, : len(toks)] = True
            lp[i, : len(toks)] = torch.tensor(list(values), dtype=torch.float32)
        stopped = bool(toks) and toks[-1] in eos
        reasons.append("stop" if stopped else "length")
        text_ids.append(toks[:-1] if stopped else toks)
    return Completions(
        prompt_ids=[list(p) for p in prompt_ids for _ in range(group)],
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        logprobs=lp.to(device),
        texts=list(texts) if texts is not None else tokenizer.batch_decode(text_ids, skip_special_tokens=True),
        finish_reasons=reasons,
        num_generations=group,
    )
