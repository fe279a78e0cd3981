"""One train step (rollout batch + policy update, + the critic's for PPO) on a fixed global batch, run
either in one process or as one rank of a job; used by test_parallel_step.py.

The global batch (prompts, completions, rewards) comes from a generator seeded the same on every rank;
each rank takes its share of the prompts (dist.shard) with their completions, as the loop does. SGD
instead of AdamW: Adam's first step is the same for a gradient and twice that gradient, so it could
not tell a wrongly normalised loss from a right one.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

P, G, T = 4, 2, 6


def make_config(model_dir: str, algo: str, agg: str, mode: str, extra: tuple[str, ...] = ()):
    from grpolab.config import load_config

    overrides = [
        f"model.name_or_path={model_dir}",
        "model.autocast=none",
        f"algo.name={algo}",
        "algo.beta=0.05",
        "algo.mu=2",
        "algo.num_minibatches=1",  # one update per pass whatever the preset: the test is about the ranks
        f"rollout.num_generations={G}",
        f"rollout.max_completion_length={T}",
        f"train.prompts_per_step={P}",
        "train.micro_batch_size=2",
        f"train.parallel={mode}",
        "optim.max_grad_norm=0",
    ]
    if algo != "ppo":
        overrides.append(f"algo.loss_agg={agg}")
    return load_config(None, [*overrides, *extra])


def global_batch(episodes: bool = False):
    """(prompt_ids [P], Completions of N = P*G rows, rewards [P, G]); the same on every rank. ``episodes``:
    the rows are multi-turn episodes, about a third of their tokens the environment's (sampled_mask False)."""
    from grpolab.types import Completions

    gen = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(3, 60, (int(n),), generator=gen).tolist() for n in torch.randint(2, 6, (P,), generator=gen)]
    n = P * G
    ids = torch.randint(3, 60, (n, T), generator=gen)
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.where(mask, ids, torch.zeros_like(ids))
    logprobs = -torch.rand(n, T, generator=gen) * mask
    finish = ["length" if int(k) == T else "stop" for k in lengths]
    comps = Completions(
        prompt_ids=[p for p in prompts for _ in range(G)],
        completion_ids=ids,
        completion_mask=mask,
        logprobs=logprobs,
        texts=["x"] * n,
        finish_reasons=finish,
        num_generations=G,
    )
    rewards = torch.randint(0, 3, (P, G), generator=gen).float()
    if episodes:  # drawn after the rest, so the ids, lengths and rewards are the other cases'
        comps.sampled_mask = torch.rand(n, T, generator=gen) > 0.35
        comps.sampled_mask[:, 0] = True  # a model turn starts every episode
        comps.logprobs = comps.logprobs * comps.sampled_mask
    return prompts, comps, rewards


def local_share(prompts, comps, rewards):
    """This rank's prompts, their completions and rewards."""
    from grpolab.distributed import dist

    rows = dist.shard(list(range(P)))
    local = comps.select([p * G + g for p in rows for g in range(G)])
    return [prompts[i] for i in rows], local, rewards[rows]


def _sgd(model, lr=0.05):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _full_weights(model) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone().cpu() for k, v in sd.items()}


def run_case(model_dir: str, algo: str, agg: str, extra: tuple[str, ...], mode: str) -> dict:
    """One step; returns {"policy": weights, "value": weights or None, "metrics": {...}}."""
    from grpolab.distributed import dist, parallel
    from grpolab.models.loading import Reference, load_policy
    from grpolab.runtime.step_spec import batch_builder, build_critic, logprob_context, update_spec
    from grpolab.training.step import update_policy

    cfg = make_config(model_dir, algo, agg, mode, extra)
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    mode = parallel.resolve_parallel(cfg.train.parallel, dist.world().size)
    reference = parallel.wrap_reference(Reference(model, None), mode, None)
    model = parallel.wrap(model, mode, torch.device("cpu"))
    optimizer, scheduler = _sgd(model)
    ctx = logprob_context(cfg, pad_id=tok.pad_token_id, autocast_dtype=None, device_type="cpu")
    critic = None
    if cfg.algo.needs_critic:
        critic = build_critic(cfg, torch.device("cpu"), ctx)
        critic.optimizer, critic.scheduler = _sgd(critic.model)
    prompts, comps, rewards = local_share(*global_batch(episodes=EPISODES[0] in extra))
    valid = torch.ones_like(rewards, dtype=torch.bool)
    batch, metrics = batch_builder(cfg, ctx, critic)(comps, prompts, rewards, valid, policy=model, reference=reference)
    spec = update_spec(cfg, ctx)
    gen = torch.Generator().manual_seed(1)
    metrics.update(update_policy(model, optimizer, scheduler, batch, spec, generator=gen))
    if critic is not None:
        metrics.update(critic.update(batch))
    metrics = dist.reduce_metrics(metrics)
    return {
        "policy": _full_weights(model),
        "value": None if critic is None else _full_weights(critic.model),
        "metrics": metrics,
    }


BUDGET = ("train.max_tokens_per_micro_batch=16",)
"""A token budget that gives rank 0 four micro-batches and rank 1 three (its prompts are shorter): rank 1
splits one more (microbatch._same_count_on_every_rank), and one process makes seven."""

EPISODES = ("env.max_turns=2",)
"""Marks the case whose batch holds multi-turn episodes (env tokens in the sequence, masked out of the loss)."""

CASES = [
    ("grpo", "seq-mean-token-mean", ()),
    ("grpo", "seq-mean-token-mean", EPISODES),
    ("grpo", "token-mean", ()),
    ("grpo", "seq-mean-token-sum-norm", ()),
    ("grpo", "seq-mean-token-mean", BUDGET),
    ("reinforce_pp", "token-mean", ()),
    ("ppo", "token-mean", ()),
]


def worker(rank: int, world: int, port: int, model_dir: str, out: str, modes: tuple[str, ...]) -> None:
    """A rank of the job (torch.multiprocessing.spawn): every case in every mode; rank 0 saves them."""
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
         "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    )
    torch.set_num_threads(1)
    from grpolab.distributed import dist

    results = {}
    with dist.session("cpu"):
        for mode in modes:
            for case in CASES:
                results[(*case, mode)] = run_case(model_dir, *case, mode)
        if dist.is_main():
            torch.save(results, Path(out))
