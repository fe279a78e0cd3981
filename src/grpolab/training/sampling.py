"""One step's groups: draw prompts, sample G completions each, score them, and, with DAPO's dynamic
sampling, keep only the groups that carry a learning signal. What it reads is a ``SamplingSpec``
(training/spec.py), built once from the config (runtime/step_spec.py).

DAPO (Yu et al., arXiv 2503.14476, Sec. 3.2 and Eq. 11's constraint ``0 < |{o_i correct}| < G``): a group
whose rewards are all equal has advantage 0 and gives no policy gradient, so it is dropped and more
prompts are sampled until the step has ``train.prompts_per_step`` groups or ``algo.max_sampling_rounds``
rounds are spent. Each round draws ``prompts_per_step`` fresh prompts (verl's ``gen_batch``).

Where the code departs from the paper, and why:
* "All equal" is over the group's applicable rewards (any reward, not only accuracy), as verl's
  ``filter_groups`` with a metric; a group with fewer than two applicable rewards is dropped too.
* Groups kept beyond the prompt count are discarded, as verl does, so the step's size is fixed when the
  task allows. When the rounds are spent first, the step trains on the groups it kept; when it kept
  none, it trains on the last round's groups (their advantage is 0: only a KL or entropy term acts), so
  a step is never empty. Both are visible in the metrics and logged.
* Resume is exact with no state of its own: every round draws from the prompt sampler and the sampling
  generator, which checkpoints already hold.

Failed samples (training/failures.py, docs/training.md): a group with a sample that failed after its retries
is dropped like a group without a signal, with or without dynamic sampling, and with dynamic sampling the
rounds go on to fill its place. The fallback of spent rounds takes the last round's whole groups only. The
step's failures are counted over all ranks, and too many stop the run (train.max_failed_group_share).

Sequence parallelism (train.sequence_parallel = N): the N ranks of a group train on the same rows, so only
the group's first rank samples and scores them; the others receive its groups (``_draw_for_group``).

Distributed (torchrun): each rank draws and filters its share of every round's prompts. Rounds go on
until every rank has kept its share (one all-reduce, so every rank runs the same rounds), and each rank
then trains on as many groups as the rank that kept fewest, so the ranks' batches stay equal (DDP and
FSDP need the same number of forwards and backwards on every rank).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpolab.data import PromptOrder
from grpolab.distributed import dist, sequence
from grpolab.rewards.base import ScoreResult, merge_scores
from grpolab.rewards.isolate import score_groups
from grpolab.rollout.base import Sampler
from grpolab.training.batch import rewards_tensor
from grpolab.training.failures import FailureTally, group_failures
from grpolab.training.spec import SamplingSpec
from grpolab.types import Completions, Example, Failure

log = logging.getLogger(__name__)


@dataclass
class StepGroups:
    """The groups a step trains on, prompt-major: P' prompts x G completions."""

    rows: list[int]
    """[P'] index into the training examples of each group's prompt."""
    completions: Completions
    """[P' * G] the sampled completions."""
    scores: ScoreResult
    """[P' * G] the rewards of each completion."""
    rewards: torch.Tensor
    """[P', G] total rewards (0 where not applicable)."""
    valid: torch.Tensor
    """[P', G] bool, False where no reward applies (and in a failed group)."""
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def failures(self) -> list[Failure | None]:
        """[P'] each group's first failure (None: the group is whole; training/failures.py)."""
        return group_failures(self.scores.failures, self.completions.num_generations) or [None] * len(self.rows)

    def whole(self) -> list[int]:
        """Indices of the groups with no failed sample."""
        return [p for p, failure in enumerate(self.failures) if failure is None]

    def select(self, groups: Sequence[int]) -> StepGroups:
        """The sub-step of the given group indices, in that order."""
        g = self.completions.num_generations
        seqs = [p * g + j for p in groups for j in range(g)]
        failures = self.scores.failures
        scores = ScoreResult(
            total=[self.scores.total[i] for i in seqs],
            components={k: [v[i] for i in seqs] for k, v in self.scores.components.items()},
            seconds=self.scores.seconds,
            failures=None if failures is None else [failures[i] for i in seqs],
        )
        index = torch.tensor(list(groups), dtype=torch.long)
        return StepGroups(
            rows=[self.rows[p] for p in groups],
            completions=self.completions.select(seqs),
            scores=scores,
            rewards=self.rewards[index],
            valid=self.valid[index],
        )


def groups_with_signal(rewards: torch.Tensor, valid: torch.Tensor) -> list[int]:
    """Indices of the groups whose applicable rewards are not all equal (DAPO's keep rule).

    Args:
        rewards: ``[P, G]`` float.
        valid: ``[P, G]`` bool.
    """
    inf = torch.tensor(float("inf"), dtype=rewards.dtype)
    hi = torch.where(valid, rewards, -inf).amax(1)
    lo = torch.where(valid, rewards, inf).amin(1)
    keep = (hi > lo) & (valid.sum(1) >= 2)
    return keep.nonzero().flatten().tolist()


def sample_step(
    spec: SamplingSpec,
    *,
    sampler: Sampler,
    rewards,
    data: PromptOrder,
    examples: Sequence[Example],
    prompt_ids: Sequence[Sequence[int]],
    generator: torch.Generator,
) -> StepGroups:
    """Draw, sample and score one step's groups; with ``spec.dynamic_sampling``, repeat rounds until enough
    groups have a signal. Metrics: ``train/sampling_rounds``, ``train/groups_drawn``, ``train/groups_kept``,
    ``train/reward_mean_drawn`` (over every completion drawn), the generation / scoring times, and the failed
    samples' counts (``failures/*``, training/failures.py). Raises FailedGroups when too many groups failed."""
    target = spec.prompts_per_step // dist.data_world().size  # this rank's share (distributed/dist.py shard)
    dynamic = spec.dynamic_sampling
    kept: list[StepGroups] = []
    drawn = n_kept = rounds = 0
    drawn_rewards: list[torch.Tensor] = []
    tally = FailureTally()
    seconds = {"sys/time_generation_s": 0.0, "sys/time_scoring_s": 0.0}
    last = None
    for rounds in range(1, (spec.max_sampling_rounds if dynamic else 1) + 1):  # noqa: B007 - read below
        last = _draw_for_group(spec, sampler, rewards, data, examples, prompt_ids, generator, seconds)
        drawn += len(last.rows)
        drawn_rewards.append(last.rewards[last.valid])  # a failed group's rows are not valid
        tally.add(last.failures, last.scores.retries + _episode_retries(last.completions))
        whole = last.whole()
        keep = [p for p in groups_with_signal(last.rewards, last.valid) if p in whole] if dynamic else whole
        part = last if len(keep) == len(last.rows) else last.select(keep)
        kept.append(part)
        n_kept += len(part.rows)
        if dist.all_reduce_max(float(max(target - n_kept, 0))) == 0:  # every rank has its share
            break
    failures = tally.metrics()
    common = int(-dist.all_reduce_max(-float(n_kept)))  # the fewest kept on any rank: equal batches
    # none kept somewhere: the last round's whole groups, as many on every rank (0: nothing to train on)
    left = common or int(-dist.all_reduce_max(-float(len(last.whole()))))
    tally.check(failures, spec.max_failed_group_share, left)
    step = _concat(kept).select(range(min(common, target))) if common else last.select(last.whole()[:left])
    if dynamic and n_kept < target:
        log.info(
            "dynamic sampling: %d of %d groups with a signal after %d rounds (algo.max_sampling_rounds); "
            "training on %s",
            n_kept,
            target,
            rounds,
            "those" if n_kept else "the last round's groups",
        )
    if len(step.rows) > target:
        step = step.select(range(target))
    step.metrics = {
        "train/sampling_rounds": float(rounds),
        "train/groups_drawn": float(drawn),
        "train/groups_kept": float(n_kept),
        # the policy's reward on everything it sampled: comparable across presets, unlike
        # ``reward``, which dynamic sampling takes over the kept groups only
        "train/reward_mean_drawn": _mean(torch.cat(drawn_rewards)),
        **seconds,
        **failures,
    }
    return step


def _mean(x: torch.Tensor) -> float:
    return float(x.mean()) if x.numel() else float("nan")


def _episode_retries(completions: Completions) -> int:
    return sum(e.retries for e in completions.episodes) if completions.episodes is not None else 0


def _draw_for_group(spec: SamplingSpec, sampler, rewards, data, examples, prompt_ids, generator, seconds) -> StepGroups:
    """One round's draw, made once per sequence-parallel group (train.sequence_parallel; every rank is its
    own group without it): the group's first rank samples and scores, the others take part in the
    sampler's collectives only (``Sampler.take_part``) and receive its groups and timings
    (distributed/sequence.py ``shared``). Every rank advances the prompt order, so its state stays the same
    everywhere (checkpoints, resume); the others' sampling generators are never drawn from."""
    rows = dist.shard(data.next(spec.prompts_per_step))  # same order everywhere; this rank's share
    drawn = None
    if sequence.samples():
        drawn = _draw(spec, sampler, rewards, rows, examples, prompt_ids, generator, seconds)
    else:
        sampler.take_part()
    drawn, spent = sequence.shared((drawn, seconds))
    seconds.update(spent)
    return drawn


def _draw(spec: SamplingSpec, sampler, rewards, rows, examples, prompt_ids, generator, seconds) -> StepGroups:
    """One round: G completions for each prompt of ``rows``, scored (as each group finishes, overlapping the
    others' generation, when the sampler hands groups out: server mode)."""
    t0 = time.perf_counter()
    group_size = spec.num_generations
    prompts = [prompt_ids[i] for i in rows]
    if sampler.streams_groups:
        completions, scores = _sample_scoring_groups(spec, sampler, rewards, prompts, [examples[i] for i in rows], generator, seconds)
    else:
        # an environment sampler resets its episodes with the rows' examples
        items = {"examples": [examples[i] for i in rows]} if sampler.takes_examples else {}
        completions = sampler.sample(prompts, num_generations=group_size, generator=generator, **items)
        t1 = time.perf_counter()
        repeated = [examples[i] for i in rows for _ in range(completions.num_generations)]
        scores = score_groups(
            rewards, completions.items(), repeated, group_size=completions.num_generations, failed=completions.failures,
            **_bounds(spec),
        )  # fmt: skip
        seconds["sys/time_generation_s"] += t1 - t0
        seconds["sys/time_scoring_s"] += time.perf_counter() - t1
    _warn_unscored(scores, completions.texts, [examples[i] for i in rows], completions.num_generations)
    reward_t, valid = rewards_tensor(scores.total, len(rows), completions.num_generations)
    for key, value in scores.counts.items():  # e.g. rewards/code_tests/timed_out, over every round
        seconds[key] = seconds.get(key, 0.0) + value
    return StepGroups(rows, completions, scores, reward_t, valid)


def _warn_unscored(scores: ScoreResult, texts: list[str], examples: list[Example], group_size: int) -> None:
    """TRL's warning, once per round, when every reward function returned None for a completion that did not
    fail: it gets no reward and no advantage. The first such completion's row, prompt and text are named."""
    failures = scores.failures or [None] * len(scores.total)
    for i, (total, failure) in enumerate(zip(scores.total, failures, strict=True)):
        if total is None and failure is None:
            example = examples[i // group_size]
            kwargs = {**(example.meta.get("row") or {}), "prompt": example.prompt, "completion": texts[i]}
            log.warning(
                "All reward functions returned None for the following kwargs: %s; the completion gets no reward and "
                "no advantage: make at least one reward return a number for it", kwargs,
            )  # fmt: skip
            return


def _bounds(spec: SamplingSpec) -> dict:
    """How a reward call is bounded and retried (rewards.isolate.score_groups)."""
    return {"timeout_s": spec.reward_timeout_s, "max_retries": spec.reward_max_retries}


def _sample_scoring_groups(spec: SamplingSpec, sampler, rewards, prompts, examples, generator, seconds) -> tuple[Completions, ScoreResult]:
    """Sample, scoring the groups as they finish (``GroupScorer``) while the rest generate.
    ``sys/time_scoring_s`` is then the scoring's own time, mostly hidden behind the generation;
    ``sys/time_scoring_wait_s`` the part that was not (the wait after the last group came back)."""
    t0 = time.perf_counter()
    scorer = GroupScorer(rewards, examples, spec.num_generations, _bounds(spec))
    try:
        completions = sampler.sample(prompts, num_generations=spec.num_generations, generator=generator, on_group=scorer.put)
    except BaseException:
        scorer.close(abandon=True)
        raise
    t1 = time.perf_counter()
    scores = scorer.close(len(prompts))
    seconds["sys/time_generation_s"] += t1 - t0
    seconds["sys/time_scoring_s"] += scorer.busy
    seconds["sys/time_scoring_wait_s"] = seconds.get("sys/time_scoring_wait_s", 0.0) + time.perf_counter() - t1
    return completions, scores


class GroupScorer:
    """One thread that scores the groups handed to it (``put(p, group)``, in the order they finish): each
    turn, every group waiting is scored in one ``score_batch`` call, so a reward that batches (a reward
    model's forward, a sandbox pool) gets one group while scoring keeps up with the generation and more
    when it falls behind. ``close`` returns the step's scores in prompt order (a failure of a group is in its
    scores, rewards.isolate; any other error is raised there). ``bounds``: score_groups' timeout and retries."""

    def __init__(self, rewards, examples: Sequence[Example], group_size: int, bounds: dict) -> None:
        self.rewards, self.examples, self.g, self.bounds = rewards, examples, group_size, bounds
        self.queue: queue.Queue = queue.Queue()
        self.results: dict[int, ScoreResult] = {}
        self.busy = 0.0
        self.error: BaseException | None = None
        self.abandoned = False
        self.thread = threading.Thread(target=self._work, name="grpolab-scoring", daemon=True)
        self.thread.start()

    def put(self, p: int, group: Completions) -> None:
        self.queue.put((p, group))

    def close(self, groups: int = 0, *, abandon: bool = False) -> ScoreResult | None:
        """The scores of the ``groups`` prompts, in prompt order, once every group handed over is scored."""
        self.abandoned = abandon
        self.queue.put(None)
        self.thread.join()
        if abandon:
            return None
        if self.error is not None:
            raise self.error
        if sorted(self.results) != list(range(groups)):
            raise RuntimeError(f"the sampler handed {len(self.results)} of {groups} groups to be scored")
        return merge_scores([self.results[p] for p in range(groups)])

    def _work(self) -> None:
        done = False
        while not done:
            batch = [self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            done = batch[-1] is None  # put by close, after every group
            batch = sorted((b for b in batch if b is not None), key=lambda b: b[0])
            if batch and self.error is None and not self.abandoned:
                try:
                    self._score(batch)
                except BaseException as err:  # noqa: BLE001 - raised by close, in the sampling thread
                    self.error = err

    def _score(self, batch: list[tuple[int, Completions]]) -> None:
        start = time.perf_counter()
        items = [c for _, group in batch for c in group.items()]
        repeated = [self.examples[p] for p, _ in batch for _ in range(self.g)]
        failed = [f for _, group in batch for f in group.failures or [None] * group.num_sequences]  # engine errors
        # first_index names the right row in an error about the first group (the others follow it in order)
        got = score_groups(
            self.rewards, items, repeated, group_size=self.g, failed=failed, first_index=batch[0][0] * self.g,
            **self.bounds,
        )  # fmt: skip
        self.busy += time.perf_counter() - start
        for j, (p, _) in enumerate(batch):
            rows = slice(j * self.g, (j + 1) * self.g)
            self.results[p] = ScoreResult(
                total=got.total[rows],
                components={k: v[rows] for k, v in got.components.items()},
                seconds=got.seconds if j == 0 else {},  # the call's, once: merge_scores sums them
                counts=got.counts if j == 0 else {},
                failures=None if got.failures is None else got.failures[rows],
                retries=got.retries if j == 0 else 0,
            )


def _concat(parts: list[StepGroups]) -> StepGroups:
    """The groups of several rounds in one step, right-padding completions to the longest."""
    parts = [p for p in parts if p.rows]
    if len(parts) == 1:
        return parts[0]
    width = max(p.completions.completion_ids.shape[1] for p in parts)

    def pad(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    cs = [p.completions for p in parts]
    completions = Completions(
        prompt_ids=[ids for c in cs for ids in c.prompt_ids],
        completion_ids=torch.cat([pad(c.completion_ids, 0) for c in cs]),  # padding is masked out
        completion_mask=torch.cat([pad(c.completion_mask, False) for c in cs]),
        logprobs=torch.cat([pad(c.logprobs, 0.0) for c in cs]),
        texts=[t for c in cs for t in c.texts],
        finish_reasons=[r for c in cs for r in c.finish_reasons],
        num_generations=cs[0].num_generations,
        sampled_mask=None if cs[0].sampled_mask is None else torch.cat([pad(c.sampled_mask, False) for c in cs]),
        episodes=None if cs[0].episodes is None else [e for c in cs for e in c.episodes],
        weight_versions=None if cs[0].weight_versions is None else [v for c in cs for v in c.weight_versions],
    )  # the kept groups, none failed: no failures to carry
    scores = ScoreResult(
        total=[t for p in parts for t in p.scores.total],
        components={k: [v for p in parts for v in p.scores.components[k]] for k in parts[0].scores.components},
    )
    return StepGroups(
        rows=[r for p in parts for r in p.rows],
        completions=completions,
        scores=scores,
        rewards=torch.cat([p.rewards for p in parts]),
        valid=torch.cat([p.valid for p in parts]),
    )
