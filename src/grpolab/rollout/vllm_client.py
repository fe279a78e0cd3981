"""rollout.mode=server: the trainer as a client of a vLLM OpenAI server (docs/server_mode.md).

``ServerSampler`` implements the Sampler contract (rollout/base.py) over HTTP. A server grpolab starts has
grpolab's batch route (rollout/vllm_batch.py): a step's whole batch is one call, which the server runs as the
colocated engine runs it (paused, seeded with the step's seed, every prompt added with ``n = G``, resumed), so
the same seeds give colocated mode's tokens. A server without it (a plain ``vllm serve``) gets one
/v1/completions request per sample with ``seed = base + p*G + g``, sent together from a thread pool so the
engine batches them. Either way ``base`` is drawn from the step's generator, the token ids are the engine's
and the log-probs its processed ones (``--logprobs-mode processed_logprobs``: log_softmax(logits / T), the
trainer's); greedy samples each prompt once and repeats it G times.

Weights go by version (``update_weights``): /pause (in-flight requests finish first), /start_weight_update,
the buckets (/update_weights, each at most rollout.sync_bucket_mb, one parameter gathered at a time
under FSDP2: rollout/vllm_sync.py), /finish_weight_update with the new version, /reset_prefix_cache,
then /weight_info must report that version, then /resume. Before every sample the server's version is
checked too: a server that restarted (with its own weights) stops the run instead of sampling from them.
Transports: ``shm`` (rollout/vllm_shm.py: files in shared memory; any device, same machine) and ``nccl``
(vLLM's NCCL engine; GPUs; written, not tested here). Every call is bounded as a whole (rollout.sync_timeout_s),
and any failure is one RolloutServerError line (the HTTP calls: rollout/server_client.py). What the server
sends is checked before it is used (rollout/server_protocol.py): every sample, and, at the first sync, that
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

import contextlib
import functools
import logging
import os
import shutil
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from grpolab.distributed import dist, parallel
from grpolab.errors import one_line
from grpolab.rollout import server_protocol, vllm_batch, vllm_shm
from grpolab.rollout.base import check_prompts, check_sampling, package_completions
from grpolab.rollout.server_client import (
    NcclControl,
    ServerClient,
    ServerGone,
    ServerStatusError,
    StreamSource,
    adapter_state,
    address_towards,
    buckets,
    consume,
)
from grpolab.rollout.vllm import SEED_MODULUS, _draw_seed
from grpolab.rollout.vllm_server import RolloutServerError
from grpolab.rollout.vllm_sync import policy_weights, weight_metadata
from grpolab.types import Completions, Failure

log = logging.getLogger(__name__)

MODEL_NAME = "grpolab"
"""The name the server serves the model under (``--served-model-name``)."""
_NOTHING = {"token_ids": [], "logprobs": []}
"""A failed sample's tokens: none (its row is never scored or trained on)."""


class ServerSampler:
    """Implements ``grpolab.rollout.base.Sampler`` against a vLLM server (see the module docstring)."""

    takes_examples = False
    streams_groups = True
    """``sample`` takes ``on_group``: each prompt's group as soon as it is done (training/sampling.py)."""

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
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: pass the ids that end a completion")
        if transport not in ("shm", "nccl"):
            raise ValueError(f"transport must be shm or nccl, got {transport!r}")
        self.client = client
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.vocab_size = int(vocab_size or len(tokenizer))
        """Token ids the server sends must be below it (the model's embedding rows)."""
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.min_p, self.repetition_penalty = min_p, repetition_penalty
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.device = torch.device(device)
        self.transport = transport
        self.bucket_bytes = int(bucket_bytes)
        self.dtype = dtype
        self.version: int | None = None
        """The weight version the server serves (0 = the first sync; +1 per update_weights)."""
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        self.last_generate_s = 0.0
        self.lock = threading.Lock()
        """Held by a whole ``sample`` and a whole sync: a batch is sampled with one version."""
        self._pending = weights_from
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="grpolab-vllm-request")
        self._shm_dir: Path | None = None
        self._nccl = None
        self.lora = lora
        self._tag = uuid.uuid4().hex[:8]  # this sampler's adapters never take another trainer's names
        self.model_name = MODEL_NAME
        """What requests name: the base model, or (LoRA) the adapter of the current version."""

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
        base = None if generator is None or greedy else _draw_seed(generator)
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
        """The server's ``/grpolab/info`` (rollout/vllm_batch.py), {} for a server without it (a plain vllm serve)."""
        try:
            return self.client.call_json("GET", vllm_batch.INFO_ROUTE)
        except ServerStatusError as err:
            if err.status != 404:
                raise
            log.info("vllm server %s has no %s: one seeded request per sample", self.client.url, vllm_batch.ROUTE)
            return {}

    @functools.cached_property
    def batched(self) -> bool:
        """Whether the server has grpolab's batch route (a server grpolab starts; rollout/vllm_batch.py)."""
        return self.info.get("protocol") == vllm_batch.PROTOCOL

    def _check_server(self, model: torch.nn.Module) -> None:
        """The first sync, on every rank (each raises, none waits in a gather): the server takes weights by this
        trainer's transport and serves this model (rollout/server_protocol.py)."""
        server_protocol.check_transport(self.client.url, self.info, self.transport)
        metadata = weight_metadata(model, self.dtype, merge_lora=False)  # the names and shapes sent, merged or not
        server_protocol.check_model(self.client.url, self.info, metadata)

    def _batch(self, prompt_ids, per_prompt: int, seed: int | None, finished) -> list[dict]:
        """The whole batch in one call, sampled as the colocated engine samples it (rollout/vllm_batch.py);
        ``finished(p, samples)`` as each prompt's samples come back."""
        body = server_protocol.batch_request(self.model_name, prompt_ids, per_prompt, seed, self._sampling())
        outputs: dict[int, list[dict | Failure]] = {}
        try:
            for line in self.client.stream(vllm_batch.ROUTE, body):
                if "done" in line:
                    break
                if "queued" in line:  # another rank's batch holds the engine; the wait for the next line restarts
                    continue
                p, got = server_protocol.batch_line(
                    self.client.url, vllm_batch.ROUTE, line, prompts=len(prompt_ids), per_prompt=per_prompt,
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
        """What every sample the server sends is checked against (rollout/server_protocol.py)."""
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
        tokens = [list(c["token_ids"]) for c in choices]  # checked as they came (rollout/server_protocol.py)
        logprobs = [c["logprobs"] for c in choices]
        out = package_completions(
            prompt_ids, group, tokens, logprobs, eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
            tokenizer=self.tokenizer, device=self.device if device is None else device, min_width=1, texts=texts,
        )  # fmt: skip
        out.failures = failures if any(failures) else None
        return out

    # ------------------------------------------------------------------ weights

    def update_weights(self, model: torch.nn.Module) -> None:
        """Send ``model``'s weights as the next version (module docstring); the version the server then
        reports is checked."""
        with self.lock:
            t0 = time.perf_counter()
            version = 0 if self.version is None else self.version + 1
            if version == 0:
                self._check_server(model)
            sent = self._sync_adapter(model, version) if self.lora else self._sync_or_consume(model, version)
            if dist.world().size > 1:
                dist.barrier()  # no rank samples before rank 0's sync is done
            self.version = version
            self._pending = None
            self.last_sync_s = time.perf_counter() - t0
            self.last_sync_bytes = sent
            log.debug("vllm server: version %d sent (%d bytes) in %.3f s", version, sent, self.last_sync_s)

    def _sync_or_consume(self, model: torch.nn.Module, version: int, *, merge_lora: bool = True) -> int:
        """Rank 0 sends ``model``'s weights as ``version``; the other ranks take part in the gathers. The bytes sent."""
        weights = policy_weights(model, self.dtype, merge_lora=merge_lora)
        if not dist.is_main():
            return consume(weights)
        nccl = self.transport == "nccl"  # its engine sizes the receive buffers first, from the metadata
        return self._sync(weights, version, weight_metadata(model, self.dtype, merge_lora=merge_lora) if nccl else None)

    def _sync(self, weights, version: int, metadata=None) -> int:
        """The sender's half of ``update_weights``: the bytes sent."""
        c = self.client
        c.call("POST", "/pause?mode=wait")
        try:
            if self.transport == "nccl":  # its engine drives start / update / finish itself
                sent = self._send_nccl(weights, metadata)
                c.call("POST", "/update_weight_version", {"new_version": str(version)})
            else:
                c.call("POST", "/start_weight_update")
                sent = self._send(weights)
                c.call("POST", "/finish_weight_update", {"weight_version": str(version)})
            c.call("POST", "/reset_prefix_cache")  # cached prompt KV was computed with the old weights
            self._check_loaded()
            served = c.version()
            if served != str(version):
                raise RolloutServerError(
                    f"the vLLM server at {c.url} reports weight version {served!r} after the trainer sent {version}"
                )
        except BaseException:
            with contextlib.suppress(RolloutServerError):  # the first failure is the one to tell
                c.call("POST", "/resume")
            raise
        c.call("POST", "/resume")
        return sent

    def _check_loaded(self) -> None:
        """The server loaded every parameter of its model (a server with grpolab's routes says so)."""
        if self.info:
            report = self.client.call_json("GET", vllm_batch.LOADED_ROUTE)
            server_protocol.check_loaded(self.client.url, report)

    def _sync_adapter(self, model: torch.nn.Module, version: int) -> int:
        """LoRA: this version's adapter as a PEFT folder, loaded as ``grpolab-<tag>-v<N>`` (module docstring);
        the first time, the base weights too (whatever an earlier trainer left in the server)."""
        base = 0
        if self.model_name == MODEL_NAME:
            base = self._sync_or_consume(model, version, merge_lora=False)
        state = adapter_state(model)  # every rank: FSDP2 gathers
        sent = base + sum(t.numel() * t.element_size() for t in state.values())
        name = f"grpolab-{dist.broadcast_object(self._tag)}-v{version}"
        if not dist.is_main():
            self.model_name = name
            return sent
        from safetensors.torch import save_file

        folder = self._transfer_dir() / f"adapter-v{version}"
        folder.mkdir()
        peft_model = parallel.unwrap(model)
        peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(folder))
        save_file(state, str(folder / "adapter_model.safetensors"))
        c, previous = self.client, self.model_name
        c.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        c.call("POST", "/update_weight_version", {"new_version": str(version)})
        if previous != MODEL_NAME:
            c.call("POST", "/v1/unload_lora_adapter", {"lora_name": previous})
            shutil.rmtree(self._transfer_dir() / f"adapter-v{previous.rsplit('-v', 1)[1]}", ignore_errors=True)
        self.model_name = name
        served = c.version()
        if served != str(version):
            raise RolloutServerError(f"the vLLM server at {c.url} reports weight version {served!r} after the trainer sent {version}")
        return sent

    def _transfer_dir(self) -> Path:
        if self._shm_dir is None:
            self._shm_dir = vllm_shm.SHM_ROOT / f"grpolab-{uuid.uuid4().hex}"
            self._shm_dir.mkdir(mode=0o700)
            weakref.finalize(self, shutil.rmtree, self._shm_dir, ignore_errors=True)  # also when close is never called
            if self.client.server is not None:  # removed with the server should this process be killed outright
                self.client.server.own(self._shm_dir)
        return self._shm_dir

    def _send(self, weights) -> int:
        """shm: every bucket written to a file, posted, and deleted; returns the bytes sent."""
        if self._shm_dir is None:
            self.client.call("POST", "/init_weight_transfer_engine", {"init_info": {"folder": self._transfer_dir().name}})
        sent = 0
        for i, bucket in enumerate(buckets(weights, self.bucket_bytes)):
            path = self._shm_dir / f"bucket-{i}"
            info = vllm_shm.write_bucket(path, bucket)
            try:
                self.client.call("POST", "/update_weights", {"update_info": info})
            finally:
                path.unlink(missing_ok=True)
            sent += sum(t.numel() * t.element_size() for _, t in bucket)  # the tensors', not the alignment's
        return sent

    def _send_nccl(self, weights, metadata) -> int:
        """vLLM's NCCL engine (GPUs only; written against vLLM 0.32's API, not run on this machine). The
        weights stream from the iterator, one gathered parameter at a time, as in the shm path."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        source = StreamSource(weights, metadata)
        if self._nccl is None:
            host = urllib.parse.urlsplit(self.client.url).hostname or "127.0.0.1"
            init = NCCLTrainerInitInfo(
                master_address=os.environ.get("GRPOLAB_NCCL_ADDRESS") or address_towards(host),
                master_port=int(os.environ.get("GRPOLAB_NCCL_PORT", "29555")),
                world_size=1 + self._server_world_size(),
                rank=0,
            )
            self._nccl = WeightTransferTrainerFactory.trainer_init(init, client=NcclControl(self.client), source=source)
        self._nccl.source = source
        self._nccl.send_weights()
        return source.sent

    def _server_world_size(self) -> int:
        answer = self.client.call_json("GET", "/get_world_size")
        return self.client.field("/get_world_size", answer, "world_size", int)

    def close(self) -> None:
        """Stop the request threads, unload this sampler's adapter, remove the transfer folder, and stop the
        server if this run started it."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.model_name != MODEL_NAME and dist.is_main():
            with contextlib.suppress(RolloutServerError):
                self.client.call("POST", "/v1/unload_lora_adapter", {"lora_name": self.model_name})
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
        self.client.close()
        if self.client.server is not None:
            self.client.server.stop()
