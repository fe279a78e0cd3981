"""Supervised fine-tuning on (prompt, answer) examples: the warm start RL begins from (``grpolab sft``).

DeepSeekMath starts RL from its Instruct (SFT) model. The loss is the mean cross-entropy over the target
tokens of a batch (``sft.completion_format`` filled with the answer, then EOS); the prompt is context
only. Log-probs come from the ``completion_logprobs`` the GRPO trainer uses, so SFT and RL see the same
inputs (left-padded prompt, right-padded target, positions from the attention mask, fp32 head).

Early stop (docs/algorithms.md 6.0): every ``sft.check_every`` steps, greedy decoding of a dev set carved
from the training examples; training stops once its accuracy reaches ``sft.target_accuracy`` and / or its
share of format errors (eval.metrics.format_errors, with eval.blind_grader) falls to
``sft.target_format_errors``, whichever are set. RL needs a policy that sometimes succeeds (or, for
``grpolab claims``, one that answers in format), and the SFT learning curve is sharp, so a step count is a
poor stopping rule.
The result is a model folder (``save_pretrained`` + tokenizer) that ``grpolab train`` loads by path.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab import jsonio
from grpolab.config import Config, ConfigError, SFTConfig, dump_config
from grpolab.data import DataError, PromptOrder, check_prompt_chars, split_eval, tokenize_prompts
from grpolab.distributed.host import give_back_before_first_step, giving_back_freed_memory
from grpolab.eval.runner import greedy_decode
from grpolab.models.loading import load_tokenizer, resolve_autocast, resolve_device
from grpolab.progress import Progress
from grpolab.rollout.engines import check_engine
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.assemble import load_model, training_examples
from grpolab.runtime.engine_spec import engine_spec
from grpolab.runtime.eval_spec import build_grader, sampler_maker
from grpolab.runtime.guards import GracefulStop
from grpolab.runtime.lock import hold_run_dir
from grpolab.runtime.logging import RunLogger
from grpolab.runtime.resumable import SFTResumable
from grpolab.runtime.resume import intact_checkpoint
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.master import backward, grads_to_clip
from grpolab.training.optim import adamw
from grpolab.types import Example

log = logging.getLogger(__name__)


@dataclass
class SFTResult:
    output_dir: Path
    """The saved model folder."""
    steps: int
    """Optimizer steps taken."""
    dev_accuracy: float | None
    """Greedy dev accuracy at the end (None without a target)."""
    reached_target: bool
    seconds: float
    stopped_by: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped it after a checkpoint; ``grpolab sft --resume`` continues."""
    dev_format_errors: float | None = None
    """Share of format errors among the greedy dev replies at the end (None without a target)."""


@dataclass(frozen=True)
class DevCheck:
    """One greedy pass over the dev set."""

    accuracy: float
    format_errors: float
    """Share of the replies that failed on format (eval.metrics.format_errors)."""


def reached(s: SFTConfig, check: DevCheck | None) -> bool:
    """Every target set (sft.target_accuracy, sft.target_format_errors) is reached; False when none is set."""
    if check is None or (s.target_accuracy is None and s.target_format_errors is None):
        return False
    return (s.target_accuracy is None or check.accuracy >= s.target_accuracy) and (
        s.target_format_errors is None or check.format_errors <= s.target_format_errors
    )


def tokenize_targets(examples: Sequence[Example], tokenizer, completion_format: str) -> list[list[int]]:
    """Token ids of each target: the formatted answer, then EOS."""
    missing = [i for i, e in enumerate(examples) if e.answer is None]
    if missing:
        raise DataError(f"SFT needs a reference answer; example {missing[0]} has none (data.answer_field)")
    texts = [completion_format.replace("{answer}", str(e.answer)) for e in examples]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [[*ids, tokenizer.eos_token_id] for ids in encoded]


def pad_targets(targets: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion_ids [n, T] right-padded, completion_mask [n, T] bool, True = a target token)."""
    width = max(len(t) for t in targets)
    ids = torch.full((len(targets), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(targets), width), dtype=torch.bool)
    for i, t in enumerate(targets):
        ids[i, : len(t)] = torch.as_tensor(t, dtype=torch.long)
        mask[i, : len(t)] = True
    return ids, mask


@giving_back_freed_memory  # grpolab.distributed.host
def sft_loss_step(
    model, optimizer, prompts, targets, *, pad_id: int, autocast_dtype, micro: int, max_grad_norm: float
):
    """One optimizer step of mean token cross-entropy over the batch; returns (loss, grad norm)."""
    device = next(model.parameters()).device
    ids, mask = pad_targets(targets, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    total_tokens = float(mask.sum())
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for rows in torch.arange(len(prompts)).split(micro):
        logprobs, _ = completion_logprobs(
            model,
            [prompts[i] for i in rows.tolist()],
            ids[rows],
            mask[rows],
            pad_id=pad_id,
            autocast_dtype=autocast_dtype,
            into_grad=True,
        )
        loss = -(logprobs * mask[rows]).sum() / total_tokens
        backward(loss, optimizer)
        loss_sum += float(loss.detach())
    params = grads_to_clip(model, optimizer)  # the fp32 master weights of a bf16 / fp16 model
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)
    give_back_before_first_step(optimizer)
    optimizer.step()
    return loss_sum, float(norm)


def dev_checker(cfg: Config, model, tok, dev: Sequence[Example]) -> Callable[[], DevCheck]:
    """A function returning the greedy accuracy and format-error share on ``dev``, graded with the configured
    rewards (and eval.blind_grader), decoded by the engine of ``rollout.engine``. Each check builds its sampler
    and closes it after: between checks the training steps get back the memory it holds (hf: a low-precision
    copy of the weights)."""

    grader = build_grader(cfg)
    prompt_ids = tokenize_prompts(dev, tok, cfg.data)

    def check() -> DevCheck:
        sampler = sampler_maker(cfg, model, tok)(0.0)  # greedy
        try:
            graded = greedy_decode(sampler, prompt_ids, dev, grader)
        finally:
            sampler.close()
        return DevCheck(sum(graded.correct) / len(dev), sum(graded.format_errors) / len(dev))

    return check


def sft(cfg: Config, *, progress: bool | None = None, resume: bool = False) -> SFTResult:
    """Fine-tune cfg.model on the training examples of cfg.data; save to cfg.sft_dir.

    SIGINT / SIGTERM: the current step finishes, a checkpoint is written to ``<sft_dir>/checkpoints``
    and the result has ``stopped_by`` set; ``resume=True`` (``grpolab sft --resume``) continues it exactly.
    """
    with GracefulStop() as stop:
        return _sft(cfg, progress=progress, resume=resume, stop=stop)


def _sft(cfg: Config, *, progress: bool | None, resume: bool, stop: GracefulStop) -> SFTResult:
    s, t0 = cfg.sft, time.perf_counter()
    if cfg.data.answer_field is None and cfg.data.source in ("jsonl", "hf"):
        raise ConfigError(
            "grpolab sft trains on the reference answers, but data.answer_field is null: set it to the row "
            "field that holds the answer (e.g. data.answer_field=answer)"
        )
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    examples = training_examples(cfg)
    if missing := [i for i, e in enumerate(examples) if e.answer is None]:  # before any model loads
        raise DataError(f"SFT needs a reference answer; example {missing[0]} has none (data.answer_field)")
    has_target = s.target_accuracy is not None or s.target_format_errors is not None
    if has_target:
        check_engine(cfg.rollout.engine, engine_spec(cfg))  # the dev checks decode with it
        build_grader(cfg)  # and grade with it: a bad reward or eval.blind_grader before any model loads
    check_prompt_chars(examples, load_tokenizer(cfg.model), cfg.data)
    with hold_run_dir(cfg.sft_dir, setting="sft.output_dir"):  # one writer, as train's run dir (runtime/lock.py)
        return _train(cfg, examples, has_target, progress=progress, resume=resume, stop=stop, t0=t0)


def _train(
    cfg: Config, examples: list[Example], has_target: bool, *, progress: bool | None, resume: bool, stop: GracefulStop,
    t0: float,
) -> SFTResult:
    """The SFT run proper, with the output folder held: load, train, check, save."""
    s, out = cfg.sft, cfg.sft_dir
    point = _resume_point(out, resume)  # before any model loads
    model, tok = load_model(cfg.model)
    amp = resolve_autocast(cfg.model, resolve_device(cfg.model))
    dev: list[Example] = []
    if has_target:
        examples, dev = split_eval(examples, s.dev_size)
    prompts = tokenize_prompts(examples, tok, cfg.data)
    targets = tokenize_targets(examples, tok, s.completion_format)
    check = dev_checker(cfg, model, tok, dev) if dev else None
    optimizer = adamw(model, lr=s.lr, weight_decay=s.weight_decay, betas=cfg.optim.betas)
    order = PromptOrder(len(examples), seed=cfg.seed, shuffle=cfg.data.shuffle)
    resumable = SFTResumable(model, tok, optimizer, order)
    start, accuracy = resumable.restore(point) if point is not None else (0, None)
    last: DevCheck | None = None  # after a resume, the next check decides
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    logger = RunLogger(out, tensorboard=False, resume_step=start if point is not None else None)
    show = cfg.log.progress if progress is None else progress
    bar = Progress(total=s.steps, start=start, enabled=show, title="SFT", may_stop_early=check is not None)
    step = start
    for step in range(start + 1, s.steps + 1):
        rows = order.next(s.batch_size)
        loss, norm = sft_loss_step(
            model,
            optimizer,
            [prompts[i] for i in rows],
            [targets[i] for i in rows],
            pad_id=tok.pad_token_id,
            autocast_dtype=amp,
            micro=cfg.train.micro_batch_rows(next(model.parameters()).device.type),
            max_grad_norm=cfg.optim.max_grad_norm,
        )
        metrics = {"sft/loss": loss, "sft/grad_norm": norm}
        if check is not None and (step % s.check_every == 0 or step == s.steps):
            last = check()
            accuracy = metrics["sft/dev_greedy_accuracy"] = last.accuracy
            metrics["sft/dev_format_errors"] = last.format_errors
        logger.log(step, metrics)
        bar.update(step, loss=loss, **({} if accuracy is None else {"dev_greedy": accuracy}))
        if reached(s, last):
            break
        if stop.requested and step < s.steps:  # SIGINT / SIGTERM: a checkpoint, then stop
            resumable.save(cfg, step, accuracy)
            bar.close()
            logger.close()
            return SFTResult(out, step, accuracy, False, time.perf_counter() - t0, stopped_by=stop.signum)
    bar.close()
    logger.close()
    done = reached(s, last)
    errors = None if last is None else last.format_errors
    if check is not None and not done:
        log.warning(
            "sft: greedy dev accuracy %.3f, format errors %s after %d steps: sft.target_accuracy=%s, "
            "sft.target_format_errors=%s not reached", accuracy or 0.0, errors, step, s.target_accuracy,
            s.target_format_errors,
        )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    shutil.rmtree(ckpt.checkpoint_root(out), ignore_errors=True)  # the model is saved: a stop's checkpoint is done
    result = SFTResult(out, step, accuracy, done, time.perf_counter() - t0, dev_format_errors=errors)
    summary = {
        "steps": step,
        "dev_greedy_accuracy": accuracy,
        "dev_format_errors": errors,
        "reached_target": done,
        "seconds": result.seconds,
    }
    (out / "sft_result.json").write_text(jsonio.dumps(summary, indent=1) + "\n")
    return result


def _resume_point(out: Path, resume: bool) -> Path | None:
    """The checkpoint a stopped SFT run left in ``out`` when resuming; a fresh run over one is refused."""
    found = ckpt.list_checkpoints(out)
    if found and not resume:
        raise ConfigError(
            f"{out} holds the checkpoint of a stopped SFT run ({found[-1][1].name}): continue it with grpolab sft "
            f"--resume, or delete {ckpt.checkpoint_root(out)} to start over"
        )
    if not resume:
        return None
    path = intact_checkpoint(out, "sft --resume")
    if path is None:
        log.info("sft --resume: no checkpoint in %s, starting from step 0", out)
    return path
