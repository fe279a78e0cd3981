"""The PPO value model V_psi: the policy's architecture with a scalar head, and its per-token values.

    values[:, t] = V(prompt, completion[:, :t])    the state from which completion token t is chosen

the same alignment as ``logprobs`` (grpolab.types), so GAE's ``delta_t = r_t + gamma V_{t+1} - V_t`` pairs
the reward of token t with the states before and after it (TRL and verl take the values at the same
positions).

Initialisation (``algo.value_init``):
* ``policy``: the body is ``AutoModel`` loaded from the policy checkpoint (any causal LM: the LM head is
  dropped) and the head ``Linear(hidden, 1)`` starts at zero, so V = 0 at the start and the first
  advantages are the plain returns.
* ``reward_model``: body and head come from an ``AutoModelForSequenceClassification`` with one label
  (TRL's default for the value model), so V starts from the reward model's scores.

Departures, and why: the head runs in fp32 outside autocast (as the policy's output head does in
logprobs.py); a LoRA policy still gets a fully trained value model loaded from the base checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from grpolab.distributed import sequence
from grpolab.models.inference import enable_checkpointing
from grpolab.models.loading import ModelLoadError, attention_kwargs, autocast_context
from grpolab.models.sources import local_source
from grpolab.models.ulysses_attention import install as install_ulysses
from grpolab.models.ulysses_attention import masks_for, sharded_outputs
from grpolab.training.logprobs import build_inputs
from grpolab.training.spec import ValueModelSpec

log = logging.getLogger(__name__)


class ValueModel(nn.Module):
    """A transformer body (no LM head) and a scalar head: hidden states [n, S, H] -> values [n, S]."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, input_ids, attention_mask, position_ids, *, autocast_dtype=None) -> torch.Tensor:
        if sequence.active():  # this rank's slice of the positions, every rank then holding all values
            every = torch.arange(input_ids.shape[1], device=input_ids.device)
            return sharded_outputs(lambda local: self._local(local, autocast_dtype), input_ids, position_ids, attention_mask, every)
        return self._values(input_ids, attention_mask, position_ids, autocast_dtype)

    def _local(self, local, autocast_dtype) -> torch.Tensor:
        return self._values(local.input_ids, masks_for(self.body, local.shard), local.position_ids, autocast_dtype)[:, local.keep]

    def _values(self, input_ids, attention_mask, position_ids, autocast_dtype) -> torch.Tensor:
        with autocast_context(input_ids.device, autocast_dtype):
            hidden = self.body(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
        with torch.autocast(device_type=input_ids.device.type, enabled=False):
            bias = None if self.head.bias is None else self.head.bias.float()
            return nn.functional.linear(hidden.float(), self.head.weight.float(), bias).squeeze(-1)


def token_values(
    model: ValueModel,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    pad_id: int,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """[n, T] values of the states before each completion token, 0 where completion_mask is False.

    Gradients flow when called outside no_grad; columns past the longest counted completion are zeros.
    """
    t_full = completion_ids.shape[1]
    t = max(int(completion_mask.sum(-1).max().item()), 1)
    input_ids, attention_mask, position_ids = build_inputs(prompt_ids, completion_ids[:, :t], pad_id)
    values = model(input_ids, attention_mask, position_ids, autocast_dtype=autocast_dtype)[:, -t - 1 : -1]
    values = torch.where(completion_mask[:, :t], values, torch.zeros_like(values))
    return nn.functional.pad(values, (0, t_full - t)) if t < t_full else values


def load_value_model(spec: ValueModelSpec, device: torch.device, *, placement: str = "device") -> ValueModel:
    """The value model of ``spec.init`` (algo.value_init), trainable. ``placement``: "device" loads it onto ``device``;
    under FSDP2 rank 0 loads it into host memory ("host") and the other ranks build it on the meta device
    ("meta": shapes only, no file read), and ``build_critic`` (runtime/step_spec.py) broadcasts rank 0's weights
    into the shards, as the policy loads (distributed/parallel.py, loads_on_rank0)."""
    m = spec.model
    kwargs = {"revision": m.revision, "dtype": getattr(torch, m.dtype), "trust_remote_code": m.trust_remote_code}
    kwargs |= attention_kwargs(m)
    source = spec.init_path if spec.init == "reward_model" else _base_checkpoint(local_source(m.name_or_path))
    if placement == "meta":
        model = _on_meta(source, kwargs, reward_model=spec.init == "reward_model")
    elif spec.init == "reward_model":
        model = _from_reward_model(source, kwargs)
    else:  # a GGUF source (a file, package:...) is read from its converted folder, as the policy is
        model = _from_policy_checkpoint(source, kwargs)
    install_ulysses(model, spec.sequence_parallel)  # before wrapping; a one-line error if it cannot split
    if m.checkpointing_on(device.type, spec.longest_sequence):
        enable_checkpointing(model.body)
    return (model.to(device) if placement == "device" else model).train()


def _on_meta(source: str | None, kwargs: dict, *, reward_model: bool) -> ValueModel:
    """The value model's shapes and dtypes on the meta device, from its config alone."""
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    build = {k: v for k, v in kwargs.items() if k != "revision"}
    try:
        config = AutoConfig.from_pretrained(source, revision=kwargs["revision"], trust_remote_code=kwargs["trust_remote_code"])
        with torch.device("meta"):
            if reward_model:
                config.num_labels = 1
                rm = AutoModelForSequenceClassification.from_config(config, **build)
                return ValueModel(rm.base_model, nn.Linear(config.get_text_config().hidden_size, 1, dtype=kwargs["dtype"]))
            body = AutoModel.from_config(config, **build)
            return ValueModel(body, nn.Linear(config.get_text_config().hidden_size, 1, dtype=_param_dtype(body)))
    except (OSError, ValueError, TypeError, KeyError) as err:  # the line rank 0's load gives
        raise ModelLoadError(f"could not build the value model from '{source}': {err}") from err


def _base_checkpoint(source: str) -> str:
    """A LoRA adapter folder stands for its base model."""
    adapter_config = Path(source, "adapter_config.json")
    if adapter_config.exists():
        return json.loads(adapter_config.read_text())["base_model_name_or_path"]
    return source


def _from_policy_checkpoint(source: str, kwargs: dict) -> ValueModel:
    from transformers import AutoModel

    try:
        body = AutoModel.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"could not load the value model's body from '{source}' (model.name_or_path, algo.value_init=policy): "
            f"{err}. Check the path holds a causal LM's config.json and weights."
        ) from err
    hidden = body.config.get_text_config().hidden_size
    head = nn.Linear(hidden, 1, dtype=_param_dtype(body))
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return ValueModel(body, head)


def _from_reward_model(source: str | None, kwargs: dict) -> ValueModel:
    from transformers import AutoModelForSequenceClassification

    try:
        rm = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"could not load a reward model from '{source}' (algo.value_init_path): {err}. Give a folder or hub "
            "id of an AutoModelForSequenceClassification with one label, or set algo.value_init=policy."
        ) from err
    scalar = [c for c in rm.children() if isinstance(c, nn.Linear) and c.out_features == 1]
    if len(scalar) != 1:
        raise ModelLoadError(
            f"reward model '{source}' (algo.value_init_path) has no single Linear(hidden, 1) head to start the "
            "value head from; use algo.value_init=policy"
        )
    old = scalar[0]
    head = nn.Linear(old.in_features, 1, dtype=old.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.copy_(old.bias if old.bias is not None else torch.zeros(1))
    return ValueModel(rm.base_model, head)


def _param_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype
