"""Pass@K / Maj@K of one or more models on the held-out prompts (``grpolab eval``; DeepSeekMath Fig. 7).

For each model folder: sample n completions per held-out prompt with the engine of ``rollout.engine``
(built as training builds it, runtime/assemble.py; hf: batched, KV cache, bf16 autocast when configured), grade them with the configured rewards (correct = total reward above
``eval.correct_threshold``), and compute unbiased pass@K and maj@K for K = 1, 2, 4, ... up to n.
Every model draws from the same seeded random stream, so two models are compared on equal footing.
Nothing here reads the config: runtime/eval_spec.py builds the ``Grader``, the ``EvalSpec`` and the
function that builds a model's sampler (``MakeSampler``) from it.

Where this departs from a plain definition, and why:
* The vote of a sample is its extracted final answer: the extraction of the first reward that
  declares one (``extract_answer``, e.g. exact_match with ``extract: last_number``), else the
  ``<answer>`` tag content, else the last ``\\boxed{}``, else the stripped text after the reasoning
  (the extraction math_accuracy grades). If
  the rewards grade the same answer string both correct and wrong (a format or length term decides),
  the wrong ones vote for a separate key, so votes never mix grades and maj@1 equals pass@1.
* With ``eval.blind_grader`` (e.g. answer_anywhere) every sample is graded a second time, blind to format, and
  Pass@K / Maj@K are computed under both gradings. Under the blind one a sample it grades right votes for the
  reference answer (it was there, however written), any other for its extracted answer (metrics.blind_vote_keys).
  A format error is a sample wrong by the rewards and right by the blind grader, or with no answer extracted
  (metrics.format_errors); their share is reported for the sampled and the greedy replies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpolab.config import ConfigError
from grpolab.distributed import dist, sequence
from grpolab.eval.metrics import blind_vote_keys, curve_means, format_errors, pass_maj_per_problem
from grpolab.eval.results import ModelEval
from grpolab.progress import Progress
from grpolab.rewards import WeightedReward, build_reward, score_batch
from grpolab.rewards.math_answer import prediction_text
from grpolab.rollout.base import NonFiniteLogits, Sampler, without_failures
from grpolab.types import Completions, Example

log = logging.getLogger(__name__)

NUM_SAMPLE_PROMPTS = 4
"""Prompts whose completions are kept in the eval JSON (and shown in the report)."""

MakeSampler = Callable[[float], Sampler]
"""temperature -> a sampler of rollout.engine over the model evaluated (runtime/eval_spec.py ``sampler_maker``);
the caller closes it."""


@dataclass(frozen=True)
class EvalSpec:
    """How one model is evaluated (``evaluate_model``): the eval section, read once (runtime/eval_spec.py)."""

    num_samples: int
    """eval.num_samples: n, the completions sampled per prompt."""
    ks: tuple[int, ...]
    """The K of pass@K and maj@K: eval.ks, or 1, 2, 4, ... up to n (``default_ks``)."""
    temperature: float
    """eval.temperature: the sampling temperature of the n completions."""
    prompts_per_batch: int
    """eval.prompts_per_batch: prompts sampled together."""
    greedy: bool
    """eval.greedy: also decode each prompt greedily and report its accuracy."""
    seed: int
    """The run's seed: data-parallel rank r samples from a generator seeded seed + r (a sequence-parallel group
    is one data-parallel rank: its first rank samples for it, eval/runner.py ``evaluate_model``)."""
    blind_grader: str | None = None
    """eval.blind_grader's name, recorded in the result (the grader itself is the ``Grader``'s)."""


@dataclass(frozen=True)
class Grader:
    """Turns completions into correct / wrong with the configured rewards."""

    rewards: Sequence[WeightedReward]
    threshold: float
    timeout_s: float | None
    gold: Sequence[WeightedReward] = ()
    """reward.gold: scored on the same samples and reported (ModelEval.gold_mean), never grading them."""
    blind: WeightedReward | None = None
    """eval.blind_grader: the second, format-blind grading (a sample is right when it scores above 0.5)."""

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

    def grade_all(self, completions: Completions, examples: Sequence[Example]) -> Graded:
        """Both gradings and the extracted answers of prompt-major completions of ``examples``."""
        correct, totals = self.grade(completions, examples)
        blind = None
        if self.blind is not None:
            repeated = [e for e in examples for _ in range(completions.num_generations)]
            scores = score_batch([self.blind], completions.items(), repeated, timeout_s=self.timeout_s).total
            blind = [t is not None and t > 0.5 for t in scores]
        texts = list(completions.texts)
        return Graded(texts, correct, totals, blind, [self.answer(t) for t in texts])

    def answer(self, text: str) -> str:
        """The final answer a sample votes for (module docstring)."""
        for wr in self.rewards:
            extract = getattr(wr.reward, "extract_answer", None)
            if extract is not None:
                return (extract(text) or "").strip()
        return prediction_text(text)[0].strip()


def blind_grader(name: str | None) -> WeightedReward | None:
    """eval.blind_grader (``name``) built (None when null); a bad name is one line naming the key."""
    if name is None:
        return None
    try:
        return build_reward(name)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"eval.blind_grader={name!r}: {err}") from err


@dataclass(frozen=True)
class Graded:
    """Completions graded, [N] each, prompt-major."""

    texts: list[str]
    correct: list[bool]
    """By the rewards (total above eval.correct_threshold)."""
    totals: list[float]
    blind: list[bool] | None
    """By eval.blind_grader; None without one."""
    answers: list[str]
    """The extracted answer each sample votes for ("" when none)."""

    @classmethod
    def joined(cls, parts: Sequence[Graded]) -> Graded:
        """Batches graded one after another, as one."""

        def cat(name: str) -> list:
            return [x for part in parts for x in getattr(part, name)]

        blind = None if any(part.blind is None for part in parts) else cat("blind")
        return cls(cat("texts"), cat("correct"), cat("totals"), blind, cat("answers"))

    @property
    def format_errors(self) -> list[bool]:
        return format_errors(self.correct, self.answers, self.blind)

    def votes(self, examples: Sequence[Example], n: int) -> tuple[list[tuple], list[tuple]]:
        """Per prompt, (vote keys [n], correct [n]) by the rewards and by the blind grader ([] without one)."""
        strict, blind = [], []
        for p, example in enumerate(examples):
            rows = slice(p * n, (p + 1) * n)
            strict.append((vote_keys(self.answers[rows], self.correct[rows], _same), self.correct[rows]))
            if self.blind is not None:
                reference = str(example.answer).strip()
                blind.append((blind_vote_keys(self.answers[rows], self.blind[rows], reference), self.blind[rows]))
        return strict, blind


def _same(text: str) -> str:
    return text


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


GREEDY_BATCH = 256
"""Prompts decoded greedily together."""


def greedy_decode(sampler, prompt_ids, examples, grader: Grader, *, batch: int = GREEDY_BATCH) -> Graded:
    """The greedy completion of every prompt ([P] each), by a sampler at temperature 0, graded."""
    parts = []
    for start in range(0, len(prompt_ids), batch):
        comps = without_failures(sampler.sample(prompt_ids[start : start + batch], num_generations=1), "greedy eval")
        parts.append(grader.grade_all(comps, examples[start : start + batch]))
    return Graded.joined(parts)


def evaluate_model(
    model, make_sampler: MakeSampler, prompt_ids, examples, grader: Grader, spec: EvalSpec, *, label: str, path: str,
    progress: bool,
) -> ModelEval:
    """Pass@K and Maj@K (under the rewards and, with one, eval.blind_grader), greedy accuracy and mean length
    of one loaded model, sampled by the samplers ``make_sampler`` builds over it.

    Under torchrun each data-parallel rank samples and grades its share of the prompts (``dist.my_range``) and
    the shares are gathered over the data-parallel ranks. Under sequence parallelism (train.sequence_parallel)
    the N ranks of a group are one data-parallel rank: the group's first rank samples and grades its share,
    the others only take part in the sampler's collectives (``Sampler.take_part``: FSDP2's gathers) and get
    its results (distributed/sequence.py ``shared``), so the share is evaluated once, as one process would."""
    t0 = time.perf_counter()
    n, ks = spec.num_samples, list(spec.ks)
    mine = dist.my_range(len(examples))
    device = next(model.parameters()).device
    sampled = None
    if sequence.samples():
        sampled = _sample_graded(make_sampler, device, prompt_ids, examples, grader, spec, mine, label, path, progress)
    else:
        _take_part(make_sampler, spec.temperature, len(range(mine.start, mine.stop, spec.prompts_per_batch)))
    graded, lengths, gold = sequence.shared(sampled)
    strict, blind = graded.votes(examples[mine.start : mine.stop], n)
    per_problem, blind_problem, texts, lengths, totals, errors = dist.gather_lists(
        strict, blind, graded.texts, lengths, graded.totals, graded.format_errors
    )
    names = [wr.name for wr in grader.gold] + (["gold_total"] if grader.gold else [])  # the same on every rank
    gold = dict(zip(names, dist.gather_lists(*[gold.get(name, []) for name in names]), strict=True))
    values = pass_maj_per_problem(per_problem, ks)
    curves = curve_means(values)
    blind_values = pass_maj_per_problem(blind_problem, ks) if grader.blind is not None else {}
    blind_curves = curve_means(blind_values) if blind_values else {"pass": {}, "maj": {}}
    greedy = _greedy(make_sampler, prompt_ids[mine.start : mine.stop], examples[mine.start : mine.stop], grader) if spec.greedy else None
    if greedy is not None:
        greedy_ok, greedy_texts, greedy_blind, greedy_errors = dist.gather_lists(
            greedy.correct, greedy.texts, greedy.blind or [], greedy.format_errors
        )
    return ModelEval(
        label=label,
        path=path,
        num_prompts=len(examples),
        num_samples=n,
        temperature=spec.temperature,
        pass_at=curves["pass"],
        maj_at=curves["maj"],
        greedy_accuracy=None if greedy is None else _mean(greedy_ok),
        mean_length=_mean(lengths),
        reward_mean=_mean(totals),
        seconds=time.perf_counter() - t0,
        samples=_sample_records(examples, texts, [c for _, c in per_problem], None if greedy is None else greedy_texts, n),
        gold_mean={name: _mean(scores) for name, scores in gold.items()},
        per_prompt=values,
        blind_grader=spec.blind_grader,
        blind_pass_at=blind_curves["pass"],
        blind_maj_at=blind_curves["maj"],
        blind_per_prompt=blind_values,
        format_error_share=_mean(errors),
        greedy_blind_accuracy=_mean(greedy_blind) if greedy is not None and grader.blind is not None else None,
        greedy_format_error_share=None if greedy is None else _mean(greedy_errors),
    )


def _greedy(make_sampler: MakeSampler, prompt_ids, examples, grader: Grader) -> Graded:
    """This rank's share decoded greedily and graded: by the group's first rank under sequence parallelism,
    handed to the others (``evaluate_model``)."""
    graded = None
    if sequence.samples():
        sampler = make_sampler(0.0)
        graded = greedy_decode(sampler, prompt_ids, examples, grader)
        sampler.close()
    else:
        _take_part(make_sampler, 0.0, len(range(0, len(prompt_ids), GREEDY_BATCH)))
    return sequence.shared(graded)


def _take_part(make_sampler: MakeSampler, temperature: float, calls: int) -> None:
    """A rank that does not sample: the sampler's collectives of ``calls`` samples, none of the sampling."""
    sampler = make_sampler(temperature)
    for _ in range(calls):
        sampler.take_part()
    sampler.close()


def _sample_graded(
    make_sampler: MakeSampler, device: torch.device, prompt_ids, examples, grader: Grader, spec: EvalSpec, mine: range,
    label: str, path: str, progress: bool,
) -> tuple[Graded, list[int], dict[str, list]]:
    """This rank's prompts (``mine``) sampled eval.num_samples times each and graded: (graded, [N] lengths,
    gold reward name -> [N] scores)."""
    n, chunk = spec.num_samples, spec.prompts_per_batch
    sampler = make_sampler(spec.temperature)
    # seeded by the data-parallel rank: a D x N sequence-parallel job samples what D processes do
    generator = torch.Generator(device=device).manual_seed(spec.seed + dist.data_world().rank)
    parts, lengths, gold = [], [], {}
    log.info("eval %s: rank %d samples prompts %d..%d of %d", label, dist.world().rank, mine.start, mine.stop - 1, len(examples))
    bar = Progress(total=len(examples), enabled=progress and dist.is_main(), title=f"eval {label}", unit="prompt")
    for start in range(mine.start, mine.stop, chunk):
        stop = min(start + chunk, mine.stop)
        try:
            comps = without_failures(sampler.sample(prompt_ids[start:stop], num_generations=n, generator=generator), f"eval of {label}")
        except NonFiniteLogits as err:  # the model and what is evaluated, on one line
            raise NonFiniteLogits(f"eval of {label} ({path}): {err}; no eval.json entry was written for it") from err
        parts.append(grader.grade_all(comps, examples[start:stop]))
        lengths += comps.lengths.tolist()
        for name, values in grader.gold_scores(comps, examples[start:stop]).items():
            gold.setdefault(name, []).extend(values)
        bar.update(stop)
    bar.close()
    sampler.close()
    return Graded.joined(parts), lengths, gold


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
