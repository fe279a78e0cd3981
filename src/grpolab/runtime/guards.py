"""What stops a training run cleanly: SIGINT / SIGTERM / SIGHUP, and steps whose loss or gradient is not finite.

Signals. While ``train()`` runs (and only then, and only in the main thread), SIGINT, SIGTERM and SIGHUP
(the terminal hung up: an ssh session closed; what was written to it then goes to /dev/null, since a write
to a hung-up terminal fails) set a flag instead of killing the process: the current
step finishes, a checkpoint is written, and ``train()`` returns with ``stopped_by`` set; the command
line then exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), the
shell convention. A second signal acts at once, as it would have without grpolab (KeyboardInterrupt for
SIGINT, termination for the others); the last checkpoint written is intact either way, since
checkpoints are written atomically.

Non-finite steps. An update whose loss or gradient norm is NaN or infinite is skipped (the optimizer
and weights are left as they were; see step.py). A step with a skipped update is "bad"; after
``train.max_bad_steps`` bad steps in a row the run stops with a TrainingError. Weights that turn
non-finite despite finite gradients (a huge learning rate) stop the run at once, before they could be
checkpointed: the last checkpoint on disk is then the last good one.

Failed samples. Too many of a step's groups dropped for failed samples (train.max_failed_group_share,
training/failures.py) stop the run with one line naming the step and the last good checkpoint.

Non-finite sampling. A model whose logits are NaN (NaN weights loaded from a damaged file, an fp16
overflow) stops the run when it samples, with one line naming the model and the step
(``sampling_guard``); nothing from that step is logged or checkpointed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import torch

from grpolab.config.algo_section import GROUP_BASELINES
from grpolab.distributed import dist
from grpolab.errors import TrainingError
from grpolab.rollout.base import SamplerFailed
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.training.failures import FailedGroups

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run at the end of its step (and that compare passes to its training process)."""


class GracefulStop:
    """Context manager: SIGINT / SIGTERM / SIGHUP request a stop at the end of the current step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        """The signal that asked for the stop, or None."""
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second signal: behave as if grpolab had not caught the first
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # type: ignore[arg-type]
            signal.raise_signal(signum)
            return
        self.signum = signum
        if signum == signal.SIGHUP:
            detach_from_terminal()
        log.warning(
            "%s received: finishing the current step, saving a checkpoint, then stopping "
            "(send it again to stop at once)",
            signal.Signals(signum).name,
        )


def detach_from_terminal() -> None:
    """After SIGHUP: stdout and stderr that were the terminal now write to /dev/null. The terminal is gone, and
    each write to it fails (EIO): the next progress line would end the run mid-step, before its checkpoint."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        null = os.fstat(devnull).st_rdev
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                st = os.fstat(fd)  # isatty() is already False on a terminal that hung up: a character device
                if stat.S_ISCHR(st.st_mode) and st.st_rdev != null:
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def weights_finite(model: torch.nn.Module) -> bool:
    """True when every trainable parameter is finite on every rank (one device sync, one collective).

    A parameter whose fp32 sum is finite holds no NaN or infinity (either would make the sum one): one
    vectorised pass per parameter, where ``torch.isfinite(p).all()`` takes five (10x the time: 0.2 s a
    step for 33.6M fp32 weights on one CPU thread). Only where a sum is not finite, which a finite
    parameter of huge values can also give by overflowing, is that parameter checked element by element."""
    params = [getattr(p, "_local_tensor", p) for p in model.parameters() if p.requires_grad]
    if not params:
        return True
    sums = torch.stack([p.sum(dtype=torch.float32) for p in params])
    finite = bool(torch.isfinite(sums).all())
    if not finite:
        finite = all(bool(torch.isfinite(p).all()) for p in params)
    return not dist.any_rank(not finite)


def last_good(run_dir: Path) -> str:
    last = latest_checkpoint(run_dir)
    return f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"


@contextlib.contextmanager
def sampling_guard(model: str, step: int, run_dir: Path) -> Iterator[None]:
    """A SamplerFailed inside (NaN logits, a dead engine) becomes one TrainingError naming ``model``,
    ``step`` and the last good checkpoint; too many failed groups (FailedGroups) name the step and that
    checkpoint too."""
    try:
        yield
    except FailedGroups as err:
        raise TrainingError(
            f"step {step}: {err}; nothing of this step was logged or saved, and {last_good(run_dir)}"
        ) from err
    except SamplerFailed as err:
        raise TrainingError(
            f"step {step}: {err} in model '{model}'; nothing of this step was logged or saved, and "
            f"{last_good(run_dir)}. {err.remedy}"
        ) from err


GAP_METRIC = "sampling/sampling_logp_difference/mean"


class SamplerGap:
    """Stops the run when the sampler's log-probs drift from the trainer's (rollout.max_logprob_gap).

    A weight sync that silently misses a layer (verl #7495; LoRA on a tied LM head before grpolab sent
    it) leaves the engine sampling from another policy: the mean |log pi_train - log pi_sampler| grows
    step after step while everything else looks normal. Two steps in a row above the limit stop the run
    before that step's checkpoint, so one noisy batch does not.
    """

    def __init__(self, limit: float | None, run_dir: Path, patience: int = 2) -> None:
        self.limit, self.run_dir, self.patience = limit, Path(run_dir), patience
        self.above: list[float] = []

    def observe(self, step: int, metrics: dict[str, float]) -> None:
        gap = metrics.get(GAP_METRIC)
        if self.limit is None or gap is None:
            return
        if metrics.get("rollout/staleness_max", 0.0) > 0:  # sampled with older weights (rollout.max_staleness):
            return  # the gap then holds the policy's own updates too, which TIS / MIS correct; not judged
        self.above = [*self.above, gap] if gap > self.limit else []
        if len(self.above) >= self.patience:
            shown = ", ".join(f"{g:.3g}" for g in self.above)
            raise TrainingError(
                f"step {step}: the sampler's log-probs differ from the trainer's by {shown} nats per token on the "
                f"last {len(self.above)} steps ({GAP_METRIC} > rollout.max_logprob_gap={self.limit:g}): the engine "
                f"is not sampling from the policy being trained (a weight sync that misses a layer); "
                f"{last_good(self.run_dir)}. Report it, try rollout.engine=hf, or raise rollout.max_logprob_gap "
                "if the gap is expected (a low-precision engine)"
            )


class BadSteps:
    """Counts steps in a row whose update was skipped for a non-finite loss or gradient."""

    def __init__(self, limit: int, run_dir: Path) -> None:
        self.limit = limit
        """train.max_bad_steps; 0 = never stop."""
        self.run_dir = Path(run_dir)
        self.in_a_row = 0

    def observe(self, step: int, skipped_updates: float, model: torch.nn.Module) -> None:
        """Update the count after ``step``; raise TrainingError when the run must stop."""
        if not weights_finite(model):
            raise TrainingError(
                f"the policy weights became NaN or infinite at step {step} although the loss and gradients "
                f"were finite; {self._last_good()}. Resume with a lower learning rate or a gradient clip, e.g. "
                "grpolab train --resume optim.lr=<lower> optim.max_grad_norm=1.0 (both take effect on resume)."
            )
        if skipped_updates <= 0:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d bad step(s) in a row; the run stops at "
            "train.max_bad_steps=%d)",
            step,
            self.in_a_row,
            self.limit,
        )
        if self.limit and self.in_a_row >= self.limit:
            raise TrainingError(
                f"steps {step - self.in_a_row + 1}-{step}: {self.in_a_row} steps in a row had a NaN or infinite "
                f"loss or gradient (train.max_bad_steps={self.limit}), so their updates were skipped; "
                f"{self._last_good()}. Resume with a lower optim.lr (grpolab train --resume optim.lr=<lower>: it "
                "takes effect), check the rewards and model.dtype (float16 overflows), or raise train.max_bad_steps."
            )

    def _last_good(self) -> str:
        return last_good(self.run_dir)

    def state_dict(self) -> dict[str, int]:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.in_a_row = int(state.get("in_a_row", 0))


class NoSignal:
    """Counts steps in a row that carry no learning signal, from the step's metrics alone.

    A step has no signal when no completion got a valid reward (``train/reward_valid_frac`` = 0), or,
    for group baselines, when every group's rewards are equal (``frac_reward_zero_std`` = 1: zero
    advantage everywhere); for a learned baseline (PPO) when all rewards of the step are equal
    (``reward_std`` = 0). A constant reward, a reward that is None for everything, or a task too
    hard for the model all look like this. Warns after ``warn_after`` such steps in a row, raises
    TrainingError after ``limit`` (train.max_no_signal_steps; 0 = never). Dynamic sampling that drops
    zero-std groups reports what it kept, so it composes: only steps with nothing kept count.
    """

    def __init__(self, limit: int, *, group_baseline: bool, warn_after: int = 3, enabled: bool = True) -> None:
        self.limit, self.group_baseline, self.warn_after = limit, group_baseline, warn_after
        self.enabled = enabled
        self.in_a_row = 0

    @classmethod
    def from_config(cls, cfg) -> NoSignal:
        """Group baselines read frac_reward_zero_std; process supervision is not judged (its signal is in the step
        rewards, which these outcome metrics do not see)."""
        return cls(
            cfg.train.max_no_signal_steps,
            group_baseline=cfg.algo.advantage in GROUP_BASELINES,
            enabled=cfg.algo.supervision != "process",
        )

    def has_signal(self, metrics: dict[str, float]) -> bool:
        if metrics.get("train/reward_valid_frac", 1.0) <= 0:
            return False
        if self.group_baseline:
            return metrics.get("frac_reward_zero_std", 0.0) < 1.0
        return metrics.get("reward_std", 1.0) > 0

    def observe(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled or self.has_signal(metrics):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        valid = metrics.get("train/reward_valid_frac", 1.0)
        why = (
            "no completion got a valid reward (every reward returned None)"
            if valid <= 0
            else "every completion of every group got the same reward, so all advantages are zero"
        )
        advice = (
            "Check the rewards on a few samples (samples.jsonl): a constant reward, a reward that never "
            "applies, rollout.temperature too low, or a task the model never (or always) solves"
        )
        if self.limit and self.in_a_row >= self.limit:
            raise TrainingError(
                f"steps {step - self.in_a_row + 1}-{step}: {self.in_a_row} steps in a row carried no learning "
                f"signal: {why} (train.max_no_signal_steps={self.limit}). {advice}; or raise "
                "train.max_no_signal_steps (0 = never stop)."
            )
        if self.in_a_row == self.warn_after:
            stops = (
                f"The run stops after {self.limit} such steps in a row (train.max_no_signal_steps)"
                if self.limit
                else "The run goes on (train.max_no_signal_steps=0: never stop)"
            )
            log.warning("steps %d-%d: no learning signal, %s. %s. %s.", step - self.in_a_row + 1, step, why, advice, stops)

    def state_dict(self) -> dict[str, int]:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.in_a_row = int(state.get("in_a_row", 0))
