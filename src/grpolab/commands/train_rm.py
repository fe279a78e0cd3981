"""``grpolab train-rm``: a neural reward model from pairwise comparisons, with the Bradley-Terry loss.

    loss = -log sigmoid( r(prompt, chosen) - r(prompt, rejected) )

(Bradley and Terry 1952; the reward-model loss of InstructGPT, arXiv 2203.02155, eq. 1, with one
comparison per row instead of all K-choose-2 of a ranking). The model is an
``AutoModelForSequenceClassification`` with one output; a causal LM as ``base_model`` gets a new head.
The saved folder (model, tokenizer, metrics.jsonl, eval.json) is what the ``reward_model`` reward loads.

Choices (and why):
* The held-out set is split by PROMPT: every pair of a held-out prompt is held out. Split by pair, a
  held-out pair usually shares its chosen answer with training pairs, and accuracy would measure recall.
* ``eval/pair_accuracy`` counts a pair as right only when r_chosen > r_rejected (a tie is wrong), and it
  is reported before training too (epoch 0), so the gain over chance is visible.
* The folder is written under a temporary name and renamed into place: an interrupted save leaves the
  previous model intact (``output_dir`` may equal ``base_model`` for continued training). The folder is
  held (its lock file, runtime/lock.py) from the start, so a second train-rm into it stops with one line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab import jsonio
from grpolab.algo.preference import bradley_terry_loss
from grpolab.config import Config, ConfigError, ModelConfig
from grpolab.data import DataError
from grpolab.models.loading import count_parameters, resolve_autocast, resolve_device
from grpolab.rewards.neural import encode_texts, forward_scores, load_classifier, load_rm_tokenizer, rm_text
from grpolab.runtime.lock import LOCK_NAME, hold_run_dir
from grpolab.training.optim import adamw

log = logging.getLogger(__name__)

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: for ``prompt``, ``chosen`` is better than ``rejected``."""

    prompt: str
    chosen: str
    rejected: str


@dataclass
class RewardModelResult:
    output_dir: Path
    """The saved model folder (give it as ``reward.functions: [{name: reward_model, kwargs: {path: ...}}]``)."""
    metrics: dict[str, float]
    """Final metrics: eval/pair_accuracy, eval/margin_mean, train/loss, ..."""
    history: list[dict[str, float]]
    """One row per epoch, epoch 0 = before training."""


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Rows {"prompt", "chosen", "rejected"} of a JSONL file; a bad row is an error naming its line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"reward_model.data_path: {path} does not exist or is not a file")
    pairs = []
    for lineno, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{path}:{lineno} is not UTF-8 text (column {err.start + 1}); save it as UTF-8") from err
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno} is not valid JSON: {err}") from err
        missing = [k for k in PAIR_FIELDS if not isinstance(row, dict) or not isinstance(row.get(k), str)]
        if missing:
            raise DataError(
                f"{path}:{lineno} needs string fields {', '.join(missing)} (a comparison is prompt, chosen, rejected)"
            )
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    if not pairs:
        raise DataError(f"{path} holds no comparisons")
    return pairs


def write_pairs(path: str | Path, pairs: Sequence[PreferencePair]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as fh:
        for p in pairs:
            fh.write(jsonio.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n")


def split_pairs(
    pairs: Sequence[PreferencePair], eval_fraction: float, seed: int
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, eval): a seeded ``eval_fraction`` of the distinct prompts, with all their pairs, is held out."""
    prompts = list(dict.fromkeys(p.prompt for p in pairs))
    n_eval = 0 if eval_fraction == 0 else max(1, round(eval_fraction * len(prompts)))
    if n_eval >= len(prompts) and n_eval:
        raise ConfigError(
            f"reward_model.eval_fraction={eval_fraction} holds out every one of {len(prompts)} prompts"
        )
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {prompts[i] for i in order[:n_eval]}
    return [p for p in pairs if p.prompt not in held], [p for p in pairs if p.prompt in held]


def pair_scores(model, tok, pairs: Sequence[PreferencePair], max_length: int, device, amp) -> torch.Tensor:
    """[n, 2] scores (chosen, rejected); one forward over the 2n texts."""
    texts = [rm_text(p.prompt, p.chosen) for p in pairs] + [rm_text(p.prompt, p.rejected) for p in pairs]
    scores = forward_scores(model, encode_texts(tok, texts, max_length, device), amp)
    return torch.stack(scores.chunk(2), dim=1)


@torch.no_grad()
def evaluate_pairs(
    model, tok, pairs: Sequence[PreferencePair], *, max_length: int, batch_size: int, device, amp
):
    """{"pair_accuracy", "margin_mean", "loss"} over ``pairs`` (NaN when there are none)."""
    if not pairs:
        return {"pair_accuracy": math.nan, "margin_mean": math.nan, "loss": math.nan}
    model.eval()
    scores = torch.cat(
        [
            pair_scores(model, tok, pairs[i : i + batch_size], max_length, device, amp)
            for i in range(0, len(pairs), batch_size)
        ]
    )
    margin = scores[:, 0] - scores[:, 1]
    return {
        "pair_accuracy": float((margin > 0).float().mean()),
        "margin_mean": float(margin.mean()),
        "loss": float(bradley_terry_loss(scores)),
    }


def train_reward_model(cfg: Config) -> RewardModelResult:
    """Train ``cfg.reward_model.base_model`` on ``data_path`` comparisons; save to ``cfg.reward_model_dir``,
    held by this run alone while it runs (runtime/lock.py, as train's run directory)."""
    rm = cfg.reward_model
    if not rm.base_model or not rm.data_path:
        raise ConfigError("grpolab train-rm needs reward_model.base_model and reward_model.data_path")
    train_pairs, eval_pairs = split_pairs(read_pairs(rm.data_path), rm.eval_fraction, cfg.seed)
    with hold_run_dir(cfg.reward_model_dir, setting="reward_model.output_dir"):
        return _train(cfg, train_pairs, eval_pairs)


def _train(cfg: Config, train_pairs: list[PreferencePair], eval_pairs: list[PreferencePair]) -> RewardModelResult:
    rm = cfg.reward_model
    torch.manual_seed(cfg.seed)
    mc = ModelConfig(name_or_path=rm.base_model, device=rm.device, autocast=rm.autocast)
    device = resolve_device(mc)
    amp = resolve_autocast(mc, device)
    tok = load_rm_tokenizer(rm.tokenizer or rm.base_model)
    model = load_classifier(rm.base_model, num_labels=1).to(device)
    model.config.pad_token_id = tok.pad_token_id
    log.info(
        "train-rm: %d train / %d held-out comparisons, %d parameters",
        len(train_pairs),
        len(eval_pairs),
        count_parameters(model),
    )
    optimizer = adamw(model, lr=rm.lr, weight_decay=rm.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    evaluate = lambda: evaluate_pairs(  # noqa: E731
        model, tok, eval_pairs, max_length=rm.max_length, batch_size=rm.batch_size, device=device, amp=amp
    )
    history = [{"epoch": 0, **{f"eval/{k}": v for k, v in evaluate().items()}}]
    for epoch in range(1, rm.epochs + 1):
        train_stats = _train_epoch(model, tok, optimizer, train_pairs, rm, gen, device, amp)
        history.append({"epoch": epoch, **train_stats, **{f"eval/{k}": v for k, v in evaluate().items()}})
        log.info("train-rm epoch %d: %s", epoch, json.dumps(history[-1]))
    out = cfg.reward_model_dir
    _save(out, model, tok, history)
    return RewardModelResult(output_dir=out, metrics=history[-1], history=history)


def _train_epoch(model, tok, optimizer, pairs, rm, gen, device, amp) -> dict[str, float]:
    model.train()
    order = torch.randperm(len(pairs), generator=gen).tolist()
    losses, correct = [], 0
    for start in range(0, len(order), rm.batch_size):
        chunk = [pairs[i] for i in order[start : start + rm.batch_size]]
        scores = pair_scores(model, tok, chunk, rm.max_length, device, amp)
        loss = bradley_terry_loss(scores)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rm.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), rm.max_grad_norm)
        optimizer.step()
        losses.append(loss.item() * len(chunk))
        correct += int((scores[:, 0] > scores[:, 1]).sum())
    n = max(len(pairs), 1)
    return {"train/loss": sum(losses) / n, "train/pair_accuracy": correct / n}


def _save(out: Path, model, tok, history: list[dict[str, float]]) -> None:
    tmp = out.with_name(f".tmp_{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    clean = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        for row in history
    ]
    (tmp / "metrics.jsonl").write_text("".join(jsonio.dumps(row) + "\n" for row in clean))
    (tmp / "eval.json").write_text(jsonio.dumps(clean[-1], indent=2) + "\n")
    # The lock file this run holds moves with the new folder: a rename keeps the locked file, so the folder
    # stays held until the run ends.
    os.replace(out / LOCK_NAME, tmp / LOCK_NAME)
    shutil.rmtree(out)
    os.replace(tmp, out)
