"""fp32 master weights for a model stored in bf16 / fp16, and loss scaling for fp16.

AdamW at lr 1e-6 on bf16 weights barely moves them: an update smaller than half a bf16 ulp (2^-8
relative) rounds away, so most weights never change (measured on the DeepSeekMath example config: 1.9%
of the weights changed at all over 10 steps, against 99.99% in fp32). ``MasterWeightOptimizer`` keeps
an fp32 copy of every low-precision trainable parameter; the gradients of the model (computed in its
storage dtype) are copied into them, clipped and stepped there with fp32 optimizer states, and the
result is rounded back into the model after each step. The forward and backward keep running on the
bf16 weights (fast and small); only the optimizer side is fp32 (Micikevicius et al., "Mixed Precision
Training", arXiv 1710.03740). fp16 also gets dynamic loss scaling (torch.amp.GradScaler): its
gradients underflow below 6e-8 without it. Parameters already in fp32 (LoRA adapters, which PEFT keeps
in fp32) are stepped directly, with no copy.

Why a wrapper rather than casting the model to fp32 and running under autocast (which ``model.dtype:
float32`` already offers): the bf16 storage keeps the forward, the sampler and the reference copy at
half the weight memory and free of per-op casts; the fp32 copy lives only beside the optimizer.

Switching it off: ``build_optimizer(..., master_weights=False)``, and it is off by itself when every
trainable parameter is fp32 already, as under FSDP2 with a MixedPrecisionPolicy (fp32 sharded
parameters, bf16 compute), where FSDP is the master-weight mechanism.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeightOptimizer:
    """An optimizer over fp32 copies of low-precision parameters; looks like the optimizer it wraps."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        *,
        loss_scaling: bool = False,
    ):
        self.params = list(params)
        self.masters = [
            p.detach().float().clone().requires_grad_(True) if p.dtype in LOW_PRECISION else p for p in self.params
        ]
        self.optimizer = make_optimizer(self.masters)
        """The wrapped optimizer (AdamW), over the fp32 masters: build the LR scheduler on it."""
        device = self.params[0].device.type
        self.scaler = torch.amp.GradScaler(device) if loss_scaling else None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _pairs(self):
        return [(p, m) for p, m in zip(self.params, self.masters, strict=True) if m is not p]

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def gather_grads(self) -> list[torch.Tensor]:
        """Move the model's gradients into the fp32 masters (unscaled); returns the tensors to clip."""
        for p, m in self._pairs():
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        return self.masters

    def back_off(self) -> bool:
        """After a non-finite gradient with fp16 loss scaling: lower the scale; True when that is the
        likely cause (the scale was still above 1), so the step is not a bad step."""
        if self.scaler is None:
            return False
        scale = float(self.scaler.get_scale())
        self.scaler.update()
        return scale > 1.0

    @torch.no_grad()
    def step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        for p, m in self._pairs():
            p.copy_(m)  # round to the storage dtype

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for p, _ in self._pairs():
            p.grad = None

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "masters": [m.detach().clone() for _, m in self._pairs()],
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        for (p, m), saved in zip(self._pairs(), state["masters"], strict=True):
            m.copy_(saved)
            p.copy_(saved)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


    # torch.distributed.checkpoint (runtime/sharded.py): DCP's get/set_optimizer_state_dict map an optimizer's
    # parameters to the model's names, and this one steps fp32 copies the model does not hold. Under DDP
    # the masters and states are the same on every rank: DCP writes each once and every rank reads it.
    def dcp_state_dict(self, model: torch.nn.Module) -> dict:
        """The state keyed by the model's parameter names: the fp32 masters, AdamW's per-parameter
        states, the param groups' settings and the loss scaler. Tensors are the live ones (DCP loads in
        place), so call ``load_dcp_state_dict`` after ``dcp.load`` to finish the job."""
        names = self._names(model)
        if not self.optimizer.state:
            self._init_state()  # a template for DCP to load into: every state tensor exists, of its shape
        state = {names[i]: dict(self.optimizer.state[m]) for i, m in enumerate(self.masters)}
        masters = {names[i]: m for i, (p, m) in enumerate(zip(self.params, self.masters, strict=True)) if m is not p}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        return {"state": state, "masters": masters, "param_groups": groups,
                "scaler": None if self.scaler is None else self.scaler.state_dict()}  # fmt: skip

    @torch.no_grad()
    def load_dcp_state_dict(self, model: torch.nn.Module, state: dict) -> None:
        """The loaded ``dcp_state_dict(model)``: states and settings in place, masters into the model."""
        names = self._names(model)
        for i, m in enumerate(self.masters):
            self.optimizer.state[m].update(state["state"][names[i]])
        for group, saved in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            group.update(saved)
        for i, (p, m) in enumerate(zip(self.params, self.masters, strict=True)):
            if m is not p:
                m.copy_(state["masters"][names[i]])
                p.copy_(m)  # the model's bf16 weights are the masters rounded, as after a step
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def _names(self, model: torch.nn.Module) -> list[str]:
        by_id = {id(p): name for name, p in model.named_parameters()}
        missing = [i for i, p in enumerate(self.params) if id(p) not in by_id]
        if missing:
            raise ValueError(f"{len(missing)} optimized parameters are not parameters of the model given")
        return [by_id[id(p)] for p in self.params]

    def _init_state(self) -> None:
        """One AdamW step at lr 0 on zero gradients makes every state tensor (torch's own
        ``_init_optim_state`` does the same); the weights do not move."""
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        for m in self.masters:
            if m.grad is None:
                m.grad = torch.zeros_like(m)
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0
        self.optimizer.step()
        for g, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)


def backward(loss: torch.Tensor, optimizer) -> None:
    """``loss.backward()``, through the optimizer's loss scaler when it has one."""
    if isinstance(optimizer, MasterWeightOptimizer):
        optimizer.backward(loss)
    else:
        loss.backward()


def grads_to_clip(model: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """The tensors whose gradients the optimizer steps: the fp32 masters, or the trainable parameters."""
    if isinstance(optimizer, MasterWeightOptimizer):
        return optimizer.gather_grads()
    return [p for p in model.parameters() if p.requires_grad]


def scale_backed_off(optimizer, loss_finite: bool) -> bool:
    """After a non-finite gradient: True when it came from fp16 loss scaling (the scale is lowered; not a
    bad step). Call it on every skipped step: the scaler must see an update before the next one."""
    backed_off = isinstance(optimizer, MasterWeightOptimizer) and optimizer.back_off()
    return loss_finite and backed_off


def wants_master_weights(params: Sequence[torch.nn.Parameter]) -> bool:
    """True when some trainable parameter is stored in bf16 / fp16."""
    return any(p.dtype in LOW_PRECISION for p in params)

