"""A weight-transfer engine for vLLM's server that reads the weights from shared-memory files.

vLLM 0.32's own transfer engines need CUDA (``ipc``: CUDA IPC handles; ``nccl``): none runs on a CPU.
This one does, on any device, for a server on the same machine as the trainer. The trainer
(rollout/vllm/client.py) writes one bucket of tensors at a time, each aligned to 64 bytes, into a file
under ``/dev/shm/grpolab-*`` (memory, not disk), and posts its layout to ``/update_weights``; the
server's worker maps the file, views the tensors in it without a copy, and hands them to the model's
own ``load_weights`` inside vLLM's layerwise reload (``start_weight_update`` / ``finish_weight_update``,
as vLLM's ``ipc`` engine does). The trainer deletes the file after the call returns.

It is registered with vLLM's ``WeightTransferEngineFactory`` under ``grpolab_shm`` by ``register``,
a ``vllm.general_plugins`` entry point (pyproject.toml), which vLLM runs in every process it starts;
a server that grpolab starts also gets the entry point through a metadata folder on its PYTHONPATH
(rollout/vllm/server.py), so an editable or uninstalled checkout works the same.

Only files in the folder named at ``/init_weight_transfer_engine``, itself under the shared-memory
root and named ``grpolab-*``, are read: a request cannot make the server read any other file.

A load that leaves parameters out is never silent: vLLM's reload keeps a layer it was given nothing for
as it was and only logs "Failed to load weights" (a trainer of a 1-layer model once trained three steps
on a 2-layer server that way). The engine keeps the names the model's ``load_weights`` reports loaded
during an update, and at its end the parameters left out (``unloaded``: vLLM's own check after a
checkpoint load, DefaultModelLoader's ``track_weights_loading``); the trainer asks for them after every
sync (``/grpolab/loaded``, rollout/vllm/batch.py) and stops the run in one line when any is.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import torch

BACKEND = "grpolab_shm"
ALIGN = 64
SHM_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
"""Where the bucket files go: tmpfs (memory) where the machine has it."""

DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


def layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[int], int]:
    """(byte offset of each tensor, total bytes) in a bucket file, every offset aligned to ``ALIGN``."""
    offsets, end = [], 0
    for _, t in tensors:
        end = -(-end // ALIGN) * ALIGN
        offsets.append(end)
        end += t.numel() * t.element_size()
    return offsets, end


def write_bucket(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """Write ``tensors`` (on any device; each moved to the host once) into ``path``; returns the update_info
    that ``/update_weights`` takes."""
    offsets, total = layout(tensors)
    buf = bytearray(total)
    view = torch.frombuffer(buf, dtype=torch.uint8) if total else torch.empty(0, dtype=torch.uint8)
    for (_, t), off in zip(tensors, offsets, strict=True):
        flat = t.detach().contiguous().reshape(-1).to("cpu").view(torch.uint8)
        view[off : off + flat.numel()].copy_(flat)
    path.write_bytes(buf)
    return {
        "path": str(path),
        "names": [n for n, _ in tensors],
        "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
        "shapes": [list(t.shape) for _, t in tensors],
        "offsets": offsets,
        "nbytes": total,
    }


def read_bucket(info: dict[str, Any], allowed: Path) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one bucket file (views of a private copy-on-write map of it), after checking that the
    file lies in ``allowed``."""
    path = Path(info["path"]).resolve()
    if path.parent != allowed.resolve():
        raise ValueError(f"grpolab_shm: {path} is not in the transfer folder {allowed}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != int(info["nbytes"]):
            raise ValueError(f"grpolab_shm: {path} has {size} bytes, the update says {info['nbytes']}")
        data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else bytearray()
    raw = torch.frombuffer(data, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    out = []
    for name, dtype, shape, off in zip(info["names"], info["dtype_names"], info["shapes"], info["offsets"], strict=True):
        dt = DTYPES[dtype]
        n = 1
        for s in shape:
            n *= int(s)
        out.append((name, raw[off : off + n * dt.itemsize].view(dt).reshape(shape)))
    return out


def unloaded(model: torch.nn.Module, loaded: set[str] | None) -> list[str] | None:
    """The names of ``model``'s parameters not in ``loaded`` (None: not tracked, a model whose
    ``load_weights`` does not say what it loaded)."""
    if loaded is None:
        return None
    # vLLM's LoRA wrappers (--enable-lora) hold a layer as ``base_layer`` and load it under the layer's own name
    names = (name.replace(".base_layer.", ".") for name, _ in model.named_parameters())
    return sorted(name for name in names if name not in loaded)


def transfer_dir(allowed_root: Path, name: str) -> Path:
    """The transfer folder named at init, checked: directly under the shared-memory root, named grpolab-*."""
    path = (allowed_root / name).resolve()
    if path.parent != allowed_root.resolve() or not path.name.startswith("grpolab-"):
        raise ValueError(f"grpolab_shm: transfer folder {name!r} must be a grpolab-* folder in {allowed_root}")
    return path


_ENGINE_CLASS: list[type] = []


def engine_class():
    """The worker-side engine class (built on first use: it subclasses vLLM's, which only a server imports)."""
    if _ENGINE_CLASS:
        return _ENGINE_CLASS[0]
    from dataclasses import dataclass

    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclass
    class ShmInitInfo(WeightTransferInitInfo):
        folder: str = ""

    @dataclass
    class ShmUpdateInfo(WeightTransferUpdateInfo):
        path: str
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]
        offsets: list[int]
        nbytes: int

    class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
        """Reads the trainer's buckets from shared-memory files (module docstring)."""

        init_info_cls = ShmInitInfo
        update_info_cls = ShmUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            super().__init__(config, vllm_config, device, model)
            self.folder: Path | None = None
            self.loaded: set[str] | None = None
            """The parameters ``load_weights`` loaded in this update (None: it does not say)."""
            self.missing: list[str] | None = None
            """The parameters the last finished update left out (module docstring); None: not known."""

        def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
            self.folder = transfer_dir(SHM_ROOT, init_info.folder)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            quantized = getattr(self.model_config, "quantization", None) is not None  # vLLM's check skips these
            self.loaded, self.missing = (None if quantized else set()), None

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)
            self.missing = unloaded(self.model, self.loaded)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))
            if self.device.type != "cpu":
                torch.accelerator.synchronize()

        def receive_weights(self, update_info: ShmUpdateInfo) -> None:
            if self.folder is None:
                raise RuntimeError("grpolab_shm: /init_weight_transfer_engine was not called")
            weights = read_bucket(vars(update_info), self.folder)
            got = self.model.load_weights([(n, t.to(self.device)) for n, t in weights])
            self.loaded = None if got is None or self.loaded is None else self.loaded | set(got)

        def shutdown(self) -> None:
            self.folder = None

    _ENGINE_CLASS.append(ShmWeightTransferEngine)
    return ShmWeightTransferEngine


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register ``grpolab_shm`` (once; vLLM may call it again)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, engine_class())
