"""The sender's half of a weight sync to a vLLM server (rollout/vllm/client.py's ``update_weights``).

Full weights go in buckets by the run's transport: ``shm`` (rollout/vllm/shm.py: a file in shared memory per
bucket, posted to /update_weights between /start_weight_update and /finish_weight_update) or ``nccl``
(vLLM's NCCL engine, GPUs). LoRA sends the base weights once, then each version's adapter as a PEFT folder
loaded under its own name. After a sync the server must report the new version, and (a server with
grpolab's routes) that it loaded every parameter. Rank 0 sends; under torchrun the other ranks take part in
the gathers only (``consume``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse
import uuid
import weakref
from pathlib import Path

import torch

from grpolab.distributed import dist, parallel
from grpolab.rollout.vllm import batch, server_protocol, shm
from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.server_client import (
    NcclControl,
    ServerClient,
    StreamSource,
    adapter_state,
    address_towards,
    buckets,
    consume,
)
from grpolab.rollout.vllm.sync import policy_weights, weight_metadata

MODEL_NAME = "grpolab"
"""The name the server serves the model under (``--served-model-name``)."""


class WeightSender:
    """Sends a policy's weights to one vLLM server as numbered versions (module docstring). ``model_name`` is
    what requests name: the base model, or (LoRA) the adapter of the last version sent."""

    def __init__(
        self, client: ServerClient, *, transport: str, bucket_bytes: int, dtype: torch.dtype | None, lora: bool
    ) -> None:
        self.client = client
        self.transport = transport
        self.bucket_bytes = int(bucket_bytes)
        self.dtype = dtype
        self.lora = lora
        self.model_name = MODEL_NAME
        self._shm_dir: Path | None = None
        self._nccl = None
        self._tag = uuid.uuid4().hex[:8]  # this sampler's adapters never take another trainer's names

    def send(self, model: torch.nn.Module, version: int, *, reports_loaded: bool) -> int:
        """``model``'s weights as ``version`` (every rank calls it); the bytes sent. ``reports_loaded``: the
        server has grpolab's routes, which say whether it loaded every parameter."""
        if self.lora:
            return self._sync_adapter(model, version, reports_loaded)
        return self._sync_or_consume(model, version, reports_loaded)

    def _sync_or_consume(self, model: torch.nn.Module, version: int, reports_loaded: bool, *, merge_lora: bool = True) -> int:
        """Rank 0 sends ``model``'s weights as ``version``; the other ranks take part in the gathers. The bytes sent."""
        weights = policy_weights(model, self.dtype, merge_lora=merge_lora)
        if not dist.is_main():
            return consume(weights)
        nccl = self.transport == "nccl"  # its engine sizes the receive buffers first, from the metadata
        metadata = weight_metadata(model, self.dtype, merge_lora=merge_lora) if nccl else None
        return self._sync(weights, version, reports_loaded, metadata)

    def _sync(self, weights, version: int, reports_loaded: bool, metadata=None) -> int:
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
            self._check_loaded(reports_loaded)
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

    def _check_loaded(self, reports_loaded: bool) -> None:
        """The server loaded every parameter of its model (a server with grpolab's routes says so)."""
        if reports_loaded:
            report = self.client.call_json("GET", batch.LOADED_ROUTE)
            server_protocol.check_loaded(self.client.url, report)

    def _sync_adapter(self, model: torch.nn.Module, version: int, reports_loaded: bool) -> int:
        """LoRA: this version's adapter as a PEFT folder, loaded as ``grpolab-<tag>-v<N>`` (module docstring);
        the first time, the base weights too (whatever an earlier trainer left in the server)."""
        base = 0
        if self.model_name == MODEL_NAME:
            base = self._sync_or_consume(model, version, reports_loaded, merge_lora=False)
        state = adapter_state(model, self.dtype)  # every rank: FSDP2 gathers
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
            self._shm_dir = shm.SHM_ROOT / f"grpolab-{uuid.uuid4().hex}"
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
            info = shm.write_bucket(path, bucket)
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
        """Unload this sender's adapter and remove the transfer folder."""
        if self.model_name != MODEL_NAME and dist.is_main():
            with contextlib.suppress(RolloutServerError):
                self.client.call("POST", "/v1/unload_lora_adapter", {"lora_name": self.model_name})
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
