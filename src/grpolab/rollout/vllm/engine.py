"""Sampling G completions per prompt with vLLM, colocated in the training process (TRL's colocate mode).

One in-process engine per training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; under torchrun vLLM's
``external_launcher`` executor, so every rank's engine generates that rank's groups). The policy's
weights go into the engine through vLLM's in-place reload (``collective_rpc("reload_weights")``, then
``reset_prefix_cache``): after every optimizer step, after a resume, and before the first ``sample``
(rollout/vllm/sync.py gathers FSDP2 shards, merges LoRA, unwraps DDP). See docs/vllm.md.

Sampling means what it means in rollout/hf.py: temperature (0 = greedy), top-p, top-k, at most
``max_completion_length`` tokens, stop at the same EOS ids, G samples per prompt; the token ids are the
engine's own, never decoded and re-tokenized. Departures, and why:

- Seeds: one request per prompt with ``n = G`` and no seed of its own; the engine samples inside
  ``engine_seeded(base)``, ``base`` drawn from the step's generator (so a seed per rank and step, saved
  and resumed with it): the process's torch (and numpy) generators, which vLLM draws unseeded requests
  from, are seeded with it for the call and put back after. A per-request seed would be sampled one
  request at a time in Python, and crashes vLLM on CPU once a prompt's prefill is chunked ("CPU
  Generator does not use offset"). The prefix cache is reset before a seeded call, so the engine
  schedules (and draws) the same whatever it sampled before (an evaluation), as a resumed run does.
  Greedy runs one sample per prompt (vLLM refuses ``n > 1`` when greedy) and repeats it G times. A seeded
  run draws other tokens than hf's.
- Log-probs: ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / T)`` of the sampled
  token, what the trainer computes (greedy: T = 1, as hf). With top-k / top-p on, vLLM normalises over
  the kept tokens (the distribution it actually sampled), hf over the whole vocabulary: the difference
  shows in the logged sampler/trainer mismatch, which TIS / MIS (algo.rollout_correction) correct.
- An engine is kept for the process (keyed by its settings) and reused by the next sampler with the same
  settings (an evaluation, the next run of a sweep, a test module); ``close`` keeps it, ``shutdown_engines``
  frees them (rollout/vllm/process.py). Its construction leaves the trainer's random states and
  ``torch.set_num_threads`` as they were.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Sequence

import torch

from grpolab.config import ConfigError
from grpolab.rewards.timeouts import TimedOut, bounded_in_main
from grpolab.rollout.base import (
    EngineDied,
    Sampler,
    check_prompts,
    check_sampling,
    engine_eos,
    package_completions,
)
from grpolab.rollout.vllm.process import (
    ENGINE_STATE,
    IDLE_AWAKE,
    import_vllm,
    shutdown_engines,
    start_engine,
)
from grpolab.rollout.vllm.sync import EngineDtypes, Tally, held_dtypes, policy_weights
from grpolab.types import Completions

log = logging.getLogger(__name__)

__all__ = [
    "SEED_MODULUS",
    "VLLMSampler",
    "draw_seed",
    "engine_alive",
    "engine_seeded",
    "import_vllm",
    "shutdown_engines",
    "start_engine",
]
"""Besides the sampler and its helpers, the process's engines (rollout/vllm/process.py) under the names that
callers import from here."""

SEED_MODULUS = 2**63 - 1


class VLLMSampler(Sampler):
    """Implements ``grpolab.rollout.base.Sampler`` on a vLLM ``LLM`` (see the module docstring). It takes
    every update before the next ``sample``: no weight versions (the contract's default)."""

    takes_examples = False
    streams_groups = False

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        max_completion_length: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        eos_token_ids: Sequence[int],
        weights_from: torch.nn.Module | None = None,
        device: torch.device | str = "cpu",
        sleep_mode: bool = False,
        timeout_s: float | None = None,
        idle: bool = False,
    ) -> None:
        """``engine``: a vLLM ``LLM`` (``start_engine``). ``weights_from``: the policy whose weights the
        engine takes before the first ``sample`` (None: the engine's weights as they are). ``sleep_mode``:
        put the engine to sleep after each ``sample`` (CUDA only). ``timeout_s``: the most a ``sample`` or a
        weight sync may take (vllm.timeout_s); None = unbounded. ``idle``: this rank never samples (the other
        ranks of a sequence-parallel group, distributed/sequence.py ``samples``): the engine had to be built
        (under torchrun that is a collective of every rank) but never takes weights: a sync only runs its
        gathers, and with sleep mode the engine sleeps at level 2 from the start (its weights and KV cache
        freed) and is never woken."""
        check_sampling(
            max_completion_length=max_completion_length, temperature=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, repetition_penalty=repetition_penalty,
        )  # fmt: skip
        self.eos_token_ids, self.pad_token_id = engine_eos(tokenizer, eos_token_ids)
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.device = torch.device(device)
        self.sleep_mode = sleep_mode
        self.timeout_s = timeout_s
        self._pending = weights_from
        self.idle = idle
        if idle and sleep_mode and not engine.llm_engine.is_sleeping():
            engine.sleep(level=2)  # its dummy weights are never read: nothing to keep
        self._held_awake = False
        self.last_sync_s = 0.0
        """Seconds the last weight sync took (gather, merge, load, cache reset)."""
        self.last_sync_bytes = 0
        """The bytes the last weight sync handed to the engine (in the engine's dtypes: rollout/vllm/sync.py)."""
        self.last_generate_s = 0.0
        """Seconds the last ``sample`` spent in the engine."""

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights (plain, DDP, FSDP2 or PEFT) into the engine; under torchrun every
        rank calls it (FSDP2 gathers are collectives).

        With sleep mode the order is TRL's and verl's: free the trainer's cached blocks, wake the weights
        only, load them, and leave the KV cache asleep until ``sample`` needs it, so the weights never
        share the GPU with both the KV cache and the trainer's leftovers."""
        if self.idle:
            self._drain(model)
            return
        t0 = time.perf_counter()
        if self.sleep_mode and self.engine.llm_engine.is_sleeping():
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the trainer's freed blocks go back before vLLM allocates
            self.engine.wake_up(tags=["weights"])
        weights = Tally(policy_weights(model, self.engine_dtypes))

        def reload() -> None:
            self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
            self.engine.reset_prefix_cache()  # cached prompt KV was computed with the old weights

        self._bounded(reload, "the weight sync")
        ENGINE_STATE[id(self.engine)] = {"source": model, "discarded": False}
        self._pending = None
        self.last_sync_s = time.perf_counter() - t0
        self.last_sync_bytes = weights.bytes
        log.debug("vllm: weights synced (%d bytes) in %.3f s", self.last_sync_bytes, self.last_sync_s)

    def _drain(self, model: torch.nn.Module) -> None:
        """An idle sampler's sync: the gathers of ``policy_weights`` (collectives under FSDP2) into no engine, and
        the engine's state moved as the sampling rank's moves (``_sync_if_due`` re-syncs when it does)."""
        for _ in policy_weights(model):
            pass
        ENGINE_STATE[id(self.engine)] = {"source": model, "discarded": False}
        self._pending = None

    @functools.cached_property
    def engine_dtypes(self) -> EngineDtypes:
        """The dtypes the engine holds its parameters in, which a sync sends (rollout/vllm/sync.py): its model
        dtype, and the parameters its model keeps in another (read once from the in-process model)."""
        dtype = getattr(getattr(self.engine.llm_engine, "model_config", None), "dtype", None)
        if not isinstance(dtype, torch.dtype):
            return EngineDtypes(None)
        held = self.engine.apply_model(functools.partial(held_dtypes, default=dtype))  # one per worker, alike
        return EngineDtypes(dtype, held[0] if held else {})

    def send_pending(self) -> None:
        """The weights given as ``weights_from``, if not loaded yet (the first ``sample`` loads them)."""
        if self._pending is not None:
            self.update_weights(self._pending)

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
    ) -> Completions:
        """G completions for each prompt, prompt-major (row p*G + g is sample g of prompt p)."""
        if self.idle:
            raise RuntimeError("this rank does not sample (distributed/sequence.py samples): call take_part")
        check_prompts(prompt_ids, num_generations)
        self._check_fits(prompt_ids)
        self._sync_if_due()
        self._wake()  # the KV cache (and, before any sync, the weights)
        greedy = self.temperature == 0
        seed = None if generator is None or greedy else draw_seed(generator)
        # one request per prompt: vLLM fans it out into G samples, prefix caching computes its KV once
        # (greedy: one sample, repeated below; vLLM refuses n > 1 when greedy)
        requests = [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_ids]
        params = self._params(1 if greedy else num_generations)
        if seed is not None:  # the same cache state as after a sync (a resumed run's): the same schedule
            self._bounded(self.engine.reset_prefix_cache, "the prefix cache reset")
        t0 = time.perf_counter()
        with engine_seeded(seed):
            outputs = self._bounded(lambda: self.engine.generate(requests, params, use_tqdm=False), "sampling")
        self.last_generate_s = time.perf_counter() - t0
        samples = [sample for out in outputs for sample in out.outputs]
        if greedy:
            samples = [s for s in samples for _ in range(num_generations)]
        if self.sleep_mode and not self._held_awake:
            self._sleep()
        return self._package(prompt_ids, num_generations, samples)

    def _sync_if_due(self) -> None:
        """The weights given as ``weights_from`` if not loaded yet, or the last synced ones again after a
        level-2 sleep discarded them (never sample discarded weights)."""
        state = ENGINE_STATE.get(id(self.engine), {})
        if self._pending is not None:  # as send_pending
            self.update_weights(self._pending)
        elif state.get("discarded"):  # slept at level 2 with no sync since
            self.update_weights(state["source"])

    def take_part(self) -> None:
        """``sample``'s syncs (under FSDP2 their gathers are collectives) and its sleep afterwards, without the
        generation: this rank's engine then goes through the sampling rank's states, so the next ``sample``
        or ``take_part`` (a DAPO round, an evaluation on every rank) syncs here exactly when it syncs there. An
        idle sampler's engine stays asleep: it only records that the sampling rank's engine is awake now."""
        self._sync_if_due()
        if self.idle:
            IDLE_AWAKE[id(self.engine)] = True
        if self.sleep_mode and not self._held_awake:
            self._sleep()

    @contextlib.contextmanager
    def awake(self):
        """Several ``sample`` calls with one sleep at the end (a multi-turn batch's turns, rollout/multiturn.py):
        with sleep mode each call would otherwise discard the weights and the next reload them, a full sync
        per turn, and under torchrun FSDP2's gathers, collectives, in as many turns as each rank's episodes
        last: ranks whose episodes end at different turns would wait for each other forever."""
        held, self._held_awake = self._held_awake, True
        try:
            yield
        finally:
            self._held_awake = held
            if not held and self.sleep_mode and not self._sleeping():
                self._sleep()

    def _sleeping(self) -> bool:
        """Whether the engine sleeps; for an idle sampler, whether the sampling rank's engine does."""
        if self.idle:
            return not IDLE_AWAKE.get(id(self.engine), False)
        return self.engine.llm_engine.is_sleeping()

    def close(self) -> None:
        """Nothing to release: the engine stays for the next sampler of this process (``shutdown_engines``)."""

    def _bounded(self, fn, what: str):
        """``fn()`` with a dead engine as EngineDied, and within ``timeout_s`` (EngineDied past it)."""
        with engine_alive(what):
            if self.timeout_s is None:
                return fn()
            try:
                return bounded_in_main(fn, self.timeout_s)
            except TimedOut:
                raise EngineDied(
                    f"the vLLM engine did not finish {what} within vllm.timeout_s={self.timeout_s:g} s (a hung "
                    "engine, or raise vllm.timeout_s for very long generations)"
                ) from None

    def _check_fits(self, prompt_ids: list[list[int]]) -> None:
        """Each prompt and a whole completion fit the engine's max_model_len: vLLM would otherwise cut the
        completion at it without a word (finish "length", like a completion at max_completion_length), or
        fail with a traceback for a prompt longer than it. check_vllm refuses such a config before the
        model loads; this holds for a sampler built by hand."""
        limit = getattr(getattr(self.engine.llm_engine, "model_config", None), "max_model_len", None)
        longest = max(len(p) for p in prompt_ids)
        if isinstance(limit, int) and longest + self.max_completion_length > limit:
            raise ConfigError(
                f"vllm.max_model_len={limit} cannot hold a prompt of {longest} tokens and max_completion_length="
                f"{self.max_completion_length}; raise vllm.max_model_len to at least {longest + self.max_completion_length}"
            )

    def _sleep(self) -> None:
        """While the trainer runs: the KV cache freed and, at level 2, the weights discarded too (the next
        sync overwrites them; level 1 would copy them to host memory every step for nothing). Level 2
        only when a source to reload from is known; the flag makes the next ``sample`` sync first."""
        state = ENGINE_STATE.get(id(self.engine))
        level = 2 if state is not None else 1
        if self.idle:  # asleep since it was built: only the state moves, as the sampling rank's
            IDLE_AWAKE[id(self.engine)] = False
        else:
            self.engine.sleep(level=level)
        if state is not None:
            state["discarded"] = True

    def _wake(self) -> None:
        """Wake the engine if any sampler on it put it to sleep (an evaluation shares the run's engine)."""
        if self.sleep_mode and self.engine.llm_engine.is_sleeping():
            self.engine.wake_up()

    def _params(self, n: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            max_tokens=self.max_completion_length,
            stop_token_ids=self.eos_token_ids,
            logprobs=0,  # the sampled token's only (no per-request seed: see engine_seeded)
            detokenize=False,
        )

    def _package(self, prompt_ids, group: int, samples) -> Completions:
        tokens = [list(s.token_ids) for s in samples]
        logprobs = [[lp[t].logprob for lp, t in zip(s.logprobs, toks, strict=True)] for s, toks in zip(samples, tokens, strict=True)]
        return package_completions(
            prompt_ids, group, tokens, logprobs, eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
            tokenizer=self.tokenizer, device=self.device,
        )  # fmt: skip


@contextlib.contextmanager
def engine_alive(what: str):
    """vLLM's EngineDeadError (its core died: out of memory, a crash) as one EngineDied line."""
    try:
        yield
    except Exception as err:
        if type(err).__name__ != "EngineDeadError":  # by name: vllm is imported lazily, and may not be at all
            raise
        said = " ".join(str(err).split())[:300]
        raise EngineDied(f"the vLLM engine died during {what} ({type(err).__name__}: {said})") from err


@contextlib.contextmanager
def engine_seeded(seed: int | None):
    """The engine's sampling inside seeded, forked random states; the caller's states are left as they were.

    Requests without a seed of their own draw from the process's generators (the engine runs in this
    process): vLLM 0.32's V1 model runner (CPU, and CUDA without Triton) samples them in one batched draw
    from torch's default generator of the logits' device (``TopKTopPSampler.forward_cpu``: one
    ``torch.randint`` per batch row; ``random_sample``: ``q.exponential_()``), and the CUDA V2 model runner
    gives each one a seed from numpy's global generator when it is added (``SamplingStates.add_request``).
    Seeding those from the step's seed makes the same step draw the same tokens, in this run and in a
    resumed one. A seed per request would instead cost a generator each, sampled one by one in Python, and
    on CPU it crashes the engine when a chunked prefill's token is discarded (``_bookkeeping_sync`` winds
    the generator back with ``set_offset``, which a CPU generator does not have). ``None``: unseeded."""
    if seed is None:
        yield
        return
    import numpy as np

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    np_state = np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)  # the current device's, the one the engine samples on
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            np.random.set_state(np_state)


def draw_seed(generator: torch.Generator) -> int:
    """One seed from the step's generator (advancing it, so the next step and a resumed run differ / agree)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
