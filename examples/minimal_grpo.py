"""GRPO on one page: DeepSeekMath's Algorithm 1 (Shao et al., arXiv 2402.03300, Sec. 4.1.4).

The whole algorithm in paper order, from grpolab's pure math (``grpolab.algo``), its hf sampler
(``grpolab.rollout.hf``) and the tiny task (``grpolab.tasks``), plus torch. No config, no runtime, no
run directory: read it top to bottom. The library's ``grpolab train`` runs the same steps with
everything around them (checkpoints, resume, many engines and estimators, distribution, logging).

The task is 3-digit addition with the sum written least-significant digit first (``123+456=`` ->
``9750``), on a 2-layer model with random weights built in code. The formulas are in docs/algorithms.md.

Departures from the paper, and why:
* The reward is a rule written below (the share of answer digits in the right place), not a reward
  model, so the outer loop's last line (train the reward model on the new samples) has nothing to do.
  Partial credit gives a model that starts from random weights a signal; exact match would give every
  group equal rewards (advantage 0) for a long time. ``grpolab demo`` starts from SFT instead.
* The policy starts from random weights, not from an SFT model, so the learning rate is far above
  the paper's 1e-6 (a 7B model); docs/algorithms.md 6.0 has the numbers of a tiny model from SFT.

With one outer iteration (the default) the reference is the initial policy throughout.

    python examples/minimal_grpo.py [--steps 100] [--mu 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import random
import string

import torch

from grpolab.algo import aggregate, clipped_surrogate_loss, grpo_advantages, kl_k3
from grpolab.rollout.hf import HFSampler
from grpolab.tasks.arithmetic import arithmetic_examples
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

# Shapes (docs/design.md): P prompts per step, G completions per prompt, N = P * G, T completion tokens.


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=1, help="outer iterations I (pi_ref reset at each)")
    p.add_argument("--steps", type=int, default=100, help="steps M per iteration")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step, P")
    p.add_argument("--group", type=int, default=8, help="completions per prompt, G")
    p.add_argument("--mu", type=int, default=1, help="GRPO iterations mu: policy updates per batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=0.2, help="epsilon of the clipped ratio")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def reward(text: str, answer: str) -> float:
    """Share of the answer's characters the completion has in the right place (1.0 = exact)."""
    return sum(a == b for a, b in zip(text, answer, strict=False)) / len(answer)


def completion_logprobs(model, prompt_ids: torch.Tensor, completion_ids: torch.Tensor, temperature: float):
    """logprobs [N, T]: logprobs[:, t] = log pi(completion[:, t] | prompt, completion[:, :t]), with the
    sampler's temperature, so that the ratio to the sampling log-probs is 1 before any update.

    Every prompt of the task has the same length, so the rows need no padding on the left; the padding
    after EOS only follows the tokens that count, and the completion mask drops it."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, S]
    logits = model(input_ids=input_ids).logits[:, prompt_ids.shape[1] - 1 : -1]  # [N, T, V]
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logprobs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    # Input: the initial policy pi_theta_init, the reward (a rule here), the task prompts D.
    tokenizer = build_char_tokenizer(string.digits + "+=")  # 12 characters and 4 specials
    policy = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=args.seed)
    tasks = arithmetic_examples(size=2000, seed=args.seed, digits=3)  # 123+456= -> 9750 (reversed sum)
    answer_length = len(tasks[0].answer)
    sampler = HFSampler(
        policy, tokenizer, max_completion_length=answer_length + 1, temperature=args.temperature
    )  # reads the live policy at every call: pi_old is pi_theta when the batch is sampled
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    G = args.group

    print(f"{'iter':>4} {'step':>4} {'reward':>8} {'kl':>8} {'loss':>8} {'clip':>6} {'zero_std':>8}")
    for iteration in range(1, args.iterations + 1):
        # pi_ref <- pi_theta: a frozen copy of the policy, reset at every outer iteration.
        reference = copy.deepcopy(policy).eval().requires_grad_(False)

        for step in range(1, args.steps + 1):
            # Sample a batch D_b of questions.
            batch = rng.sample(tasks, args.prompts)
            prompt_ids = [[tokenizer.bos_token_id, *tokenizer(e.prompt)["input_ids"]] for e in batch]

            # pi_old <- pi_theta; sample G outputs {o_i} ~ pi_old(. | q) for each question q.
            out = sampler.sample(prompt_ids, num_generations=G, generator=generator)
            mask = out.completion_mask  # [N, T] bool, True = the token counts (up to and including EOS)
            old_logprobs = out.logprobs  # [N, T] log pi_old of the sampled tokens, from the sampler
            prompts = torch.tensor(out.prompt_ids)  # [N, Sp], row p * G + g is sample g of prompt p

            # Compute the rewards {r_i} of each output, and the group-relative advantages (Sec. 4.1.2):
            # A_i = (r_i - mean(r)) / (std(r) + eps), the same for every token of output i.
            rewards = torch.tensor(
                [[reward(out.texts[p * G + g], e.answer) for g in range(G)] for p, e in enumerate(batch)]
            )  # [P, G]
            advantages = grpo_advantages(rewards).flatten()  # [P, G] -> [N]
            with torch.no_grad():
                ref_logprobs = completion_logprobs(reference, prompts, out.completion_ids, args.temperature)

            # For GRPO iteration = 1..mu: update pi_theta by maximising the GRPO objective (Eq. 3):
            # per token, the clipped surrogate minus beta * the k3 KL to pi_ref (Eq. 4), averaged over
            # each output's tokens, then over the outputs ("seq-mean-token-mean").
            for _ in range(args.mu):
                logprobs = completion_logprobs(policy, prompts, out.completion_ids, args.temperature)
                surrogate = clipped_surrogate_loss(
                    logprobs, old_logprobs, advantages, clip_low=args.clip, clip_high=args.clip, mask=mask
                )
                kl = kl_k3(logprobs, ref_logprobs)  # [N, T], >= 0
                loss = aggregate(surrogate.loss + args.beta * kl, mask, "seq-mean-token-mean")
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
                optimizer.step()

            kl_mean = aggregate(kl.detach(), mask, "seq-mean-token-mean").item()
            clipped = (surrogate.clipped_low | surrogate.clipped_high).sum().item() / mask.sum().item()
            zero_std = (rewards.std(dim=1) == 0).float().mean().item()  # groups that teach nothing
            print(
                f"{iteration:4d} {step:4d} {rewards.mean().item():8.4f} {kl_mean:8.4f} "
                f"{loss.item():8.4f} {clipped:6.3f} {zero_std:8.3f}",
                flush=True,
            )
        # (DeepSeekMath then trains the reward model on the new samples; a rule reward needs nothing.)


if __name__ == "__main__":
    main()
