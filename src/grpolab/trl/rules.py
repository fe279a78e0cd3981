"""The rules that turn TRL GRPOConfig values into grpolab config keys; grpolab.trl.fields lists which rule
each TRL field gets, grpolab.trl.kinds the three kinds of field.

The semantics were read from trl/trainer/grpo_trainer.py of TRL 1.16 (``_generate_and_score_completions``
for the advantages, ``_compute_loss`` for the loss); each mapping has a test in tests/unit/trl/test_convert.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from grpolab.trl.kinds import Refused

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView


def importance_level(value: Any, t: Any) -> dict[str, Any]:
    """GSPO-token (``sequence_token``, trl.experimental.gspo_token's GRPOTrainer) weighs each token by the
    sequence ratio times pi/sg(pi): its value is GSPO's, and with TRL's per-sequence advantages its gradient
    is GSPO's too (TRL's docs, gspo_token.md), so it is read as ``sequence``. VESPO's loss does not read it."""
    if t["loss_type"] == "vespo" and value != "token":
        t.note(f"importance_sampling_level={value}: VESPO's loss builds its own sequence weight (TRL warns), so token")
        return {"algo.importance_level": "token"}
    if value == "sequence_token":
        t.note("importance_sampling_level='sequence_token': read as algo.importance_level=sequence; GSPO-token "
               "with per-sequence advantages (TRL's) has GSPO's value and gradient")
        return {"algo.importance_level": "sequence"}
    return {"algo.importance_level": value}


# ----------------------------------------------------------------------------- batch geometry and steps


def batch_geometry(v: Any, t: TrlView) -> dict[str, Any]:
    """TRL counts completions per device and micro-steps; grpolab counts prompts per generation batch
    (P x G completions, global), mu passes over it, each split into num_minibatches optimizer steps."""
    g = t.geometry
    return {
        "train.prompts_per_step": g.prompts_per_step,
        "rollout.num_generations": t["num_generations"],
        "algo.mu": t["num_iterations"],
        "algo.num_minibatches": g.num_minibatches,
        "train.micro_batch_size": t["per_device_train_batch_size"],
    }


def num_steps(v: Any, t: TrlView) -> dict[str, Any]:
    g = t.geometry
    if g.num_steps is None:
        t.todo(
            f"train.num_steps: TRL trains num_train_epochs={t['num_train_epochs']:g} over the dataset; set "
            f"train.num_steps = epochs x dataset rows / train.prompts_per_step ({g.prompts_per_step}), or "
            "pass --dataset-rows"
        )
        return {}
    if t["max_steps"] > 0 and t["max_steps"] % g.optimizer_steps_per_generation:
        t.note(
            f"max_steps={t['max_steps']} optimizer steps is not a whole number of generation batches "
            f"({g.optimizer_steps_per_generation} optimizer steps each): rounded up to {g.num_steps}"
        )
    return {"train.num_steps": g.num_steps}


def fraction_of_run(t: TrlView, fraction: float, what: str) -> float | None:
    """transformers' ``*_steps`` below 1: ``ceil(fraction x the run's optimizer steps)``, once the run length is
    known (max_steps, or num_train_epochs with --dataset-rows); None (and a to-fill item) before."""
    g = t.geometry
    if g.num_steps is None:
        t.todo(f"{what}={fraction:g} is a fraction of the run: pass --dataset-rows (or max_steps) to resolve it")
        return None
    steps = math.ceil(fraction * g.num_steps * g.optimizer_steps_per_generation)
    t.note(f"{what}={fraction:g} of the run's {g.num_steps * g.optimizer_steps_per_generation} optimizer steps = {steps}")
    return steps


def to_generation_steps(t: TrlView, optimizer_steps: float, what: str) -> int:
    per = t.geometry.optimizer_steps_per_generation
    steps = max(1, round(optimizer_steps / per))
    if optimizer_steps % per:
        t.note(f"{what}={optimizer_steps:g} optimizer steps rounded to {steps} grpolab steps of {per} each")
    return steps


# ----------------------------------------------------------------------------- the algorithm

_LOSS_AGG = {
    "grpo": "seq-mean-token-mean",  # (per_token_loss * mask).sum(-1) / mask.sum(-1), mean over rows
    "bnpo": "batch-token-mean",  # sum / active tokens of each micro-batch, mean over the micro-batches
    "dr_grpo": "seq-mean-token-sum-norm",  # sum / (rows * max_completion_length)
    "dapo": "token-mean",  # sum / active tokens of the accumulated batch
    "cispo": "token-mean",  # the dapo normaliser
    "sapo": "seq-mean-token-mean",  # the grpo normaliser
    "luspo": "seq-mean-token-sum",  # (per_token_loss * mask).sum(-1).mean(): each row's sum, mean over rows
    "vespo": "token-mean",  # the dapo normaliser
}
_POLICY_LOSS = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}  # the others: the clipped surrogate
_VESPO = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


def loss_type(v: str, t: TrlView) -> dict[str, Any]:
    """loss_type picks TRL's normaliser (and cispo's weight, sapo's gate, vespo's gamma weight); the advantage is
    scale_rewards'."""
    if v not in _LOSS_AGG:
        raise Refused(f"grpolab has no '{v}' loss (it has grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo)")
    if _LOSS_AGG[v] == "token-mean" and t.geometry.num_minibatches > 1:
        t.note(
            f"loss_type={v}: TRL divides each optimizer step by the generation batch's active tokens / "
            "steps_per_generation x gradient_accumulation_steps (an average); grpolab by the minibatch's own "
            "active tokens: the same when steps_per_generation = gradient_accumulation_steps"
        )
    if v == "luspo" and t["importance_sampling_level"] != "sequence":
        t.note("loss_type=luspo with importance_sampling_level=token, as given (TRL warns: LUSPO's paper uses sequence)")
    out = {
        "algo.name": "cispo" if v == "cispo" else "grpo",
        "algo.loss_agg": _LOSS_AGG[v],
        "algo.policy_loss": _POLICY_LOSS.get(v, "clip"),
        "algo.dynamic_sampling": False,
    }
    if v == "bnpo":  # TRL's micro-batch: per_device_train_batch_size rows of the shuffled generation batch
        out["algo.loss_agg_batch_rows"] = t["per_device_train_batch_size"]
    if v == "sapo":
        out["algo.sapo_temperature_pos"] = t["sapo_temperature_pos"]
        out["algo.sapo_temperature_neg"] = t["sapo_temperature_neg"]
    if v == "vespo":
        out.update({f"algo.{name}": t[name] for name in _VESPO})
    return out


def scale_rewards(v: Any, t: TrlView) -> dict[str, Any]:
    """TRL: (r - group mean) / (std + 1e-4), Bessel's std (nanstd) of the group (group), of the batch's rewards
    (batch) or none; normalize_then_sum (GDPO) instead normalises each reward function in its group, sums them
    with the weights and whitens the sum over the batch, whatever scale_rewards says."""
    v = {True: "group", False: "none"}.get(v, v)
    aggregation = t["multi_objective_aggregation"]
    if aggregation == "normalize_then_sum":
        if v != "group":
            t.note(f"scale_rewards={v}: not read with multi_objective_aggregation=normalize_then_sum (GDPO), as TRL")
        return {"algo.advantage": "gdpo", "algo.std": "unbiased", "algo.eps": 1e-4}
    if aggregation != "sum_then_normalize":
        raise Refused(f"multi_objective_aggregation={aggregation}: TRL has sum_then_normalize and normalize_then_sum")
    advantages = {"group": "grpo", "batch": "batch_reward_std", "none": "dr_grpo"}
    if v not in advantages:
        raise Refused(f"scale_rewards={v}: TRL's values are group (True), batch and none (False)")
    return {"algo.advantage": advantages[v], "algo.std": "unbiased", "algo.eps": 1e-4}


def off_policy_mask(v: Any, t: TrlView) -> dict[str, Any]:
    if v is not None and not t["use_vllm"]:
        t.note(
            "off_policy_mask_threshold without vLLM: TRL measures the drift from the trainer's own log-probs at the "
            "sampling weights, grpolab from the engine's sampling log-probs (the same weights: equal up to rounding)"
        )
    return {"algo.off_policy_mask_threshold": v}


def top_entropy(v: float, t: TrlView) -> dict[str, Any]:
    if not 0 <= v <= 1:
        raise Refused(f"top_entropy_quantile={v:g} must be in [0, 1]")
    accumulation = t["gradient_accumulation_steps"]
    if v < 1 and accumulation > 1:
        t.note(
            f"top_entropy_quantile={v:g}: TRL takes the entropy quantile over each micro-step's completions "
            f"(per_device_train_batch_size x processes), grpolab over the optimizer step's ({accumulation} "
            "micro-steps), so the mask does not depend on the micro-batch size: the same at "
            "gradient_accumulation_steps=1"
        )
    return {"algo.top_entropy_quantile": v}


def beta(v: float, t: TrlView) -> dict[str, Any]:
    if v > 0 and t["use_bias_correction_kl"] and not t.ratio_is_one:
        t.note(
            "use_bias_correction_kl=True: TRL multiplies the k3 KL term by the importance ratio; grpolab does "
            "not (the same value and gradient while the ratio is 1, i.e. one optimizer step per generation)"
        )
    return {"algo.beta": v, "algo.kl_estimator": "k3", "algo.kl_in": "loss"}


def clip(v: float, t: TrlView) -> dict[str, Any]:
    high = t["epsilon_high"] if t["epsilon_high"] is not None else v
    if t["loss_type"] == "sapo":
        return {}  # TRL's sapo reads neither epsilon nor delta: a smooth gate, no clip
    if t["loss_type"] == "cispo":
        # TRL: clamp(ratio, max=epsilon_high).detach(); grpolab: clamp(ratio, 1 - clip_low, 1 + clip_high)
        if high <= 1:
            t.note(
                f"loss_type=cispo caps the IS weight at epsilon_high={high:g} itself (not 1 + epsilon_high): every "
                "token's weight is at most that, as in TRL (ScaleRL sets epsilon_high 5.0)"
            )
        return {"algo.clip_low": 1.0, "algo.clip_high": high - 1.0, "algo.dual_clip": None}
    out = {"algo.clip_low": v, "algo.clip_high": high, "algo.dual_clip": None}
    delta = t["delta"]
    if delta is not None:
        if delta <= 1 + high:
            raise Refused(
                f"delta={delta:g} <= 1 + epsilon_high also caps positive advantages' ratio; grpolab's "
                "algo.dual_clip caps only negative ones, the same bound for delta > 1 + epsilon_high"
            )
        out["algo.dual_clip"] = delta
    return out


def sync_ref(v: bool, t: TrlView) -> dict[str, Any]:
    if not v:
        return {"algo.ref_reset_every": 0}
    every = to_generation_steps(t, t["ref_model_sync_steps"], "ref_model_sync_steps")
    return {"algo.ref_reset_every": every, "algo.ref_mixup_alpha": t["ref_model_mixup_alpha"]}


def entropy(v: float, t: TrlView) -> dict[str, Any]:
    return {"algo.entropy_coef": v}  # both subtract coef x the mean per-token entropy, whatever the loss_type


_ADAPTIVE = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")


def adaptive_entropy(v: bool, t: TrlView) -> dict[str, Any]:
    """Skywork-OR1's controller, updated once per optimizer step in both (TRL: at each sync_gradients)."""
    if not v:
        return {"algo.entropy_adaptive": False}
    return {"algo.entropy_adaptive": True, **{f"algo.{name}": t[name] for name in _ADAPTIVE}}


_IS_MODES = {
    "token_truncate": ("tis", "token"),
    "token_mask": ("mis", "token"),
    "sequence_truncate": ("tis", "sequence"),
    "sequence_mask": ("mis", "sequence"),
}


def rollout_correction(v: bool, t: TrlView) -> dict[str, Any]:
    """TRL corrects only vLLM's samples: w = exp(old_logps - sampling_logps), per token or summed per sequence."""
    if not (v and t["use_vllm"]):
        return {"algo.rollout_correction": "none"}
    cap = t["vllm_importance_sampling_cap"] or t["vllm_importance_sampling_clip_max"]
    if t["vllm_importance_sampling_clip_min"] is not None or cap is None:
        raise Refused(
            "grpolab's rollout correction bounds the weight from above only (algo.rollout_correction_cap): set "
            "vllm_importance_sampling_clip_min=None and vllm_importance_sampling_clip_max"
        )
    mode, level = _IS_MODES[t["vllm_importance_sampling_mode"]]
    return {
        "algo.rollout_correction": mode,
        "algo.rollout_correction_level": level,
        "algo.rollout_correction_cap": cap,
    }


# ----------------------------------------------------------------------------- optimizer, precision, model


def schedule(v: Any, t: TrlView) -> dict[str, Any]:
    name = getattr(v, "value", v)
    names = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant",
             "cosine_with_min_lr": "cosine"}
    if name not in names:
        raise Refused(f"grpolab's schedules are constant, linear and cosine (after a linear warm-up); not {name}")
    floor = _min_lr(name, dict(t["lr_scheduler_kwargs"] or {}), t["learning_rate"])
    out = _warmup(name, names[name], t)
    return {**out, "optim.min_lr_ratio": floor} if floor else out


def _min_lr(name: str, kwargs: dict[str, Any], lr: float) -> float:
    """transformers' cosine_with_min_lr floor as a fraction of the peak lr (min_lr_rate, or min_lr / lr)."""
    if name != "cosine_with_min_lr":
        if kwargs:
            raise Refused(f"lr_scheduler_kwargs={kwargs} has no grpolab equivalent for {name}")
        return 0.0
    unknown = sorted(set(kwargs) - {"min_lr_rate", "min_lr", "num_cycles"})
    if unknown or kwargs.get("num_cycles", 0.5) != 0.5 or ("min_lr" in kwargs) == ("min_lr_rate" in kwargs):
        raise Refused(
            f"cosine_with_min_lr takes one of min_lr_rate / min_lr (num_cycles 0.5) in grpolab (optim.min_lr_ratio); "
            f"got {sorted(kwargs)}"
        )
    rate = kwargs["min_lr_rate"] if "min_lr_rate" in kwargs else kwargs["min_lr"] / lr
    if not 0 <= rate < 1:
        raise Refused(f"the learning-rate floor is {rate:g} of the peak; it must be in [0, 1)")
    return float(rate)


def _warmup(name: str, schedule_name: str, t: TrlView) -> dict[str, Any]:
    warmup = t["warmup_steps"]
    if name == "constant":
        warmup = 0  # transformers' "constant" ignores warmup_steps
    elif 0 < warmup < 1:  # a fraction of the optimizer steps
        total = t.geometry.num_steps and t.geometry.num_steps * t.geometry.optimizer_steps_per_generation
        if not total:
            t.todo(f"optim.warmup_steps: warmup_steps={warmup:g} is a fraction of the run's optimizer steps")
            return {"optim.schedule": schedule_name}
        warmup = math.ceil(total * warmup)
    if warmup < 0:
        raise Refused(f"warmup_steps={warmup:g} must be >= 0")
    if warmup:
        t.note("warm-up: transformers starts at lr 0 (step/warmup); grpolab at lr/warmup ((step+1)/warmup)")
    return {"optim.schedule": schedule_name, "optim.warmup_steps": int(warmup)}


def betas(v: float, t: TrlView) -> dict[str, Any]:
    return {"optim.betas": [v, t["adam_beta2"]]}


def optim(v: Any, t: TrlView) -> dict[str, Any]:
    name = getattr(v, "value", v)
    if name not in ("adamw_torch", "adamw_torch_fused"):
        raise Refused(f"grpolab's optimizer is torch's AdamW (adamw_torch / adamw_torch_fused), not {name}")
    return {}


def weight_decay(v: float, t: TrlView) -> dict[str, Any]:
    if v:
        t.note("weight_decay: transformers exempts biases and norm weights; grpolab decays every trainable weight")
    return {"optim.weight_decay": v}


def precision(v: Any, t: TrlView) -> dict[str, Any]:
    if t["fp16"]:
        raise Refused("grpolab has no fp16 autocast (loss scaling); use bf16=True or bf16=False")
    bf16 = (not t["fp16"]) if v is None else v  # TRL: None = True unless fp16
    return {"model.autocast": "bf16" if bf16 else "none"}


_INIT_KWARGS_NA = {"use_cache", "low_cpu_mem_usage", "trust_remote_code"}


def init_kwargs(v: Any, t: TrlView) -> dict[str, Any]:
    kwargs = dict(v or {})
    # the trl grpo script puts ModelConfig.dtype into model_init_kwargs; TRL: float32 when neither is given
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", t["dtype"] or "float32"))
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise Refused(f"model_init_kwargs dtype={dtype}: grpolab's model.dtype is float32, bfloat16 or float16")
    out: dict[str, Any] = {"model.dtype": dtype}
    if "revision" in kwargs:
        out["model.revision"] = kwargs.pop("revision")
    if kwargs.get("attn_implementation"):
        out["model.attn_implementation"] = kwargs.pop("attn_implementation")
    kwargs.pop("attn_implementation", None)
    other = sorted(k for k in kwargs if k not in _INIT_KWARGS_NA)
    if other:
        raise Refused(f"model_init_kwargs {other} have no grpolab equivalent (device_map, quantization, ...)")
    return out
