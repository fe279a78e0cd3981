"""The trained policy's weights, under its Hugging Face names, for the vLLM engine's weight sync.

``policy_weights(model)`` yields ``(name, tensor)`` one parameter at a time, whatever holds the policy:

* a plain transformers model: its parameters, a tied head under both names (vLLM's in-place reload
  rebuilds every layer it is given and leaves one it is not given broken: without ``lm_head.weight`` a
  tied model's log-probs after a sync were off by ~1.3 nats, with it they match to 1e-6);
* DDP: the wrapped module's;
* FSDP2: each parameter gathered whole (``DTensor.full_tensor()``) just before it is yielded, so at most
  one full parameter is held beyond the shards; every rank must consume the iterator to the end, in the
  same order (each gathers into its own engine);
* PEFT LoRA: the base weights with the adapter merged in (``W + get_delta_weight``, PEFT's own merge
  arithmetic), named as the base model's checkpoint names; the training model is not changed and the
  adapter parameters are not sent.

The engine loads them with vLLM's in-place reload (``collective_rpc("reload_weights")``), which takes
checkpoint-format names and tensors and runs the model's own ``load_weights``.

Each tensor is sent in the dtype the engine holds that parameter in (``EngineDtypes``: the engine's model
dtype, but fp32 where the engine keeps a parameter in fp32), cast here one tensor at a time, so that a bf16
engine gets half the bytes of an fp32 trainer's weights and vLLM neither casts them again nor warns once per
tensor ("Attempted to load weight ... with dtype torch.float32 into parameter with dtype torch.bfloat16").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from grpolab.distributed import parallel
from grpolab.models.loading import is_peft

Weights = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class EngineDtypes:
    """The dtype an engine holds each parameter in, by checkpoint name."""

    default: torch.dtype | None
    """The engine's model dtype (vLLM's ``model_config.dtype``); None: send the trainer's dtype unchanged."""
    held: Mapping[str, torch.dtype] = field(default_factory=dict)
    """The parameters the engine keeps in another dtype than ``default`` (an fp32 one in a bf16 engine)."""

    def of(self, name: str, tensor_dtype: torch.dtype) -> torch.dtype:
        """The dtype to send ``name`` in (a tensor of ``tensor_dtype`` on the trainer's side)."""
        return self.held.get(name) or self.default or tensor_dtype


Dtypes = EngineDtypes | torch.dtype | None
"""What the senders take: an engine's dtypes, one dtype for every tensor, or None (the trainer's own)."""


def as_engine_dtypes(dtype: Dtypes) -> EngineDtypes:
    return dtype if isinstance(dtype, EngineDtypes) else EngineDtypes(dtype)


def held_dtypes(model: torch.nn.Module, default: torch.dtype) -> dict[str, torch.dtype]:
    """``EngineDtypes.held`` of a vLLM model: its parameters not in ``default``, under checkpoint names (a
    fused ``qkv_proj`` under ``q_proj``, ``k_proj`` and ``v_proj``, from the model's ``packed_modules_mapping``).
    Run in the engine's worker (``LLM.apply_model``); vLLM's names outside the mapping are the checkpoint's."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    held: dict[str, torch.dtype] = {}
    for name, param in model.named_parameters():
        if param.dtype == default:
            continue
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        for part in packed.get(last, [last]):
            held[".".join(x for x in (parent, part, leaf) if x)] = param.dtype
    return held


def policy_weights(model: torch.nn.Module, dtype: Dtypes = None, *, merge_lora: bool = True) -> Weights:
    """``(checkpoint name, full tensor)`` of every weight the engine needs (module docstring), each cast to
    the dtype the engine holds it in (``dtype``; module docstring), one tensor at a time.
    ``merge_lora=False``: a PEFT model's base weights alone (a server that takes the adapter itself)."""
    dtypes = as_engine_dtypes(dtype)
    return ((name, t.to(dtypes.of(name, t.dtype))) for name, t in _gathered(_entries(model, merge_lora)))


def weight_metadata(
    model: torch.nn.Module, dtype: Dtypes = None, *, merge_lora: bool = True
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """``(name, dtype, whole shape)`` of what ``policy_weights`` yields, in its order, gathering nothing (an
    FSDP2 DTensor's shape is the whole tensor's): what vLLM's NCCL engine sizes its receive buffers from."""
    dtypes = as_engine_dtypes(dtype)
    return [(name, dtypes.of(name, p.dtype), tuple(p.shape)) for name, p, _ in _entries(model, merge_lora)]


class Tally:
    """Weights passed through, counting the bytes of the tensors yielded (a sampler's ``last_sync_bytes``)."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.bytes = 0

    def __iter__(self) -> Weights:
        for name, tensor in self.weights:
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor


def _entries(model: torch.nn.Module, merge_lora: bool):
    """``(checkpoint name, parameter, LoRA layer whose delta is merged into it or None)`` of every weight sent:
    a plain model's parameters, a tied head under both names (see the module docstring); a PEFT model's base
    weights under the base model's names, the adapter parameters left out."""
    model = parallel.unwrap(model)
    if not is_peft(model):
        for name, param in model.named_parameters(remove_duplicate=False):  # a tied head too
            yield name, param, None
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    lora_layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, param in base.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            continue  # the adapter itself: merged below
        module_name, _, leaf = name.rpartition(".")
        owner = module_name.removesuffix(".base_layer")
        layer = lora_layers.get(owner) if module_name.endswith(".base_layer") else None
        merged = layer if merge_lora and layer is not None and leaf == "weight" else None
        yield (f"{owner}.{leaf}" if owner != module_name else name), param, merged


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a collective: every rank calls it), else the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


@torch.no_grad()
def _gathered(entries) -> Weights:
    """Each entry's whole tensor, its LoRA delta merged in (base + PEFT's get_delta_weight), one at a time."""
    for name, param, layer in entries:
        tensor = _full(param.detach())
        yield name, tensor if layer is None else tensor + _delta(layer, tensor)


def _delta(layer, weight: torch.Tensor) -> torch.Tensor:
    """The sum of the active adapters' weight deltas of one LoRA layer, in ``weight``'s dtype."""
    delta = torch.zeros_like(weight)
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            delta += _full(layer.get_delta_weight(adapter)).to(weight.dtype)
    return delta
