"""The sections of a run config that say how the run goes: optim, train, eval, log (what it trains on: sections.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TrackerName = Literal["tensorboard", "wandb", "trackio"]


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate (DeepSeekMath: 1e-6 for 7B; tiny models need ~1e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 = off)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = 0.0
    """cosine only: the floor the rate decays to, as a fraction of optim.lr (transformers' cosine_with_min_lr
    min_lr_rate; 0 = decay to 0)."""


AUTO_MICRO_BATCH = {"cpu": 64, "cuda": 8}
"""train.micro_batch_size=auto by device type."""


@dataclass(frozen=True)
class TrainConfig:
    num_steps: int = 100
    """Training steps; one step = one generation batch."""
    prompts_per_step: int = 8
    """P, prompts per generation batch (completions per step = P * G)."""
    micro_batch_size: int | Literal["auto"] = "auto"
    """Sequences per forward/backward (gradient accumulation over a minibatch). auto = 64 on a CPU, 8 on
    CUDA, where 64 rows of long completions do not fit beside the model (bound the tokens too with
    max_tokens_per_micro_batch)."""
    max_bad_steps: int = 3
    """Stop (TrainingError, last good checkpoint kept) after this many steps in a row whose update was
    skipped for a NaN or infinite loss or gradient; 0 = never stop, only skip."""
    max_no_signal_steps: int = 50
    """Stop (TrainingError) after this many steps in a row that carry no learning signal: every group's
    rewards equal (zero std) or no valid reward at all. A warning comes after 3 such steps; 0 = never stop."""
    max_failed_group_share: float = 0.5
    """Stop (TrainingError, one line naming each kind of failure and the first one's message) when more than
    this share of a step's groups (all ranks, all of DAPO's rounds) were dropped for a failed sample: an
    engine error, an environment or sandbox that crashed or hung, a reward that raised, timed out or returned
    NaN or nothing, after their retries (docs/training.md, "Failed samples"). The step trains on the groups
    left. 0 = stop at the first dropped group; 1 = never stop for the share (a step left with no group on
    some rank still stops). NeMo-RL's max_generation_failures, as a share."""
    parallel: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    """Under torchrun: "ddp" (each rank holds the model; gradients all-reduced), "fsdp" (FSDP2: parameters,
    gradients and optimizer state sharded; DCP checkpoints), "auto" (ddp when WORLD_SIZE > 1, else none).
    "none" is the single process; grpolab.distributed.parallel."""
    max_tokens_per_micro_batch: int | None = None
    """Also bound each forward by padded tokens, rows x (longest prompt + longest completion): rows are
    sorted by length and packed up to this budget (a longer row runs alone); null = micro_batch_size only.
    Activation memory follows tokens, so this keeps long completions from running out of memory."""
    padding_free: bool = False
    """Pack each training micro-batch's rows into one padding-free sequence (position ids restart per row;
    transformers masks across rows; flash-attention takes it as varlen): no compute or activation memory
    on pad tokens. The same log-probs and gradients as the padded forward (grpolab.training.packing)."""
    offload_activations: bool = False
    """Keep the activations the backward needs in host memory (torch.autograd.graph.save_on_cpu), copied back
    as the backward reaches them: for the longest sequences, after checkpointing (which leaves one hidden
    state per layer) and sequence parallelism. Costs a host round trip per saved tensor; a no-op on a CPU."""
    sequence_parallel: int = 1
    """DeepSpeed-Ulysses sequence parallelism under torchrun: each group of this many consecutive ranks holds
    the same rows and splits every training sequence's positions between them (1/N each); attention trades
    heads for positions with an all-to-all before and after. WORLD_SIZE = data-parallel size x N; the model's
    attention heads must divide by N. For completions whose activations outgrow one device
    (grpolab.distributed.sequence, docs/distributed.md, "Long sequences"). 1 = off."""
    deterministic: bool = False
    """Deterministic kernels: torch.use_deterministic_algorithms (an op with no deterministic version stops
    the run, naming it), cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG), cuDNN without autotuning,
    flash-attention's deterministic backward. On CUDA a run and its --resume then give the same numbers, as
    do two runs of one seed on one GPU kind; some kernels run slower. A CPU run is reproducible without it.
    TRL's full_determinism."""
    dist_timeout_s: float = 600.0
    """Under torchrun: how long a collective waits for the other ranks before the job fails (the process
    group's timeout). Raise it when one rank's work between collectives (a long rollout, a slow reward,
    a checkpoint on a slow disk) can take longer."""
    dist_bind_device: bool = True
    """Under torchrun on CUDA: give the process group its device (``device_id`` = cuda:LOCAL_RANK), so NCCL
    makes its communicator at start-up and each collective knows its GPU. false = let NCCL find it lazily."""

    def micro_batch_rows(self, device_type: str) -> int:
        """micro_batch_size resolved for ``device_type`` ("auto": 64 on a CPU, 8 on CUDA)."""
        if self.micro_batch_size == "auto":
            return AUTO_MICRO_BATCH.get(device_type, AUTO_MICRO_BATCH["cpu"])
        return int(self.micro_batch_size)


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate on the held-out set every N steps (0 = only when asked)."""
    num_samples: int = 16
    """n samples per eval prompt for Pass@K / Maj@K."""
    temperature: float = 1.0
    """Sampling temperature for evaluation (DeepSeekMath fig. 7: 0.7)."""
    max_prompts: int = 0
    """Evaluate on at most this many held-out prompts (0 = all)."""
    greedy: bool = True
    """Also report greedy accuracy."""
    checkpoints: tuple[str, ...] = ()
    """Model folders (or hub ids) that ``grpolab eval`` compares; empty = model.name_or_path."""
    ks: tuple[int, ...] = ()
    """K values for Pass@K / Maj@K; empty = 1, 2, 4, ... up to num_samples."""
    correct_threshold: float = 0.5
    """A sample counts as correct when its total reward is above this."""
    blind_grader: str | None = None
    """A second grading of every sample that ignores format: a reward name as in reward.functions, e.g.
    answer_anywhere (the reference answer anywhere in the reply). Its Pass@K / Maj@K are reported beside the
    rewards', with the share of format errors (wrong by the rewards and right by it, or no answer extracted).
    null = none."""
    prompts_per_batch: int = 32
    """Eval prompts sampled together (each with num_samples completions)."""
    output_dir: str = ""
    """Where eval JSON and plots go; empty = <log.output_dir>/<log.run_name>/eval."""


@dataclass(frozen=True)
class LogConfig:
    output_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str = "run"
    """Run directory name: output_dir/run_name; a plain folder name (no "/", not "." or "..")."""
    checkpoint_every: int = 50
    """Save a checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    samples_every: int = 1
    """Write samples.jsonl, and the trackers' completions table, every N steps (0 = never)."""
    tensorboard: bool = True
    """Also write TensorBoard events."""
    progress: bool = True
    """Show progress: a bar on a terminal, else a log line every ~10 s or tenth of the work (grpolab.progress)."""
    overwrite: bool = False
    """Let a fresh run (no --resume) start in a run directory that holds checkpoints, deleting them;
    without it that is an error, so that no saved run is lost by mistake."""
    report_to: tuple[TrackerName, ...] | None = None
    """Experiment trackers: any of tensorboard, wandb, trackio (pip install 'grpolab[wandb]' or
    '[trackio]'). They get the resolved config, every metric, and a completions table every
    log.samples_every steps; a resumed run continues the same tracker run. null = [tensorboard] if
    log.tensorboard else []; when set, it replaces log.tensorboard."""
    project: str = "grpolab"
    """Tracker project (wandb, trackio); the tracker run is named log.run_name."""
    resume_allow: tuple[str, ...] = ()
    """Config keys (or sections, e.g. "model") that --resume may change although they alter what was
    trained; same as ``grpolab train --resume --resume-allow-change KEY``. See runtime/resume.py."""

    def __post_init__(self) -> None:
        if self.report_to is not None and len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"log.report_to lists a tracker twice: {list(self.report_to)}; name each once")
        # the run directory is output_dir/run_name, and log.overwrite deletes in it: "", "." or ".." (or a
        # path) would make it output_dir itself, or a folder beside it, and other runs' checkpoints with it
        if self.run_name.strip() in ("", ".", "..") or "/" in self.run_name or "\\" in self.run_name:
            raise ValueError(
                f"log.run_name={self.run_name!r} is not a folder name: the run directory is log.output_dir/log.run_name; "
                "give a plain name (no '/', not '.' or '..'), and put the parent folder in log.output_dir"
            )

    @property
    def trackers(self) -> tuple[str, ...]:
        """log.report_to, or the trackers log.tensorboard implies when it is null."""
        if self.report_to is not None:
            return tuple(self.report_to)
        return ("tensorboard",) if self.tensorboard else ()
