"""One policy update on a generation batch: mu passes, minibatches, gradient accumulation.

The per-token objective is DeepSeekMath eq. 3: the clipped surrogate (or CISPO's weighted REINFORCE term, or
SAPO's gated one), kept only where the off-policy sequence mask and the high-entropy token mask keep it, times the
rollout-correction weight when one is configured, minus beta * KL (k3 by default), minus the entropy bonus,
aggregated by the configured mode. The math lives in grpolab.algo; this module only feeds it.

Why the loss reads about 0 at mu = 1: the ratio is exactly 1 (old = sg[new]), so the surrogate's
value is sum(A) over a group, and group-relative advantages sum to zero. Its gradient is not zero:
it is A * grad log pi, the policy gradient. Watch reward, KL and clip fractions, not the loss value.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections import defaultdict

import torch

from grpolab.algo.correction import mismatch_sums
from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.algo.losses import Aggregation, batch_row_norms
from grpolab.algo.selection import entropy_threshold, high_entropy_mask, off_policy_sequence_mask
from grpolab.distributed import dist
from grpolab.distributed.host import give_back_before_first_step, giving_back_freed_memory
from grpolab.distributed.parallel import clip_grad_norm, gradient_sync
from grpolab.training.activations import offloaded
from grpolab.training.master import backward, grads_to_clip, scale_backed_off
from grpolab.training.microbatch import completion_lengths_of, prompt_lengths_of, split_rows
from grpolab.training.spec import LogprobContext, PolicyLossSpec, UpdateSpec
from grpolab.types import RolloutBatch

log = logging.getLogger(__name__)

TOKEN_MEAN = Aggregation.named("token-mean")
"""The entropy bonus's normalisation whatever algo.loss_agg (TRL: L = L_policy - coef * H, H the mean per-token entropy)."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mb: RolloutBatch,
    spec: PolicyLossSpec,
    *,
    total_seqs: float,
    total_tokens: float,
    entropy: torch.Tensor | None = None,
    token_keep: torch.Tensor | None = None,
    row_norm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss for a micro-batch, scaled so that micro-batches sum to the minibatch loss.

    ``entropy`` [N, T] (with its graph when ``spec.entropy_coef > 0``) feeds the entropy bonus; ``token_keep``
    [N, T] bool (the high-entropy tokens, algo.top_entropy_quantile) limits the policy loss and the bonus to them;
    ``row_norm`` [N] is each row's divisor under "batch-token-mean" (``minibatch_row_norms``).
    """
    mask = mb.loss_mask
    weights = None
    if spec.correction is not None and mb.sampler_logprobs is not None:
        weights = spec.correction(old_logprobs, mb.sampler_logprobs, mask)
    sur = spec.surrogate(
        logprobs, old_logprobs, mb.advantages, mask=mask, **({"is_weights": weights} if spec.correction_in_loss else {})
    )
    stats = {
        "clip_frac_low": _masked_sum(sur.clipped_low.float(), mask),
        "clip_frac_high": _masked_sum(sur.clipped_high.float(), mask),
        "approx_kl_old": _masked_sum(0.5 * (logprobs.detach() - old_logprobs) ** 2, mask),
    }
    per_token, entropy = _selected(sur.loss, logprobs, old_logprobs, mb, spec, stats, entropy, token_keep)
    per_token = _rollout_terms(per_token, old_logprobs, mb, spec, weights, stats)
    if spec.kl is not None:
        kl = spec.kl(logprobs, mb.ref_logprobs)
        per_token = per_token + spec.beta * kl
        stats["kl"] = _masked_sum(kl.detach(), mask)
    agg = functools.partial(spec.aggregate, mask=mask, total_seqs=total_seqs, total_tokens=total_tokens, row_norm=row_norm)
    loss = agg(per_token)
    if (spec.entropy_coef > 0 or spec.entropy_adaptive) and entropy is not None:
        # TRL: the bonus is the mean per-token entropy whatever the loss type normalises the policy term by
        # (L = L_policy - coef * H); policy_loss is the loss without it (logged while adaptive control gates it off)
        stats["policy_loss"] = float(loss.detach().item())
        loss = loss - spec.entropy_coef * TOKEN_MEAN(entropy, mask, total_tokens=total_tokens)
    return loss, stats


def _selected(per_token, logprobs, old_logprobs, mb: RolloutBatch, spec: PolicyLossSpec, stats, entropy, token_keep):
    """(policy loss, entropy) less what the off-policy sequence mask and the high-entropy token mask drop."""
    mask = mb.loss_mask
    if spec.off_policy_threshold is not None:
        # the paper's and TRL's pi_old is the sampler's (the engine's log-probs: both the updates since sampling
        # and the engine / trainer mismatch count); without them, the trainer's at the sampling weights
        sampler = mb.sampler_logprobs if mb.sampler_logprobs is not None else old_logprobs
        keep = off_policy_sequence_mask(mb.advantages, logprobs, sampler, mask, threshold=spec.off_policy_threshold)
        per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
        stats["off_policy_masked"] = _masked_sum((~keep).float(), mask)
    if token_keep is not None:
        per_token = torch.where(token_keep, per_token, torch.zeros_like(per_token))
        if entropy is not None:
            entropy = torch.where(token_keep, entropy, torch.zeros_like(entropy))  # TRL: the bonus on the same tokens
    return per_token, entropy


def _rollout_terms(per_token, old_logprobs, mb: RolloutBatch, spec: PolicyLossSpec, weights, stats):
    """The sampler/trainer mismatch sums and the rollout-correction weights (already inside VESPO's loss)."""
    mask = mb.loss_mask
    if mb.sampler_logprobs is not None:
        # old_logprobs are the trainer's log-probs at the sampling weights (recomputed, or this pass's own
        # values when the ratio is 1): what the sampler's log-probs should have been.
        stats.update(mismatch_sums(old_logprobs, mb.sampler_logprobs, mask))
    if weights is not None:
        if not spec.correction_in_loss:
            per_token = per_token * weights
        stats["rollout_weight"] = _masked_sum(weights, mask)
        stats["rollout_masked"] = _masked_sum((weights == 0).float(), mask)
    return per_token


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum().item())


def minibatch_order(n: int, num_minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Row indices of each minibatch: a seeded shuffle split into equal parts."""
    perm = torch.randperm(n, generator=generator) if num_minibatches > 1 else torch.arange(n)
    return list(perm.chunk(num_minibatches))


def minibatch_row_norms(batch: RolloutBatch, rows: torch.Tensor, batch_rows: int | None, generator: torch.Generator):
    """[N] divisors of "batch-token-mean" for the minibatch ``rows`` (other rows 0), or None for the other modes.

    TRL's bnpo divides each micro-batch of per_device_train_batch_size rows, cut from the shuffled generation
    batch, by its own tokens: the rows are shuffled here too (the minibatch generator, so a resumed run draws
    the same), cut into batches of ``batch_rows``, and every rank's batches counted. These batches are the
    loss's, not the forwards' (``micro_batches`` groups rows by length for memory), so memory settings do not
    change the loss."""
    if batch_rows is None:
        return None
    order = rows[torch.randperm(len(rows), generator=generator)]
    num_batches = dist.all_reduce_sum(float(math.ceil(len(rows) / batch_rows)))
    norms = torch.zeros(batch.num_sequences, dtype=torch.float64, device=batch.loss_mask.device)
    norms[order] = batch_row_norms(batch.loss_mask[order], batch_rows, num_batches=num_batches)
    return norms


def micro_batches(
    rows: torch.Tensor, lengths: torch.Tensor, size: int, max_tokens: int | None = None, prompt_lengths=None
) -> list[torch.Tensor]:
    """Split rows into micro-batches of similar length (less padding in each forward); with ``max_tokens``
    also bounded by padded tokens (grpolab.training.microbatch)."""
    return split_rows(rows, lengths, size, max_tokens=max_tokens, prompt_lengths=prompt_lengths)


@giving_back_freed_memory  # on a CPU, freed activations leave the RSS before the biggest allocations
def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: RolloutBatch,
    spec: UpdateSpec,
    *,
    generator: torch.Generator,
    entropy_control: AdaptiveEntropy | None = None,
) -> dict[str, float]:
    """mu passes over the batch, num_minibatches optimizer steps each. Returns averaged metrics.

    ``entropy_control`` (algo.entropy_adaptive) sets each optimizer step's entropy coefficient, and is moved
    by the entropy that step measured."""
    sums: dict[str, float] = defaultdict(float)
    counts = {"tokens": 0.0, "updates": 0, "skipped": 0}
    ctx, loss_spec = spec.logprobs, spec.loss
    lengths = completion_lengths_of(batch.completion_mask)
    budget = {"max_tokens": ctx.max_tokens, "prompt_lengths": prompt_lengths_of(batch.prompt_ids)}
    model.train()
    for _ in range(spec.mu):
        for rows in minibatch_order(batch.num_sequences, spec.num_minibatches, generator):
            total_tokens = dist.global_token_count(batch.loss_mask[rows])  # normalisers over all ranks
            total_seqs = dist.all_reduce_sum(float(len(rows)))
            optimizer.zero_grad(set_to_none=True)
            finite = True
            micros = micro_batches(rows, lengths, ctx.micro_batch_size, **budget)
            norms = minibatch_row_norms(batch, rows, loss_spec.aggregate.batch_rows, generator)
            keeps = _high_entropy_tokens(model, batch, micros, ctx, loss_spec)
            step_spec = loss_spec if entropy_control is None else dataclasses.replace(loss_spec, entropy_coef=entropy_control.applied())
            counted = [0.0, 0.0]  # adaptive entropy: the step's entropy sum and tokens
            for i, (micro, keep) in enumerate(zip(micros, keeps, strict=True)):
                mb = batch.select(micro)
                # DDP: forward and backward inside no_sync (its forward arms the all-reduce), but the last
                offload = offloaded(spec.offload_activations, batch.completion_ids.device.type)
                with gradient_sync(model, sync=i == len(micros) - 1), offload:
                    loss, entropy, stats = _micro_batch_loss(
                        model, mb, ctx, step_spec, total_seqs=total_seqs, total_tokens=total_tokens, token_keep=keep,
                        row_norm=None if norms is None else norms[micro],
                    )
                    backward(loss * dist.grad_scale(), optimizer)  # through the fp16 loss scaler when there is one
                finite = finite and math.isfinite(loss.item())
                sums["loss"] += float(loss.item())
                sums["entropy"] += _masked_sum(entropy.detach(), mb.loss_mask)
                if entropy_control is not None:
                    _count_entropy(counted, entropy, mb.loss_mask, keep)
                for k, v in stats.items():
                    sums[k] += v
            counts["tokens"] += total_tokens
            finite = not dist.any_rank(not finite)  # every rank skips, or none
            give_back_before_first_step(optimizer)  # before AdamW's states are allocated (distributed/host.py)
            _optimizer_step(model, optimizer, scheduler, spec.max_grad_norm, sums, counts, loss_finite=finite)
            if entropy_control is not None:  # TRL: the window's token-weighted mean over every rank
                entropy_control.observe(dist.all_reduce_sum(counted[0]) / max(dist.all_reduce_sum(counted[1]), 1.0))
    return {**_summarise(sums, counts, scheduler), **_entropy_coef_metrics(loss_spec, entropy_control)}


def _count_entropy(counted: list[float], entropy: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None) -> None:
    """Adds a micro-batch's entropy sum and token count where the policy loss counts tokens (TRL: the mask of
    the high-entropy tokens too) to ``counted``: adaptive control's measurement."""
    counted_mask = mask if keep is None else mask & keep
    counted[0] += _masked_sum(entropy.detach(), counted_mask)
    counted[1] += float(counted_mask.sum().item())


def _entropy_coef_metrics(spec: PolicyLossSpec, control: AdaptiveEntropy | None) -> dict[str, float]:
    """TRL's ``entropy_coef`` (adaptive: after the step's last update) and what the next step applies."""
    if control is not None:
        return {"entropy_coef": control.coef, "loss/entropy_coef_next": control.applied()}
    return {"entropy_coef": spec.entropy_coef} if spec.entropy_coef > 0 else {}


def _micro_batch_loss(model, mb: RolloutBatch, ctx: LogprobContext, spec: PolicyLossSpec, *, total_seqs: float,
                      total_tokens: float, token_keep: torch.Tensor | None = None, row_norm: torch.Tensor | None = None):
    """(loss, entropy [n, T], stats) of one micro-batch, its graph kept for the backward; packed into one
    padding-free sequence with train.padding_free (training/packing.py)."""
    logprobs, entropy = ctx.forward(model, mb, entropy_grad=spec.entropy_coef > 0, into_grad=True)
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    loss, stats = policy_loss(
        logprobs, old, mb, spec, total_seqs=total_seqs, total_tokens=max(total_tokens, 1.0), entropy=entropy,
        token_keep=token_keep, row_norm=row_norm,
    )  # fmt: skip
    return loss, entropy, stats


@torch.no_grad()
def evaluation_loss(model, batch: RolloutBatch, ctx: LogprobContext, spec: PolicyLossSpec) -> float:
    """The loss of ``batch`` at the current weights, without a gradient: TRL's eval loss (its prediction_step runs
    compute_loss in eval mode). The old log-probs are the current ones (ratio 1), the whole batch is one optimizer
    step (its totals normalise, and it is bnpo's one batch), the KL, entropy mask and entropy bonus as in training."""
    rows = torch.arange(batch.num_sequences)
    micros = micro_batches(rows, completion_lengths_of(batch.completion_mask), ctx.micro_batch_size,
                           max_tokens=ctx.max_tokens, prompt_lengths=prompt_lengths_of(batch.prompt_ids))  # fmt: skip
    keeps = _high_entropy_tokens(model, batch, micros, ctx, spec)
    norms = batch_row_norms(batch.loss_mask, max(batch.num_sequences, 1)) if spec.aggregate.batch_rows else None
    total_tokens = max(float(batch.loss_mask.sum().item()), 1.0)
    loss = 0.0
    for micro, keep in zip(micros, keeps, strict=True):
        mb = batch.select(micro)
        logprobs, entropy = ctx.forward(model, mb)
        value, _ = policy_loss(
            logprobs, logprobs, mb, spec, total_seqs=float(batch.num_sequences), total_tokens=total_tokens,
            entropy=entropy, token_keep=keep, row_norm=None if norms is None else norms[micro],
        )  # fmt: skip
        loss += float(value.item())
    return loss


@torch.no_grad()
def _high_entropy_tokens(model, batch: RolloutBatch, micros, ctx: LogprobContext, spec: PolicyLossSpec) -> list[torch.Tensor | None]:
    """Per micro-batch, the tokens the 80/20 rule keeps (algo.top_entropy_quantile < 1), else Nones.

    The threshold is the quantile over the whole minibatch's counted tokens on every rank, under the weights
    its micro-batches train (TRL: the current policy's entropies, over one micro-step's rows; an optimizer step's
    here, so the mask does not depend on how rows are split for memory): it needs them all before the first
    backward, hence this forward without gradient over the minibatch."""
    if spec.top_entropy_quantile >= 1:
        return [None] * len(micros)
    entropies, masks = [], []
    for micro in micros:
        mb = batch.select(micro)
        _, entropy = ctx.forward(model, mb)
        entropies.append(entropy)
        masks.append(mb.loss_mask)
    counted = dist.gather_ragged(torch.cat([e[m] for e, m in zip(entropies, masks, strict=True)]).float())
    if counted.numel() == 0:
        return [torch.zeros_like(m) for m in masks]
    threshold = entropy_threshold(counted, spec.top_entropy_quantile)
    return [
        high_entropy_mask(e, m, top_quantile=spec.top_entropy_quantile, threshold=threshold)
        for e, m in zip(entropies, masks, strict=True)
    ]


def _optimizer_step(model, optimizer, scheduler, max_grad_norm: float, sums, counts, *, loss_finite=True) -> None:
    """Clip and step; a NaN / infinite loss or gradient norm skips the update (weights, optimizer and
    schedule untouched) and counts it in ``counts["skipped"]`` (train/skipped_updates; see guards.py)."""
    params = grads_to_clip(model, optimizer)  # the fp32 master weights where there are some
    norm = clip_grad_norm(params, max_grad_norm if max_grad_norm > 0 else math.inf)
    if not loss_finite or not torch.isfinite(norm):
        if scale_backed_off(optimizer, loss_finite):  # fp16 loss scale too high: lowered, not a bad step
            optimizer.zero_grad(set_to_none=True)
            return
        log.warning("non-finite loss or gradient norm (%s): update skipped", norm.item())
        optimizer.zero_grad(set_to_none=True)
        counts["skipped"] += 1
        return
    sums["grad_norm"] += float(norm.item())
    optimizer.step()
    scheduler.step()
    # the gradients are spent: freed now, not at the next minibatch, so they do not stay allocated through
    # the weight sync, the next rollout and the reference forward (a colocated vLLM needs that memory)
    optimizer.zero_grad(set_to_none=True)
    counts["updates"] += 1


def _summarise(sums, counts, scheduler) -> dict[str, float]:
    grad_norm = sums.pop("grad_norm", 0.0)  # already the same on every rank
    sums = defaultdict(float, {**dist.sum_dict(sums), "grad_norm": grad_norm})
    tokens = max(counts["tokens"], 1.0)
    passes = max(counts["updates"] + counts["skipped"], 1)
    out = {  # TRL's names for TRL's quantities (README "Metrics"); grpolab's own keep a prefix
        "loss": sums["loss"] / passes,
        "clip_ratio/low_mean": sums["clip_frac_low"] / tokens,
        "clip_ratio/high_mean": sums["clip_frac_high"] / tokens,
        "clip_ratio/region_mean": (sums["clip_frac_low"] + sums["clip_frac_high"]) / tokens,
        "loss/approx_kl_old": sums["approx_kl_old"] / tokens,
        "entropy": sums["entropy"] / tokens,
        "grad_norm": sums["grad_norm"] / max(counts["updates"], 1),
        "learning_rate": scheduler.get_last_lr()[0],
        "train/skipped_updates": float(counts["skipped"]),
    }
    if "kl" in sums:
        out["kl"] = sums["kl"] / tokens
    if "policy_loss" in sums:
        out["policy_loss"] = sums["policy_loss"] / passes
    for key, name in _ROLLOUT_METRICS.items():
        if key in sums:
            out[name] = sums[key] / tokens
    return out


_ROLLOUT_METRICS = {
    "sampler_abs_diff": "sampling/sampling_logp_difference/mean",  # TRL's name: mean |log pi_train - log pi_sampler|
    "sampler_kl": "rollout/sampler_kl",
    "rollout_weight": "sampling/importance_sampling_ratio/mean",  # TRL's: the truncated / masked weight's mean
    "rollout_masked": "loss/rollout_masked_frac",
    "off_policy_masked": "loss/off_policy_masked_frac",  # tokens of the sequences the off-policy mask dropped
}
