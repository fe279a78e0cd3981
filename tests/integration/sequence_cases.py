"""One train step under sequence parallelism (train.sequence_parallel), on the fixed global batch of
parallel_cases.py, run in one process or as one rank of a gloo job; used by test_sequence_parallel.py.

Each case also returns the rollout batch's recomputed and reference log-probs (and PPO's values) of this
rank's rows, so the test compares the split forward's outputs as well as the update they lead to.
"""

from __future__ import annotations

import os
from pathlib import Path

import parallel_cases as pc
import torch

PACKED = ("train.padding_free=true",)

CASES = [
    ("grpo", "seq-mean-token-mean", ()),
    ("grpo", "token-mean", PACKED),
    ("ppo", "token-mean", ()),
    ("ppo", "token-mean", PACKED),
    ("grpo", "seq-mean-token-mean", ("model.gradient_checkpointing=true",)),
]
"""(algo, loss aggregation, extra overrides): GRPO and PPO, padded and packed micro-batches; and GRPO with
activation checkpointing (the recomputed attention gets the whole sequence's mask again)."""

GRID_JOBS = [(CASES[0], "ddp"), (CASES[1], "fsdp"), (CASES[3], "ddp")]
"""(case, train.parallel) of the 2 x 2 (data x sequence) job: GRPO padded (DDP) and packed (FSDP2), PPO packed."""


def run_case(model_dir: str, algo: str, agg: str, extra: tuple[str, ...], mode: str, n: int) -> dict:
    """``parallel_cases.run_case`` with ``train.sequence_parallel=n`` (the policy's attention made Ulysses
    before wrapping, as runtime/assemble.py does); returns weights, metrics and this rank's batch tensors."""
    from grpolab.distributed import dist, parallel
    from grpolab.models.loading import Reference, load_policy
    from grpolab.models.ulysses_attention import install
    from grpolab.runtime.step_spec import batch_builder, build_critic, logprob_context, update_spec
    from grpolab.training.step import update_policy

    cfg = pc.make_config(model_dir, algo, agg, mode, (*extra, f"train.sequence_parallel={n}"))
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    install(model, n)
    mode = parallel.resolve_parallel(cfg.train.parallel, dist.world().size)
    reference = parallel.wrap_reference(Reference(model, None), mode, None)
    model = parallel.wrap(model, mode, torch.device("cpu"))
    optimizer, scheduler = pc._sgd(model)
    ctx = logprob_context(cfg, pad_id=tok.pad_token_id, autocast_dtype=None, device_type="cpu")
    critic = None
    if cfg.algo.needs_critic:
        critic = build_critic(cfg, torch.device("cpu"), ctx)
        critic.optimizer, critic.scheduler = pc._sgd(critic.model)
    prompts, comps, rewards = pc.local_share(*pc.global_batch())
    valid = torch.ones_like(rewards, dtype=torch.bool)
    batch, metrics = batch_builder(cfg, ctx, critic)(comps, prompts, rewards, valid, policy=model, reference=reference)
    gen = torch.Generator().manual_seed(1)
    metrics.update(update_policy(model, optimizer, scheduler, batch, update_spec(cfg, ctx), generator=gen))
    if critic is not None:
        metrics.update(critic.update(batch))
    metrics = dist.reduce_metrics(metrics)
    tensors = {k: getattr(batch, k) for k in ("old_logprobs", "ref_logprobs", "old_values", "advantages")}
    return {
        "policy": pc._full_weights(model),
        "value": None if critic is None else pc._full_weights(critic.model),
        "metrics": metrics,
        "batch": {k: None if v is None else v.detach().clone() for k, v in tensors.items()},
    }


FORWARDS = [("sdpa", 1, False), ("eager", 1, True), ("sdpa", 4, True)]
"""(attention, key / value heads, packed) of the direct forward checks on a 4-head model: one key / value
head is repeated to the query heads before the split; eager attention gets the additive mask."""


def forward_case(attention: str, kv: int, packed: bool, n: int) -> dict:
    """Log-probs and entropies of a fixed batch and the gradients of a loss of them on a model built here,
    its attention split over ``n`` ranks; the gradients summed over the ranks (each holds its positions')."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpolab.models.ulysses_attention import install
    from grpolab.training.logprobs import completion_logprobs
    from grpolab.training.packing import packed_completion_logprobs

    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv, attn_implementation=attention, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert model.config._attn_implementation == attention
    install(model, n)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (k,), generator=gen).tolist() for k in (3, 5, 2)]
    ids = torch.randint(3, 60, (3, 7), generator=gen)
    mask = torch.arange(7)[None] < torch.tensor([7, 4, 1])[:, None]
    forward = packed_completion_logprobs if packed else completion_logprobs
    logprobs, entropy = forward(model, prompts, ids, mask, pad_id=0, with_entropy=True, entropy_grad=True)
    (logprobs.sum() + 0.3 * (logprobs**2).sum() - 0.1 * entropy.sum()).backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    if n > 1:
        for g in grads.values():
            torch.distributed.all_reduce(g)
    return {"logprobs": logprobs.detach(), "entropy": entropy.detach(), "grads": grads}


def worker(rank: int, world: int, port: int, model_dir: str, out: str, n: int, jobs: list) -> None:
    """A rank of the job (torch.multiprocessing.spawn): each (case, mode) of ``jobs``; rank 0 saves them."""
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
         "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    )  # fmt: skip
    torch.set_num_threads(1)
    from grpolab.distributed import dist, sequence

    results = {}
    with dist.session("cpu"), sequence.sequence_parallel(n):
        seen = [None] * world  # what each rank trains on: its group's first rank's draw
        torch.distributed.all_gather_object(seen, sequence.shared({"drawn_by": rank, "t": torch.tensor([rank])}))
        results["shared"] = [(s["drawn_by"], int(s["t"])) for s in seen]
        if world == n:
            for case in FORWARDS:
                results[case] = forward_case(*case, n)
        for case, mode in jobs:
            results[(*case, mode)] = run_case(model_dir, *case, mode, n)
        if dist.is_main():
            torch.save(results, Path(out))
