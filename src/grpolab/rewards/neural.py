"""A neural reward model: ``AutoModelForSequenceClassification`` with one output, scoring prompt + response.

The reward model has its own tokenizer, so it scores TEXT: the example's prompt followed by the decoded
completion, tokenized by the reward model's tokenizer. Re-tokenizing decoded text is unavoidable here
and correct (the reward model never saw the policy's token ids); it is never done for the policy,
whose log-probs always use the sampled ids. ``grpolab train-rm`` builds its training sequences with
the same ``rm_text`` and ``encode_texts``, so training and scoring see the same inputs.

Choices (and why):
* Right padding with the model's pad id; transformers pools the logit of the last non-pad token.
  Left padding would shift position ids for models that do not derive them from the attention mask.
* Truncation keeps the END of a text (``truncation_side="left"``): the response decides the score.
* Scoring is batched by similar length (less padding), under ``torch.no_grad``, optionally with bf16
  autocast; the head's output is read in float32.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase

from grpolab.config import ConfigError, ModelConfig
from grpolab.models.loading import (
    ModelLoadError,
    autocast_context,
    count_parameters,
    resolve_autocast,
    resolve_device,
)
from grpolab.types import Completion, Example

log = logging.getLogger(__name__)


def rm_text(prompt: str, response: str) -> str:
    """The text a reward model scores: the prompt as the policy saw it, then the response."""
    return prompt + response


def prepare_tokenizer(tok: PreTrainedTokenizerBase, source: str) -> PreTrainedTokenizerBase:
    """Right padding, left truncation, and a pad token (the EOS token when there is none)."""
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelLoadError(f"reward-model tokenizer '{source}' has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    tok.truncation_side = "left"
    return tok


def check_local_path(source: str) -> None:
    """A path that cannot be a hub id ("org/name") and does not exist is an error that says so."""
    looks_local = source.startswith(("/", ".", "~")) or source.count("/") > 1
    if looks_local and not Path(source).expanduser().exists():
        raise ModelLoadError(
            f"reward model folder {source} does not exist: train one with `grpolab train-rm` "
            "(it writes <log.output_dir>/<log.run_name>/reward_model) or fix the path"
        )


def load_rm_tokenizer(source: str) -> PreTrainedTokenizerBase:
    check_local_path(source)
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"could not load the reward model's tokenizer from '{source}': {err}. "
            "Give a folder with tokenizer files (grpolab train-rm saves one) or a reachable hub id."
        ) from err
    return prepare_tokenizer(tok, source)


def load_classifier(source: str, *, num_labels: int | None = None) -> torch.nn.Module:
    """AutoModelForSequenceClassification from ``source``; ``num_labels=1`` adds a new head to a causal LM."""
    kwargs = {} if num_labels is None else {"num_labels": num_labels}
    try:
        return AutoModelForSequenceClassification.from_pretrained(source, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"could not load a sequence-classification model from '{source}': {err}. Check the folder holds "
            "config.json and weights of an architecture with a *ForSequenceClassification class."
        ) from err


def encode_texts(tok: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, device) -> dict:
    enc = tok(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def forward_scores(model: torch.nn.Module, batch: dict, amp: torch.dtype | None) -> torch.Tensor:
    """[n] float32 scores (the single logit) of an encoded batch; gradients flow if enabled."""
    device = batch["input_ids"].device
    with autocast_context(device, amp):
        logits = model(**batch).logits
    return logits.float().squeeze(-1)


class RewardModel:
    """A batched reward: the reward model's score of ``prompt + completion`` for each completion.

    Args:
        path: reward-model folder or hub id (``grpolab train-rm`` output), one output (num_labels=1).
        batch_size: sequences per forward.
        max_length: token limit per text (the start is cut).
        autocast: "auto" | "bf16" | "none", as ``model.autocast``.
        device: "auto" | "cpu" | "cuda".
        name: the name logged as ``rewards/<name>/mean``.
        tokenizer: the folder or hub id of the tokenizer that encodes its texts; None = ``path``'s (TRL's
            ``reward_processing_classes``).
    """

    in_process = True
    """Runs in the trainer, on its device, even with a timeout (rewards.timeouts; a fork cannot use CUDA)."""

    def __init__(
        self,
        path: str,
        *,
        batch_size: int = 16,
        max_length: int = 1024,
        autocast: str = "auto",
        device: str = "auto",
        name: str = "reward_model",
        tokenizer: str | None = None,
    ) -> None:
        if batch_size < 1 or max_length < 2:
            raise ConfigError(
                f"reward_model kwargs: batch_size must be >= 1 and max_length >= 2, got {batch_size}, {max_length}"
            )
        mc = ModelConfig(name_or_path=path, device=device, autocast=autocast)
        self.name, self.path, self.batch_size, self.max_length = name, path, batch_size, max_length
        self.device = resolve_device(mc)
        self.amp = resolve_autocast(mc, self.device)
        self.tokenizer = load_rm_tokenizer(tokenizer or path)
        self.model = load_classifier(path).to(self.device).eval()
        self.model.requires_grad_(False)
        labels = self.model.config.num_labels
        if labels != 1:
            raise ModelLoadError(
                f"reward model '{path}' has {labels} outputs; a reward model has one (num_labels=1). "
                "If it is a causal LM, train a head first with `grpolab train-rm` (reward_model.base_model)."
            )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.num_parameters = count_parameters(self.model)
        log.info("reward model '%s': %d parameters on %s", path, self.num_parameters, self.device)

    @torch.no_grad()
    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """Scores of raw texts, batched by similar length, in input order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        scores = [0.0] * len(texts)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = encode_texts(self.tokenizer, [texts[i] for i in rows], self.max_length, self.device)
            for i, s in zip(rows, forward_scores(self.model, batch, self.amp).tolist(), strict=True):
                scores[i] = s
        return scores

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]:
        texts = [rm_text(e.prompt, c.text) for c, e in zip(completions, examples, strict=True)]
        return self.score_texts(texts)

    def __repr__(self) -> str:
        return f"RewardModel({self.path!r})"


class RewardModelSteps:
    """A process reward: the reward model's score of ``prompt + steps[:j+1]`` for every step j.

    Same arguments as ``RewardModel``; each step prefix is one scored text.
    """

    in_process = True
    """As RewardModel.in_process."""

    def __init__(self, path: str, **kwargs) -> None:
        kwargs.setdefault("name", "reward_model_steps")
        self.scorer = RewardModel(path, **kwargs)
        self.name = self.scorer.name
        self.num_parameters = self.scorer.num_parameters

    def __call__(self, steps: list[list[str]], examples: list[Example]) -> list[list[float]]:
        texts, counts = [], []
        for row, example in zip(steps, examples, strict=True):
            texts.extend(rm_text(example.prompt, "".join(row[: j + 1])) for j in range(len(row)))
            counts.append(len(row))
        flat = self.scorer.score_texts(texts)
        out, start = [], 0
        for n in counts:
            out.append(flat[start : start + n])
            start += n
        return out
