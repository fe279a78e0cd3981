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

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpolab.errors import ConfigError
from grpolab.rewards.step_rewards import ProcessReward, score_steps
from grpolab.types import Completions, Example


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

    def score(
        self, completions: Completions, examples: Sequence[Example], totals=None, valid=None
    ) -> StepRewards:
        """Step rewards from the process reward (``totals`` / ``valid``, the outcome rewards: unused)."""
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


class TurnSupervision:
    """Process supervision where the steps are an episode's model turns (env.name set).

    Step k ends at the last token of model turn k (``Episode.turn_ends``) and its reward is
    ``w_env * r_k``: the environment's reward for that turn (0 when it gave none), times the weight of the
    ``env`` reward function (0 when reward.functions does not list it). The last turn also gets what the
    other reward functions add to the episode's total, so an episode's step rewards sum to its outcome
    reward. An episode without a valid total reward has no steps: its tokens get advantage 0 and it does
    not count in its group's normalisation.
    """

    def __init__(self, env_weight: float) -> None:
        self.env_weight = env_weight

    def score(
        self, completions: Completions, examples: Sequence[Example], totals: torch.Tensor, valid: torch.Tensor
    ) -> StepRewards:
        """``totals`` / ``valid``: [P, G] outcome rewards (the step's weighted reward sum) and their validity."""
        if completions.episodes is None:
            raise ValueError("turn supervision needs environment episodes (a MultiTurnSampler's completions)")
        mask = completions.completion_mask
        rewards = torch.zeros(mask.shape, dtype=torch.float32)
        ends = torch.zeros(mask.shape, dtype=torch.bool)
        for i, (ep, total, ok) in enumerate(
            zip(completions.episodes, totals.flatten().tolist(), valid.flatten().tolist(), strict=True)
        ):
            if not ok or not ep.turn_ends:
                continue
            step = [self.env_weight * (r or 0.0) for r in ep.turn_rewards]
            step[-1] += total - sum(step)  # the other reward functions' part of the total
            ends[i, list(ep.turn_ends)] = True
            rewards[i, list(ep.turn_ends)] = torch.tensor(step)
        counts = ends.sum(-1).float()
        metrics = {
            "train/step_reward_mean": float(rewards[ends].mean()) if ends.any() else 0.0,
            "rollout/steps_mean": float(counts.mean()),
        }
        return StepRewards(rewards.to(mask.device), ends.to(mask.device), metrics)
