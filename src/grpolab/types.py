"""The objects that flow through one training step, and the shape glossary.

Shapes, everywhere in grpolab:
    P  prompts in a step            G  completions per prompt (num_generations)
    N  = P * G sequences            T  completion tokens (right-padded)
    S  full sequence (prompt + completion)                V  vocabulary

Log-prob alignment, stated once:
    logprobs[:, t] = log pi(completion_ids[:, t] | prompt, completion_ids[:, :t])

Masks say what True means: ``completion_mask`` is True for tokens that count, i.e. every
generated token up to and including the first EOS. In a multi-turn episode (grpolab.rollout.multiturn)
the "completion" is everything after the prompt: the model's turns and the environment's messages;
``completion_mask`` is True over all of them (they are the sequence the trainer runs), and
``sampled_mask`` is True only for the tokens the model sampled (the ones that train).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

FinishReason = Literal["stop", "length"]

FailureKind = Literal[
    "engine_error", "env_error", "env_timeout", "sandbox_error",
    "reward_error", "reward_timeout", "reward_nan", "reward_invalid",
]  # fmt: skip
"""Why a sample failed (docs/training.md, "Failed samples"): the inference engine or server answered it with an
error; its environment raised, broke its contract or did not answer in time; a sandbox could not run; a reward
raised, timed out, returned a non-finite value, or returned nothing usable (not a list, too few values, a
value that is not a number). Each is counted as ``failures/<kind>`` in metrics.jsonl."""
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


@dataclass(frozen=True)
class Failure:
    """A sample that failed after its retries: never scored, its whole group is dropped from the step."""

    kind: FailureKind
    message: str
    """One line naming what failed and on which example, as an error would say it."""


@dataclass(frozen=True)
class Example:
    """One task item: what the model is asked, and what the rewards need to grade it."""

    prompt: str
    """The prompt text, already templated (system prompt / chat template applied)."""
    answer: str | None = None
    """The reference answer, when the task has one."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Anything else a reward needs (test cases, a reasoning-gym entry, ...)."""
    messages: tuple[Mapping[str, Any], ...] | None = None
    """The prompt as chat messages (TRL's conversational format), rendered with the tokenizer's chat
    template (add_generation_prompt=True); ``prompt`` then holds them as "role: content" lines for logs."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion, as a reward sees it: text and the facts a length reward needs."""

    text: str
    num_tokens: int
    """Counted tokens, EOS included when produced."""
    finish_reason: FinishReason = "stop"
    token_ids: tuple[int, ...] | None = None
    """The counted token ids (EOS included when produced); None where only text is known (the dry run)."""

    episode: Episode | None = None
    """The conversation, for rewards over a multi-turn episode; None for a single completion."""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True)
class Episode:
    """What an environment episode left besides its tokens (grpolab.rollout.multiturn)."""

    messages: tuple[Mapping[str, Any], ...]
    """The whole conversation: the first messages, each model turn (decoded) and each environment answer."""
    env_reward: float | None
    """The sum of the per-turn rewards the environment gave; None when it gave none."""
    turns: int
    """Model turns sampled."""
    tool_calls: int = 0
    """Tool calls the environment ran (0 for environments without tools)."""
    tool_errors: int = 0
    """Tool calls that raised, timed out or were cut (a bounded error message went back instead)."""
    turn_ends: tuple[int, ...] = ()
    """Per model turn, the index in the completion of its last token (process supervision's step ends)."""
    turn_rewards: tuple[float | None, ...] = ()
    """Per model turn, the reward the environment gave for it (None: none, or the turn was cut)."""
    retries: int = 0
    """Times the episode was run again from a fresh environment after a failure (env.max_retries)."""
    environment: Any = field(default=None, compare=False, repr=False)
    """The object whose tools the episode called, as the episode left it (a TRL ``environment_factory``'s object,
    which TRL rewards read as ``environments``); None where the environment exposes none. It lives in this process:
    a pickled Episode (a reward's worker process) carries None, since a copy would not be the object."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "environment"}


@dataclass
class Completions:
    """What a sampler returns for P prompts x G samples, grouped prompt-major (row p*G + g)."""

    prompt_ids: list[list[int]]
    """[N] prompt token ids, unpadded; never re-derived from text."""
    completion_ids: torch.Tensor
    """[N, T] long, right-padded with the pad token."""
    completion_mask: torch.Tensor
    """[N, T] bool, True for generated tokens up to and including the first EOS."""
    logprobs: torch.Tensor
    """[N, T] float32, log-probs of the sampled tokens under softmax(logits / temperature)."""
    texts: list[str]
    """[N] decoded completions (EOS and padding removed)."""
    finish_reasons: list[FinishReason]
    """[N] "stop" when EOS was produced, "length" when cut at max_completion_length."""
    num_generations: int
    """G."""
    sampled_mask: torch.Tensor | None = None
    """[N, T] bool, True for the tokens the model sampled; False for environment / tool tokens (context
    only: no loss, no KL) and padding. None = every counted token was sampled (a single turn)."""
    episodes: list[Episode] | None = None
    """[N] the environment episodes, when the rows are multi-turn episodes."""
    weight_versions: list[int] | None = None
    """[N] the weight version each row was sampled with (rollout.mode=server: 0 = the first sync, +1 per
    update); None = the current weights (a colocated engine)."""
    failures: list[Failure | None] | None = None
    """[N] why each row failed (its engine request, its environment), None where it did not; None = no row
    failed. A failed row's tokens are whatever came back (maybe none): it is never scored or trained on."""

    @property
    def first_failure(self) -> Failure | None:
        """The first row's failure, in row order; None when every row succeeded."""
        return next((f for f in self.failures or () if f is not None), None)

    @property
    def model_mask(self) -> torch.Tensor:
        """[N, T] bool, True for the counted tokens the model sampled: the tokens that train."""
        if self.sampled_mask is None:
            return self.completion_mask
        return self.completion_mask & self.sampled_mask

    @property
    def num_sequences(self) -> int:
        return len(self.texts)

    @property
    def lengths(self) -> torch.Tensor:
        """[N] number of counted completion tokens."""
        return self.completion_mask.sum(-1)

    def items(self) -> list[Completion]:
        """[N] per-sample views for rewards (which know nothing of tensors)."""
        lengths = self.lengths.tolist()
        ids = [tuple(row[:n]) for row, n in zip(self.completion_ids.tolist(), lengths, strict=True)]
        episodes = self.episodes if self.episodes is not None else [None] * len(self.texts)
        return [
            Completion(t, n, r, i, e)
            for t, n, r, i, e in zip(self.texts, lengths, self.finish_reasons, ids, episodes, strict=True)
        ]

    @property
    def truncated(self) -> torch.Tensor:
        """[N] bool, True where no EOS was produced."""
        return torch.tensor([r == "length" for r in self.finish_reasons], dtype=torch.bool)

    def select(self, seqs: list[int]) -> Completions:
        """The rows ``seqs`` (indices into the N sequences), in that order."""
        index = torch.tensor(seqs, dtype=torch.long, device=self.completion_ids.device)
        return Completions(
            prompt_ids=[self.prompt_ids[i] for i in seqs],
            completion_ids=self.completion_ids[index],
            completion_mask=self.completion_mask[index],
            logprobs=self.logprobs[index],
            texts=[self.texts[i] for i in seqs],
            finish_reasons=[self.finish_reasons[i] for i in seqs],
            num_generations=self.num_generations,
            sampled_mask=None if self.sampled_mask is None else self.sampled_mask[index],
            episodes=None if self.episodes is None else [self.episodes[i] for i in seqs],
            weight_versions=None if self.weight_versions is None else [self.weight_versions[i] for i in seqs],
            failures=None if self.failures is None else [self.failures[i] for i in seqs],
        )


@dataclass
class RolloutBatch:
    """Everything the train step needs for N sequences, prompt-major (row p*G + g)."""

    prompt_ids: list[list[int]]
    """[N] prompt token ids."""
    completion_ids: torch.Tensor
    """[N, T] long."""
    completion_mask: torch.Tensor
    """[N, T] bool, True for generated tokens up to and including EOS."""
    loss_mask: torch.Tensor
    """[N, T] bool, True for tokens that count in the loss (completion_mask, less any filtered rows)."""
    advantages: torch.Tensor
    """[N, T] float; outcome supervision repeats one value along T."""
    old_logprobs: torch.Tensor | None = None
    """[N, T] log pi_old, when the policy moves before this batch is used up (mu > 1 or minibatches)."""
    ref_logprobs: torch.Tensor | None = None
    """[N, T] log pi_ref, when beta > 0."""
    old_values: torch.Tensor | None = None
    """[N, T] value estimates at rollout time (PPO)."""
    returns: torch.Tensor | None = None
    """[N, T] value targets (PPO)."""
    sampler_logprobs: torch.Tensor | None = None
    """[N, T] the sampler's log-probs of the same tokens (Completions.logprobs), for rollout correction."""

    @property
    def num_sequences(self) -> int:
        return len(self.prompt_ids)

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The sub-batch of the given row indices (host or device); the index moves to the batch's device once."""
        idx = rows.tolist()
        rows = rows.to(self.completion_ids.device)
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return RolloutBatch(
            prompt_ids=[self.prompt_ids[i] for i in idx],
            completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows],
            loss_mask=self.loss_mask[rows],
            advantages=self.advantages[rows],
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
            old_values=pick(self.old_values),
            returns=pick(self.returns),
            sampler_logprobs=pick(self.sampler_logprobs),
        )
