"""rollout.mode=server: the trainer as a client of a vLLM OpenAI server (docs/server_mode.md).

``ServerSampler`` implements the Sampler contract (rollout/base.py) over HTTP. A server grpolab starts has
grpolab's batch route (rollout/vllm/batch.py): a step's whole batch is one call, which the server runs as the
colocated engine runs it (paused, seeded with the step's seed, every prompt added with ``n = G``, resumed), so
the same seeds give colocated mode's tokens. A server without it (a plain ``vllm serve``) gets one
/v1/completions request per sample with ``seed = base + p*G + g``, sent together from a thread pool so the
engine batches them. Either way ``base`` is drawn from the step's generator, the token ids are the engine's
and the log-probs its processed ones (``--logprobs-mode processed_logprobs``: log_softmax(logits / T), the
trainer's); greedy samples each prompt once and repeats it G times.

Weights go by version (``update_weights``; rollout/vllm/weights.py sends them): /pause (in-flight requests finish first), /start_weight_update,
the buckets (/update_weights, each at most rollout.sync_bucket_mb, one parameter gathered at a time
under FSDP2: rollout/vllm/sync.py), /finish_weight_update with the new version, /reset_prefix_cache,
then /weight_info must report that version, then /resume. Before every sample the server's version is
checked too: a server that restarted (with its own weights) stops the run instead of sampling from them.
Transports: ``shm`` (rollout/vllm/shm.py: files in shared memory; any device, same machine) and ``nccl``
(vLLM's NCCL engine; GPUs; written, not tested here). Every call is bounded as a whole (rollout.sync_timeout_s),
and any failure is one RolloutServerError line (the HTTP calls: rollout/vllm/server_client.py). What the server
sends is checked before it is used (rollout/vllm/server_protocol.py): every sample, and, at the first sync, that
it serves this model (its parameters' names, shapes and dtype); after every sync it must have loaded all
of its parameters.

LoRA (``lora=True``): the adapter itself goes, not a merge; the base weights go once, at the first sync
(a server keeps what an earlier trainer sent). Each version's adapter (PEFT's own state dict,
FSDP2 shards gathered) is written as a PEFT folder in shared memory and loaded with vLLM's
/v1/load_lora_adapter as ``grpolab-<tag>-v<N>`` (the previous one unloaded), the server's version label set
with /update_weight_version, and every request names that adapter.

A request the server answers with an error, or a batch whose stream breaks off (an error line, a lost
connection, a timeout), fails the samples that did not come back (``engine_error`` in
``Completions.failures``): the trainer drops their groups and trains on the others (docs/training.md,
"Failed samples"). A server that cannot be reached before sampling, or serves other weights, stops the run:
nothing could be sampled from it.

Under torchrun the ranks share one server: every rank takes part in the gathers (FSDP2 collectives),
rank 0 alone sends, and a barrier keeps every rank from sampling before the new version is served;
each rank then samples its own groups with its own seeds.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from grpolab.distributed import dist
from grpolab.errors import one_line
from grpolab.rollout.base import Sampler, check_prompts, check_sampling, engine_eos, package_completions
from grpolab.rollout.vllm import batch, server_protocol
from grpolab.rollout.vllm.engine import SEED_MODULUS, draw_seed
from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.server_client import (
    ServerClient,
    ServerGone,
    ServerStatusError,
)
from grpolab.rollout.vllm.sync import weight_metadata
from grpolab.rollout.vllm.weights import WeightSender
from grpolab.types import Completions, Failure

log = logging.getLogger(__name__)

_NOTHING = {"token_ids": [], "logprobs": []}
"""A failed sample's tokens: none (its row is never scored or trained on)."""


class ServerSampler(Sampler):
    """Implements ``grpolab.rollout.base.Sampler`` against a vLLM server (see the module docstring): it streams
    groups, numbers its weight versions and holds the first weights back until ``send_pending``."""

    takes_examples = False
    streams_groups = True

    def __init__(
        self,
        client: ServerClient,
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
        transport: str = "shm",
        bucket_bytes: int = 256 * 2**20,
        dtype: torch.dtype | None = None,
        max_concurrency: int = 64,
        lora: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        check_sampling(
            max_completion_length=max_completion_length, temperature=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, repetition_penalty=repetition_penalty,
        )  # fmt: skip
        self.eos_token_ids, self.pad_token_id = engine_eos(tokenizer, eos_token_ids)
        if transport not in ("shm", "nccl"):
            raise ValueError(f"transport must be shm or nccl, got {transport!r}")
        self.client = client
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.vocab_size = int(vocab_size or len(tokenizer))
        """Token ids the server sends must be below it (the model's embedding rows)."""
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.min_p, self.repetition_penalty = min_p, repetition_penalty
        self.device = torch.device(device)
        self.weights = WeightSender(client, transport=transport, bucket_bytes=bucket_bytes, dtype=dtype, lora=lora)
        self.version: int | None = None
        """The weight version the server serves (0 = the first sync; +1 per update_weights)."""
        self.last_sync_s = 0.0
        self.last_sync_bytes: int = 0
        self.last_generate_s = 0.0
        self.lock = threading.Lock()
        """Held by a whole ``sample`` and a whole sync: a batch is sampled with one version."""
        self._pending = weights_from
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="grpolab-vllm-request")

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
        on_group: Callable[[int, Completions], None] | None = None,
    ) -> Completions:
        """G completions for each prompt, prompt-major; ``weight_versions`` says which weights drew them.
        ``on_group(p, group)``: called with prompt p's G completions (on the host) as soon as they are done,
        while the others still generate (training/sampling.py scores them then); with the batch route only,
        else after the whole batch."""
        check_prompts(prompt_ids, num_generations)
        self.send_pending()
        greedy = self.temperature == 0
        base = None if generator is None or greedy else draw_seed(generator)
        per_prompt = 1 if greedy else num_generations
        with self.lock:
            self._check_version()
            t0 = time.perf_counter()
            texts: dict[int, list[str]] = {}

            def finished(p: int, samples: list[dict]) -> None:
                if greedy:
                    samples = samples * num_generations
                group = self._package([prompt_ids[p]], num_generations, samples, device="cpu")
                texts[p] = group.texts
                if on_group is not None:
                    on_group(p, group)

            if self.batched:
                choices = self._batch(prompt_ids, per_prompt, base, finished)
            else:
                choices = self._per_request(prompt_ids, per_prompt, num_generations, base)
                for p in range(len(prompt_ids)):
                    finished(p, choices[p * per_prompt : (p + 1) * per_prompt])
            self.last_generate_s = time.perf_counter() - t0
            version = self.version
        if greedy:
            choices = [c for c in choices for _ in range(num_generations)]
        out = self._package(prompt_ids, num_generations, choices, texts=[t for p in range(len(prompt_ids)) for t in texts[p]])
        out.weight_versions = [int(version or 0)] * out.num_sequences
        return out

    def send_pending(self) -> None:
        """The first weights (version 0), if not sent yet: the first ``sample`` calls it, and so does the
        background sampler's owner (training/ahead.py) before its thread starts, so that the sync's
        collectives (FSDP2 gathers, the ranks' barrier) run on the main thread."""
        if self._pending is not None:
            self.update_weights(self._pending)

    @functools.cached_property
    def info(self) -> dict:
        """The server's ``/grpolab/info`` (rollout/vllm/batch.py), {} for a server without it (a plain vllm serve)."""
        try:
            return self.client.call_json("GET", batch.INFO_ROUTE)
        except ServerStatusError as err:
            if err.status != 404:
                raise
            log.info("vllm server %s has no %s: one seeded request per sample", self.client.url, batch.ROUTE)
            return {}

    @functools.cached_property
    def batched(self) -> bool:
        """Whether the server has grpolab's batch route (a server grpolab starts; rollout/vllm/batch.py)."""
        return self.info.get("protocol") == batch.PROTOCOL

    def _check_server(self, model: torch.nn.Module) -> None:
        """The first sync, on every rank (each raises, none waits in a gather): the server takes weights by this
        trainer's transport and serves this model (rollout/vllm/server_protocol.py)."""
        server_protocol.check_transport(self.client.url, self.info, self.weights.transport)
        metadata = weight_metadata(model, self.weights.dtype, merge_lora=False)  # the names and shapes sent, merged or not
        server_protocol.check_model(self.client.url, self.info, metadata)

    def _batch(self, prompt_ids, per_prompt: int, seed: int | None, finished) -> list[dict]:
        """The whole batch in one call, sampled as the colocated engine samples it (rollout/vllm/batch.py);
        ``finished(p, samples)`` as each prompt's samples come back."""
        body = server_protocol.batch_request(self.model_name, prompt_ids, per_prompt, seed, self._sampling())
        outputs: dict[int, list[dict | Failure]] = {}
        try:
            for line in self.client.stream(batch.ROUTE, body):
                if "done" in line:
                    break
                if "queued" in line:  # another rank's batch holds the engine; the wait for the next line restarts
                    continue
                p, got = server_protocol.batch_line(
                    self.client.url, batch.ROUTE, line, prompts=len(prompt_ids), per_prompt=per_prompt,
                    seen=outputs, **self._limits(),
                )  # fmt: skip
                outputs[p] = got
                finished(p, got)
            if len(outputs) != len(prompt_ids):
                raise RolloutServerError(
                    f"the vLLM server at {self.client.url} returned {len(outputs)} of {len(prompt_ids)} prompts' samples"
                )
        except ServerGone:  # no sample can come back: the run stops (docs/training.md, "Failed samples")
            raise
        except RolloutServerError as err:  # the samples not back fail; those back are kept (module docstring)
            failure = Failure("engine_error", one_line(err))
            missing = [p for p in range(len(prompt_ids)) if p not in outputs]
            if not missing:
                log.warning("%s (after every prompt's samples had come back, checked: they are kept)", failure.message)
            for p in missing:
                outputs[p] = [failure] * per_prompt
                finished(p, outputs[p])
        return [c for p in range(len(prompt_ids)) for c in outputs[p]]

    def _per_request(self, prompt_ids, per_prompt: int, group: int, base: int | None) -> list[dict]:
        """A server without the batch route: one request per sample, ``seed = base + p*G + g``."""
        bodies = []
        for p, ids in enumerate(prompt_ids):
            for g in range(per_prompt):
                seed = None if base is None else (base + p * group + g) % SEED_MODULUS
                bodies.append(server_protocol.completion_request(self.model_name, ids, seed, self._sampling()))
        return list(self._pool.map(self._request, bodies))

    def _request(self, body: dict[str, Any]) -> dict | Failure:
        """One sample from /v1/completions, or its failure (an error answer, no answer in time, a bad answer)."""
        try:
            return self._complete(body)
        except ServerGone:
            raise
        except RolloutServerError as err:
            return Failure("engine_error", one_line(err))

    def _complete(self, body: dict[str, Any]) -> dict:
        answer = self.client.call_json("POST", "/v1/completions", body)
        return server_protocol.completion(self.client.url, "/v1/completions", answer, **self._limits())

    def _limits(self) -> dict[str, int]:
        """What every sample the server sends is checked against (rollout/vllm/server_protocol.py)."""
        return {"vocab_size": self.vocab_size, "max_tokens": self.max_completion_length}

    def _sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k if self.top_k > 0 else -1,
            "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "max_tokens": self.max_completion_length, "stop_token_ids": self.eos_token_ids,
        }  # fmt: skip

    def _check_version(self) -> None:
        served = self.client.version()
        if served != str(self.version):
            raise RolloutServerError(
                f"the vLLM server at {self.client.url} serves weight version {served!r}, the trainer sent "
                f"{self.version}: it restarted or another trainer updated it; the last checkpoint is kept, "
                "resume the run (grpolab train --resume) to send it this run's weights"
            )

    def _package(self, prompt_ids, group: int, choices: list[dict | Failure], *, device=None, texts=None) -> Completions:
        failures = [c if isinstance(c, Failure) else None for c in choices]
        choices = [_NOTHING if isinstance(c, Failure) else c for c in choices]
        tokens = [list(c["token_ids"]) for c in choices]  # checked as they came (rollout/vllm/server_protocol.py)
        logprobs = [c["logprobs"] for c in choices]
        out = package_completions(
            prompt_ids, group, tokens, logprobs, eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
            tokenizer=self.tokenizer, device=self.device if device is None else device, min_width=1, texts=texts,
        )  # fmt: skip
        out.failures = failures if any(failures) else None
        return out

    # ------------------------------------------------------------------ weights

    @property
    def model_name(self) -> str:
        """What requests name: the base model, or (LoRA) the adapter of the current version."""
        return self.weights.model_name

    def update_weights(self, model: torch.nn.Module) -> None:
        """Send ``model``'s weights as the next version (module docstring); the version the server then
        reports is checked."""
        with self.lock:
            t0 = time.perf_counter()
            version = 0 if self.version is None else self.version + 1
            if version == 0:
                self._check_server(model)
            sent = self.weights.send(model, version, reports_loaded=bool(self.info))
            if dist.world().size > 1:
                dist.barrier()  # no rank samples before rank 0's sync is done
            self.version = version
            self._pending = None
            self.last_sync_s = time.perf_counter() - t0
            self.last_sync_bytes = sent
            log.debug("vllm server: version %d sent (%d bytes) in %.3f s", version, sent, self.last_sync_s)

    def close(self) -> None:
        """Stop the request threads, unload this sampler's adapter, remove the transfer folder, and stop the
        server if this run started it."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.weights.close()
        self.client.close()
        if self.client.server is not None:
            self.client.server.stop()
