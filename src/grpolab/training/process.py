"""Process supervision in the trainer: steps found in token ids, scored by a process reward.

DeepSeekMath Sec. 4.1.3 (arXiv 2402.03300): a completion is a sequence of steps; step j ends at token
index(j) and gets a reward. ``grpo_process_advantages`` (grpolab.algo) turns those into token
advantages. This module finds index(j) and the step texts.

Step ends come from the completion's TOKEN IDS, never from re-tokenizing decoded text (which can give
other ids than the policy sampled):
* a delimiter that encodes to one token: a step ends at every token whose text contains the delimiter
  (BPE vocabularies merge "\\n" into tokens such as ".\\n" or "\\n\\n"; the step ends with that token);
* a delimiter of several tokens: a step ends at the last token of each (non-overlapping) occurrence of
  that id sequence.
The last counted token (EOS, or the last token of a truncated completion) always ends the final step;
when what follows the last delimiter decodes to nothing (just EOS), it joins the previous step rather
than make an empty one. Step texts are the decoded spans, delimiter included.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpolab.config import Config, ConfigError
from grpolab.rewards.process import ProcessReward, build_process_reward, score_steps
from grpolab.types import Completions, Example

log = logging.getLogger(__name__)


@dataclass
class StepRewards:
    """Step rewards of N completions, placed at their end tokens."""

    step_rewards: torch.Tensor
    """[N, T] float, a step's reward at its last token, 0 elsewhere."""
    step_end_mask: torch.Tensor
    """[N, T] bool, True at the last token of each step."""
    metrics: dict[str, float] = field(default_factory=dict)


class StepSplitter:
    """Finds step ends in completion token ids, for one delimiter and tokenizer."""

    def __init__(self, tokenizer, delimiter: str) -> None:
        ids = tokenizer(delimiter, add_special_tokens=False)["input_ids"]
        if not ids or (tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids):
            raise ConfigError(
                f"reward.process.delimiter {delimiter!r} encodes to {ids} with the policy tokenizer (empty or the "
                "unknown token): choose a delimiter the tokenizer can write"
            )
        self.tokenizer, self.delimiter, self.pattern = tokenizer, delimiter, tuple(ids)
        self.end_ids: frozenset[int] = frozenset()
        if len(ids) == 1:
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
            self.end_ids = frozenset(i for i, t in enumerate(texts) if delimiter in t) | {ids[0]}

    def ends(self, ids: Sequence[int]) -> list[int]:
        """Positions of the last token of each step in one completion's counted ids."""
        k, out = len(self.pattern), []
        for t in range(len(ids)):
            if k == 1:
                hit = ids[t] in self.end_ids
            else:
                hit = (
                    t >= k - 1
                    and tuple(ids[t - k + 1 : t + 1]) == self.pattern
                    and (not out or out[-1] <= t - k)
                )
            if hit:
                out.append(t)
        last = len(ids) - 1
        if out and out[-1] == last:
            return out
        if out and self._text(ids[out[-1] + 1 :]) == "":
            out[-1] = last
        else:
            out.append(last)
        return out

    def split(self, completion_ids: torch.Tensor, completion_mask: torch.Tensor):
        """(step_end_mask [N, T] bool, steps: [N] lists of step texts)."""
        end_mask = torch.zeros_like(completion_mask)
        steps = []
        for i, (row, n) in enumerate(
            zip(completion_ids.tolist(), completion_mask.sum(-1).tolist(), strict=True)
        ):
            ends = self.ends(row[:n]) if n else []
            end_mask[i, ends] = True
            starts = [0] + [e + 1 for e in ends[:-1]]
            steps.append([self._text(row[s : e + 1]) for s, e in zip(starts, ends, strict=True)])
        return end_mask, steps

    def split_text(self, text: str) -> list[str]:
        """A text cut after each delimiter (for the dry run only, where there are no sampled ids)."""
        parts = text.split(self.delimiter)
        out = [p + self.delimiter for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        return out or [""]

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


class ProcessSupervision:
    """Scores the steps of sampled completions with a process reward."""

    def __init__(self, splitter: StepSplitter, reward: ProcessReward, *, timeout_s: float | None) -> None:
        self.splitter, self.reward, self.timeout_s = splitter, reward, timeout_s

    def score(self, completions: Completions, examples: Sequence[Example]) -> StepRewards:
        mask = completions.completion_mask
        end_mask, steps = self.splitter.split(completions.completion_ids, mask)
        values = score_steps(self.reward, steps, examples, timeout_s=self.timeout_s)
        rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        flat = torch.tensor([v for row in values for v in row], dtype=torch.float32, device=mask.device)
        rewards[end_mask] = flat  # row-major order of end_mask matches the step order of each row
        counts = [len(row) for row in steps]
        metrics = {
            "train/step_reward_mean": float(flat.mean()),
            "rollout/steps_mean": sum(counts) / len(counts),
        }
        return StepRewards(step_rewards=rewards, step_end_mask=end_mask, metrics=metrics)

    def dry_run(self, examples: Sequence[Example]) -> None:
        """Score each example's reference answer, cut at the delimiter, one at a time: fail before training."""
        for e in examples:
            score_steps(
                self.reward, [self.splitter.split_text(e.answer or "")], [e], timeout_s=self.timeout_s
            )


def build_process_supervision(
    cfg: Config, tokenizer, examples: Sequence[Example]
) -> ProcessSupervision | None:
    """The process scorer for algo.supervision=process (dry-run on a few examples), else None."""
    if cfg.algo.supervision != "process":
        return None
    spec = cfg.reward.process
    splitter = StepSplitter(tokenizer, spec.delimiter)
    process = ProcessSupervision(
        splitter, build_process_reward(spec.name, spec.kwargs), timeout_s=cfg.reward.timeout_s
    )
    process.dry_run(list(examples[: cfg.reward.dry_run_examples]))
    log.info("process supervision: reward '%s', steps end at %r", process.reward.name, spec.delimiter)
    return process
