"""The sampler contract: prompt token ids in, a prompt-major group of completions out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from grpolab.types import Completions, Example


@runtime_checkable
class Sampler(Protocol):
    """Samples G completions for each of P prompts.

    Rows are prompt-major: row ``p * G + g`` of every [N, ...] field is sample g of prompt p.
    ``logprobs`` are the log-probs the sampler assigned to the sampled tokens (see
    ``grpolab.types``); the trainer uses them as ``old_logprobs``.

    ``examples`` [P] are the task items the prompts ask: an environment sampler
    (grpolab.rollout.multiturn) resets its environments with them; a single-turn sampler ignores them.
    """

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
        examples: Sequence[Example] | None = None,
    ) -> Completions: ...
