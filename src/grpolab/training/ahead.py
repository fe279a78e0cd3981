"""Bounded staleness (rollout.max_staleness = k > 0, server mode): the next k steps' groups are sampled and
scored while the current step trains (docs/server_mode.md).

A background thread runs ``sample_step`` (training/sampling.py: draw the prompts, sample, score, DAPO's
rounds) for step s as soon as the server holds weights k updates behind the ones step s will train
from: after the trainer's (s - 1 - k)-th sync of this run. The trainer takes the groups in step order,
and sends step t's weights only once step t + k's groups are drawn, so step s is always sampled with
exactly the weights after step s - 1 - k of this run (the first k + 1 steps: its first weights): the
lag is k, the same at every run with the same seeds, and the generation of steps t + 1 .. t + k
overlaps step t's training. The thread draws prompts and seeds from the same data sampler and generator, in the same order,
as the synchronous loop: the steps see the same prompts and seeds at every k, only older weights.

The server sampler (rollout/vllm/client.py) holds one lock across a whole ``sample`` and a whole sync,
so every batch is drawn with one weight version, recorded on each sample (``Completions.weight_versions``);
staleness = the trainer's version when it trains the sample - the sample's version. The engine's log-probs
(its processed ones) are the behaviour policy's; the loss's rollout correction (algo.rollout_correction)
weighs each token by pi_trainer / pi_sampler, which is then the lag's correction too.

Checkpoints: ``checkpoint_state`` pauses the thread between batches and saves the data sampler and the
generator as they were before the first batch not yet trained: a resumed run discards the batches in
flight and samples them again, from the resumed weights, with the same prompts and seeds (reproducible,
but not equal to the uninterrupted run, whose in-flight batches came from older weights).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from grpolab.data import PromptOrder
from grpolab.distributed import dist
from grpolab.rewards.base import WeightedReward
from grpolab.rollout.base import Sampler
from grpolab.training.sampling import StepGroups, sample_step
from grpolab.training.spec import SamplingSpec
from grpolab.types import Example


@dataclass(frozen=True)
class AheadSource:
    """What the background sampler draws and samples from: the same objects the synchronous loop passes to
    ``sample_step``, so both draw the same prompts and seeds. The trainer's loop builds it from its run."""

    spec: SamplingSpec
    """How a step's groups are drawn and scored (runtime/step_spec.py ``sampling_spec``)."""
    sampler: Sampler
    """The server sampler (or the multi-turn one over it): it numbers its weight versions."""
    rewards: Sequence[WeightedReward]
    """The reward functions that score each group (as it finishes: ``streams_groups``)."""
    examples: Sequence[Example]
    """The training examples, in the order of ``prompt_ids``."""
    prompt_ids: Sequence[Sequence[int]]
    """The examples' tokenized prompts."""
    prompt_order: PromptOrder
    """The seeded, resumable prompt order; ``checkpoint_state`` sets it back to before a step's draw."""
    generator: torch.Generator
    """The sampling generator (the steps' seeds); set back with ``prompt_order``."""


class AheadSampling:
    """The background sampler of one run (module docstring); ``take`` returns the groups of the next step."""

    def __init__(
        self, source: AheadSource, *, first_step: int, last_step: int, max_staleness: int, sync_timeout_s: float
    ) -> None:
        """``max_staleness``: rollout.max_staleness (k); ``sync_timeout_s``: rollout.sync_timeout_s, the longest one
        server call takes (``close`` waits that long, and 10 s more, for the thread's call in flight)."""
        self.source = source
        self.sync_timeout_s = sync_timeout_s
        source.sampler.send_pending()  # version 0 from this thread: a sync's collectives stay on the main thread
        self.group = dist.side_group()
        """The thread's own process group under torchrun (its collectives beside the trainer's: dist.side_group)."""
        self.first, self.last, self.k = first_step, last_step, max_staleness
        self.synced = 0
        """The trainer's weight syncs since the thread started."""
        self.cond = threading.Condition()
        self.draw_lock = threading.Lock()
        """Held while the thread draws and samples one step (a checkpoint waits for it)."""
        self.before: dict[int, tuple[dict, torch.Tensor]] = {}
        """step -> (data sampler state, generator state) just before its groups were drawn."""
        self.drawn_after: dict[int, int] = {}
        """step -> prompts drawn (data sampler's ``drawn``) once its groups were drawn, DAPO's rounds included:
        the step's ``sys/samples_seen``, not counting the steps drawn ahead of it."""
        self.out: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.drawn_through = first_step - 1
        """The last step whose groups are drawn."""
        self.thread = threading.Thread(target=self._work, name="grpolab-ahead-sampling", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        with dist.on_group(self.group):
            self._steps()

    def _steps(self) -> None:
        src = self.source
        try:
            for step in range(self.first, self.last + 1):
                t0 = time.perf_counter()
                with self.cond:
                    while not self.stop.is_set() and self.synced < step - self.first - self.k:
                        self.cond.wait(0.5)
                idle = time.perf_counter() - t0
                if self.stop.is_set():
                    return
                with self.draw_lock:
                    self.before[step] = (src.prompt_order.state_dict(), src.generator.get_state())
                    drawn = sample_step(
                        src.spec, sampler=src.sampler, rewards=src.rewards, data=src.prompt_order, examples=src.examples,
                        prompt_ids=src.prompt_ids, generator=src.generator,
                    )  # fmt: skip
                    self.drawn_after[step] = src.prompt_order.drawn
                self.out.put((step, drawn, idle))
                with self.cond:
                    self.drawn_through = step
                    self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the trainer, which raises it
            self.out.put((None, err, 0.0))
            with self.cond:
                self.cond.notify_all()

    def before_sync(self, step: int) -> float:
        """Wait until step ``step + k``'s groups are drawn (so they come from the weights before this sync);
        returns the seconds waited. A failure of the thread is raised by the next ``take``."""
        t0 = time.perf_counter()
        target = min(step + self.k, self.last)
        with self.cond:
            while self.drawn_through < target and self.thread.is_alive():
                self.cond.wait(0.5)
        dist.barrier()  # torchrun: every rank's thread has drawn it before rank 0 sends the next version
        return time.perf_counter() - t0

    def take(self, step: int) -> tuple[StepGroups, dict[str, float]]:
        """The groups of ``step`` (waiting for them), and the trainer's wait and the generator's idle time."""
        t0 = time.perf_counter()
        while True:
            try:
                got, drawn, idle = self.out.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.out.empty():
                    raise RuntimeError("the background sampler stopped without a result") from None
        if got is None:
            raise drawn
        if got != step:
            raise RuntimeError(f"the background sampler gave step {got}'s groups for step {step}")
        self.before.pop(step - 1, None)
        self.drawn_after.pop(step - 1, None)
        return drawn, {"sys/time_trainer_wait_s": time.perf_counter() - t0, "sys/time_generator_idle_s": idle}

    def prompts_drawn(self, step: int) -> int:
        """The prompts drawn through ``step`` (taken already), not those of the steps drawn ahead of it."""
        return self.drawn_after[step]

    def synced_once(self) -> None:
        """The trainer sent new weights: the thread may start the next step's batch."""
        with self.cond:
            self.synced += 1
            self.cond.notify_all()

    @contextlib.contextmanager
    def checkpoint_state(self, next_step: int) -> Iterator[None]:
        """The data sampler and generator set back to before ``next_step``'s draw (if drawn already) while the
        body saves a checkpoint; the thread waits meanwhile."""
        with self.draw_lock:
            src = self.source
            saved = self.before.get(next_step)
            now = (src.prompt_order.state_dict(), src.generator.get_state())
            if saved is not None:
                src.prompt_order.load_state_dict(saved[0])
                src.generator.set_state(saved[1])
            try:
                yield
            finally:
                src.prompt_order.load_state_dict(now[0])
                src.generator.set_state(now[1])

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        self.thread.join(timeout=self.sync_timeout_s + 10)
        if not self.thread.is_alive():
            dist.destroy_group(self.group)


def staleness_metrics(drawn: StepGroups, sampler: Sampler) -> dict[str, float]:
    """Staleness mean / max, the weight versions in the batch, and the last sync's bytes (server mode)."""
    versions = drawn.completions.weight_versions
    current = sampler.version
    if versions is None or current is None:
        return {}
    lag = torch.tensor([current - v for v in versions], dtype=torch.float64)
    return {
        "rollout/staleness_mean": float(lag.mean()),
        "rollout/staleness_max": float(lag.max()),
        "rollout/weight_version_min": float(min(versions)),
        "rollout/weight_version_max": float(max(versions)),
        "rollout/weight_version_trainer": float(current),
        "sys/weight_sync_bytes": float(sampler.last_sync_bytes),
    }
