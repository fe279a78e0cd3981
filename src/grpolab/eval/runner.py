"""Pass@K / Maj@K of one or more models on the held-out prompts (``grpolab eval``; DeepSeekMath Fig. 7).

For each model folder: sample n completions per held-out prompt with the engine of ``rollout.engine``
(built as training builds it, runtime/assemble.py; hf: batched, KV cache, bf16 autocast when configured), grade them with the configured rewards (correct = total reward above
``eval.correct_threshold``), and compute unbiased pass@K and maj@K for K = 1, 2, 4, ... up to n.
Every model draws from the same seeded random stream, so two models are compared on equal footing.

Where this departs from a plain definition, and why:
* The vote of a sample is its extracted final answer: the extraction of the first reward that
  declares one (``extract_answer``, e.g. exact_match with ``extract: last_number``), else the
  ``<answer>`` tag content, else the last ``\\boxed{}``, else the stripped text after the reasoning
  (the extraction math_accuracy grades). If
  the rewards grade the same answer string both correct and wrong (a format or length term decides),
  the wrong ones vote for a separate key, so votes never mix grades and maj@1 equals pass@1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpolab.config import Config
from grpolab.distributed import dist
from grpolab.eval.metrics import curve_means, pass_maj_per_problem
from grpolab.eval.results import ModelEval
from grpolab.models.loading import resolve_autocast
from grpolab.progress import Progress
from grpolab.rewards import WeightedReward, build_rewards, score_batch
from grpolab.rewards.math_answer import prediction_text
from grpolab.rollout.base import NonFiniteLogits, without_failures
from grpolab.rollout.engines import build_sampler
from grpolab.training.gold import build_gold_rewards
from grpolab.types import Completions, Example

log = logging.getLogger(__name__)

NUM_SAMPLE_PROMPTS = 4
"""Prompts whose completions are kept in the eval JSON (and shown in the report)."""


@dataclass(frozen=True)
class Grader:
    """Turns completions into correct / wrong with the configured rewards."""

    rewards: Sequence[WeightedReward]
    threshold: float
    timeout_s: float | None
    gold: Sequence[WeightedReward] = ()
    """reward.gold: scored on the same samples and reported (ModelEval.gold_mean), never grading them."""

    @classmethod
    def from_config(cls, cfg: Config) -> Grader:
        rewards = build_rewards(cfg)  # the same checks and messages as train
        return cls(rewards, cfg.eval.correct_threshold, cfg.reward.timeout_s, build_gold_rewards(cfg))

    def grade(self, completions: Completions, examples: Sequence[Example]) -> tuple[list[bool], list[float]]:
        """([N] correct, [N] total reward, None read as 0) for prompt-major completions of ``examples``."""
        g = completions.num_generations
        repeated = [e for e in examples for _ in range(g)]
        totals = score_batch(self.rewards, completions.items(), repeated, timeout_s=self.timeout_s).total
        correct = [t is not None and t > self.threshold for t in totals]
        return correct, [0.0 if t is None else float(t) for t in totals]

    def gold_scores(self, completions: Completions, examples: Sequence[Example]) -> dict[str, list]:
        """Per gold reward name and "gold_total", [N] values (None = not applicable); {} without reward.gold."""
        if not self.gold:
            return {}
        repeated = [e for e in examples for _ in range(completions.num_generations)]
        scores = score_batch(self.gold, completions.items(), repeated, timeout_s=self.timeout_s)
        return {**scores.components, "gold_total": scores.total}

    def answer(self, text: str) -> str:
        """The final answer a sample votes for (module docstring)."""
        for wr in self.rewards:
            extract = getattr(wr.reward, "extract_answer", None)
            if extract is not None:
                return (extract(text) or "").strip()
        return prediction_text(text)[0].strip()


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself when it is not a power of two."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def vote_keys(
    texts: Sequence[str], correct: Sequence[bool], answer: Callable[[str], str] | None = None
) -> list[str]:
    """[n] majority-vote keys: the extracted answer (``answer``, default the text math_accuracy grades),
    split by grade when the grades disagree."""
    answers = [answer(t) if answer else prediction_text(t)[0].strip() for t in texts]
    graded: dict[str, set[bool]] = {}
    for a, c in zip(answers, correct, strict=True):
        graded.setdefault(a, set()).add(bool(c))
    return [
        a + " [graded wrong]" if len(graded[a]) > 1 and not c else a
        for a, c in zip(answers, correct, strict=True)
    ]


def greedy_sampler(cfg: Config, model, tok):
    """The sampler of ``rollout.engine`` at temperature 0 (greedy), over ``model``."""
    amp = resolve_autocast(cfg.model, next(model.parameters()).device)
    return build_sampler(cfg, policy=model, tokenizer=tok, autocast_dtype=amp, temperature=0.0)


def greedy_decode(
    sampler, prompt_ids, examples, grader: Grader, *, batch: int = 256
) -> tuple[list[bool], list[str]]:
    """([P] correct, [P] text) of the greedy completion of every prompt, by a ``greedy_sampler``."""
    correct: list[bool] = []
    texts: list[str] = []
    for start in range(0, len(prompt_ids), batch):
        comps = without_failures(sampler.sample(prompt_ids[start : start + batch], num_generations=1), "greedy eval")
        c, _ = grader.grade(comps, examples[start : start + batch])
        correct += c
        texts += comps.texts
    return correct, texts


def evaluate_model(
    model, tok, prompt_ids, examples, grader: Grader, cfg: Config, *, label: str, path: str, progress: bool
) -> ModelEval:
    """Pass@K, Maj@K, greedy accuracy and mean length of one loaded model."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    amp = resolve_autocast(cfg.model, device)
    n, chunk = cfg.eval.num_samples, cfg.eval.prompts_per_batch
    sampler = build_sampler(cfg, policy=model, tokenizer=tok, autocast_dtype=amp, temperature=cfg.eval.temperature)
    generator = torch.Generator(device=device).manual_seed(cfg.seed + dist.world().rank)
    per_problem, texts, lengths, totals = [], [], [], []
    gold: dict[str, list] = {}
    mine = dist.my_range(len(examples))  # under torchrun each rank samples its share of the prompts
    log.info("eval %s: rank %d samples prompts %d..%d of %d", label, dist.world().rank, mine.start, mine.stop - 1, len(examples))
    bar = Progress(total=len(examples), enabled=progress and dist.is_main(), title=f"eval {label}", unit="prompt")
    for start in range(mine.start, mine.stop, chunk):
        stop = min(start + chunk, mine.stop)
        try:
            comps = without_failures(sampler.sample(prompt_ids[start:stop], num_generations=n, generator=generator), f"eval of {label}")
        except NonFiniteLogits as err:  # the model and what is evaluated, on one line
            raise NonFiniteLogits(f"eval of {label} ({path}): {err}; no eval.json entry was written for it") from err
        correct, total = grader.grade(comps, examples[start:stop])
        for p in range(len(comps.texts) // n):
            rows = slice(p * n, (p + 1) * n)
            per_problem.append((vote_keys(comps.texts[rows], correct[rows], grader.answer), correct[rows]))
        texts += comps.texts
        lengths += comps.lengths.tolist()
        totals += total
        for name, values in grader.gold_scores(comps, examples[start:stop]).items():
            gold.setdefault(name, []).extend(values)
        bar.update(stop)
    bar.close()
    sampler.close()
    per_problem, texts, lengths, totals = dist.gather_lists(per_problem, texts, lengths, totals)
    names = [wr.name for wr in grader.gold] + (["gold_total"] if grader.gold else [])  # the same on every rank
    gold = dict(zip(names, dist.gather_lists(*[gold.get(name, []) for name in names]), strict=True))
    values = pass_maj_per_problem(per_problem, cfg.eval.ks or default_ks(n))
    curves = curve_means(values)
    greedy_ok, greedy_texts = None, None
    if cfg.eval.greedy:
        greedy = greedy_sampler(cfg, model, tok)
        greedy_ok, greedy_texts = greedy_decode(
            greedy, prompt_ids[mine.start : mine.stop], examples[mine.start : mine.stop], grader
        )
        greedy.close()
        greedy_ok, greedy_texts = dist.gather_lists(greedy_ok, greedy_texts)
    return ModelEval(
        label=label,
        path=path,
        num_prompts=len(examples),
        num_samples=n,
        temperature=cfg.eval.temperature,
        pass_at=curves["pass"],
        maj_at=curves["maj"],
        greedy_accuracy=None if greedy_ok is None else sum(greedy_ok) / len(greedy_ok),
        mean_length=sum(lengths) / len(lengths),
        reward_mean=sum(totals) / len(totals),
        seconds=time.perf_counter() - t0,
        samples=_sample_records(examples, texts, [c for _, c in per_problem], greedy_texts, n),
        gold_mean={name: _mean(scores) for name, scores in gold.items()},
        per_prompt=values,
    )


def _sample_records(examples, texts, correct, greedy_texts, n: int, shown: int = 8) -> list[dict]:
    """The first NUM_SAMPLE_PROMPTS prompts with their greedy and first ``shown`` sampled completions."""
    return [
        {
            "prompt": examples[p].prompt,
            "answer": examples[p].answer,
            "greedy": None if greedy_texts is None else greedy_texts[p],
            "sampled": texts[p * n : p * n + min(n, shown)],
            "sampled_correct": correct[p][: min(n, shown)],
        }
        for p in range(min(NUM_SAMPLE_PROMPTS, len(examples)))
    ]


def _mean(values: Sequence[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")
