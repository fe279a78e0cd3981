"""Reading a config into a working run: one step with one home (docs/design.md, "A run is assembled in one place").

``assemble(cfg)`` returns a ``Run``, everything the training loop (commands/train.py) needs, built in this
order so that bad input fails before the model loads and nothing is deleted before every check passed:

1. checks that need no model (runtime/run_inputs.py): the parallel mode, the run directory (resume point and
   config changes, rank 0), the model path, the rewards, the trackers, the generation engine, the data, and each
   reward tried on a few examples;
2. the models: policy and tokenizer, the reference, the DDP / FSDP2 wrapping, the prompts tokenized and
   checked against the context length;
3. the parts of a step: process supervision, the sampler (``rollout.engine``: one line, rollout/engines.py),
   the optimizer and schedule, the loss, the critic (PPO), the batch builder, the gold monitor, the data
   order, the random generators and the guards;
4. the start point: the checkpoint restored (and the sampler given its weights) or a previous run cleared,
   then config.yaml, run_info.json and the logger.

``sft`` and ``eval`` (and so ``compare`` and the demo, which run train, sft and eval) use the same pieces:
``training_examples`` / ``split_examples``, ``load_model``, ``build_rewards``, ``build_gold_rewards`` and
``build_sampler`` (over ``engine_spec``).

For the Python API, ``rewards`` (a list like ``build_rewards`` returns) and ``examples`` (``Example``
objects, in place of what ``cfg.data`` loads; ``data.eval_size`` still holds out the last ones) may be
given already built. They pass the same checks (the dry run), but config.yaml cannot describe them: a
resume must be given them again. So may the models (``load_models``, one process only): GRPOTrainer
holds them from its construction, as TRL's does, and the run trains those very objects.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.config import Config, ConfigError, ModelConfig, config_to_dict, dump_config
from grpolab.data import PromptOrder, tokenize_prompts
from grpolab.distributed import dist, parallel, sequence
from grpolab.models.inference import limit_cpu_threads
from grpolab.models.loading import (
    Reference,
    count_parameters,
    load_policy,
    resolve_autocast,
    resolve_device,
    use_deterministic_kernels,
)
from grpolab.models.ulysses_attention import install as install_ulysses
from grpolab.rewards import WeightedReward, start_workers
from grpolab.rewards.trl_hooks import TrlHooks
from grpolab.rollout.base import EngineSpec, Sampler
from grpolab.rollout.engines import build_sampler
from grpolab.rollout.multiturn import episode_prompt_ids, episode_sampler
from grpolab.runtime.engine_spec import engine_spec
from grpolab.runtime.guards import BadSteps, NoSignal
from grpolab.runtime.judges import close_judges
from grpolab.runtime.lock import hold_run_dir_for_job
from grpolab.runtime.logging import RunLogger, memory_before_models_mb
from grpolab.runtime.preflight import check_context, check_model_source, clear_previous_run
from grpolab.runtime.resumable import Resumable
from grpolab.runtime.resume import ResumePoint, record_resume
from grpolab.runtime.run_info import write_run_info
from grpolab.runtime.run_inputs import check_inputs, split_examples, training_examples
from grpolab.runtime.step_spec import (
    batch_builder,
    build_critic,
    entropy_control,
    logprob_context,
    process_supervision,
    run_optimizer,
    sampling_spec,
    update_spec,
)
from grpolab.training.batch import BatchBuilder
from grpolab.training.gold import GoldMonitor
from grpolab.training.master import MasterWeightOptimizer
from grpolab.training.ppo import Critic
from grpolab.training.reasoning_steps import ProcessSupervision, TurnSupervision
from grpolab.training.spec import SamplingSpec, UpdateSpec
from grpolab.types import Example

log = logging.getLogger(__name__)

__all__ = [
    "Run",
    "Models",
    "assemble",
    "load_model",
    "load_models",
    "session",
    "split_examples",
    "training_examples",
]


@dataclass
class Run:
    """A run assembled from its config: what the loop reads, and nothing it has to build."""

    cfg: Config
    rewards: list[WeightedReward]
    examples: list[Example]
    """The training examples (held-out ones excluded); ``prompt_ids`` are theirs, in the same order."""
    prompt_ids: list[list[int]]
    policy: torch.nn.Module
    """The policy as the trainer holds it: DDP- or FSDP2-wrapped under torchrun, else ``unwrapped_policy``."""
    unwrapped_policy: torch.nn.Module
    tokenizer: Any
    device: torch.device
    reference: Reference | None
    critic: Critic | None
    process_supervision: ProcessSupervision | TurnSupervision | None
    """Process supervision (algo.supervision=process; training/reasoning_steps.py), else None."""
    sampler: Sampler
    optimizer: torch.optim.Optimizer | MasterWeightOptimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampling: SamplingSpec
    """How each step's groups are drawn and scored (runtime/step_spec.py ``sampling_spec``)."""
    update: UpdateSpec
    """The policy update's settings (runtime/step_spec.py); ``update.logprobs`` is every forward's: the
    temperature, pad id, autocast dtype and micro-batching of the batch's log-probs and the critic's values too."""
    build_batch: BatchBuilder
    """The step's batch builder: outcome advantages, or GAE with the critic (PPO)."""
    gold: GoldMonitor
    prompt_order: PromptOrder
    sampling_generator: torch.Generator
    minibatch_generator: torch.Generator
    bad_steps: BadSteps
    no_signal: NoSignal
    resumable: Resumable
    entropy_control: AdaptiveEntropy | None
    """algo.entropy_adaptive's controller (its state in every checkpoint), else None."""
    reward_hooks: TrlHooks
    """What TRL-style rewards log through ``log_metric`` / ``log_extra``, and the ``trainer_state`` they read."""
    start: int = 0
    """The last step already done: the resumed checkpoint's, 0 for a fresh run."""
    logger: RunLogger | None = None
    """Open from the end of ``assemble`` until the loop closes it."""
    judges: list[WeightedReward] = field(default_factory=list)
    """The rewards and gold rewards whose judge servers the run started (runtime/judges.py), stopped with the run."""


@dataclass
class Models:
    """The policy, its tokenizer and the reference, loaded before the run is assembled (``load_models``)."""

    policy: torch.nn.Module
    tokenizer: Any
    reference: Reference | None
    """The frozen reference (algo.needs_reference), built from the policy as loaded; else None."""
    baseline_mem_mb: float | None
    """What the device held before the models loaded (run_info.json)."""
    rng_after_load: dict[str, torch.Tensor]
    """The random states loading left (LoRA's initialisation draws from them), restored where ``assemble``
    would have loaded: the run then draws what ``grpolab train`` draws, whatever ran in between."""


def load_models(cfg: Config) -> Models:
    """The models of ``cfg`` on the device they train on, seeded as ``assemble`` seeds before it loads them.

    One process only: under torchrun they load inside the process group's session (each rank's device is
    chosen there, and FSDP2 reads the weights on rank 0 alone), so ``assemble`` loads them itself."""
    if dist.launched():
        raise ConfigError("load_models: under torchrun the models load inside the run's session; let assemble load them")
    check_model_source(cfg.model)  # one line for a missing folder, an unreachable hub id, custom code
    _seed(cfg)
    device = resolve_device(cfg.model)
    baseline_mem_mb = memory_before_models_mb(device)
    plain, tok = load_model(cfg.model)
    reference = Reference(plain, resolve_autocast(cfg.model, device)) if cfg.algo.needs_reference else None
    states = {"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state()} if device.type == "cuda" else {})}
    return Models(plain, tok, reference, baseline_mem_mb, states)


def _seed(cfg: Config) -> None:
    if cfg.train.deterministic:
        use_deterministic_kernels()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)


@contextlib.contextmanager
def session(cfg: Config) -> Iterator[None]:
    """The process group (one process: world size 1) and the run directory's lock, held by the rank
    that writes it, rank 0 (runtime/lock.py): ``assemble`` and the loop run inside it."""
    # a refused lock stops every rank with one line (runtime/lock.py)
    with (
        dist.session(resolve_device(cfg.model).type, **dist.session_options(cfg.train)),
        sequence.sequence_parallel(cfg.train.sequence_parallel, timeout_s=cfg.train.dist_timeout_s),
        hold_run_dir_for_job(cfg.run_dir),
    ):
        yield


def assemble(
    cfg: Config,
    *,
    resume: bool = False,
    rewards: Sequence[WeightedReward] | None = None,
    examples: Sequence[Example] | None = None,
    models: Models | None = None,
) -> Run:
    """The run of ``cfg`` (see the module docstring), inside ``session(cfg)``; ``rewards`` / ``examples`` /
    ``models`` replace what ``cfg.reward.functions`` / ``cfg.data`` / ``cfg.model`` would build."""
    if models is not None and dist.launched():
        raise ConfigError("assemble: models loaded beforehand are for one process; under torchrun let assemble load them")
    engine = engine_spec(cfg)  # what the generation engine reads of the run, checked and built from it
    mode, point, rewards, gold_rewards, examples, make_env, hooks = check_inputs(cfg, engine, resume, rewards, examples)
    try:
        _seed(cfg)
        device = resolve_device(cfg.model)
        baseline_mem_mb = memory_before_models_mb(device) if models is None else models.baseline_mem_mb
        start_workers([*rewards, *gold_rewards], cfg.reward.timeout_s)  # forked while the process is small
        run = _build(cfg, engine, mode, rewards, gold_rewards, examples, make_env, models, hooks)
    except BaseException:
        close_judges([*rewards, *gold_rewards])
        raise
    run.judges = [*rewards, *gold_rewards]
    try:
        run.start = _start(cfg, point, run.resumable, run.sampler)
        if point is None and models is not None:  # they may have been changed since they loaded
            run.sampler.update_weights(run.policy)
        write_run_info(
            cfg, policy=run.policy, reference=run.reference, critic=run.critic, rewards=rewards,
            baseline_mem_mb=baseline_mem_mb, device=run.device,
        )  # fmt: skip
        run.logger = RunLogger(
            cfg.run_dir, resume_step=run.start if point is not None else None, report_to=cfg.log.trackers,
            project=cfg.log.project, run_name=cfg.log.run_name, config=config_to_dict(cfg),
        )  # fmt: skip
    except BaseException:
        run.sampler.close()  # an engine's memory and processes are not left behind (the loop closes it otherwise)
        close_judges(run.judges)
        raise
    _announce(cfg, run.policy, run.reference, run.gold, run.start)
    return run


def _build(
    cfg: Config, engine: EngineSpec, mode: str, rewards, gold_rewards, examples, make_env, models: Models | None, hooks: TrlHooks
) -> Run:
    """The models, then the parts of a step, at step 0 (``_start`` restores a checkpoint into them)."""
    from_rank0 = parallel.loads_on_rank0(mode)  # FSDP2: no GPU holds the whole model
    device = resolve_device(cfg.model)
    amp = resolve_autocast(cfg.model, device)
    if models is None:
        placement = ("host" if dist.is_main() else "meta") if from_rank0 else "device"
        plain, tok = load_model(cfg.model, placement=placement, longest_sequence=cfg.longest_sequence)
        install_ulysses(plain, cfg.train.sequence_parallel)  # before the reference copy and any wrapper
        reference = Reference(plain, amp) if cfg.algo.needs_reference else None
    else:
        plain, tok, reference = models.policy, models.tokenizer, models.reference
        torch.set_rng_state(models.rng_after_load["cpu"])
        if "cuda" in models.rng_after_load:
            torch.cuda.set_rng_state(models.rng_after_load["cuda"])
    full = _full_states(plain, reference) if from_rank0 and dist.is_main() else ({}, {})
    fsdp_compute = parallel.fsdp_param_dtype(cfg.model.dtype, amp)
    reference = parallel.wrap_reference(reference, mode, fsdp_compute)
    policy = parallel.wrap(plain, mode, device, compute_dtype=fsdp_compute)  # before the optimizer
    if from_rank0:
        parallel.materialize_from_rank0(policy, full[0], device)
        if reference is not None and reference.frozen_model is not None:
            parallel.materialize_from_rank0(reference.frozen_model, full[1], device)
        del full
    parallel.log_layout(mode)
    template_kwargs = cfg.data.chat_template_kwargs
    encode = None if make_env is None else functools.partial(episode_prompt_ids, make_env=make_env, template_kwargs=template_kwargs)
    prompt_ids = tokenize_prompts(examples, tok, cfg.data, encode)  # with an env: its first messages and tools
    check_context(cfg, prompt_ids, plain.config)
    process = process_supervision(cfg, tok, examples)  # None unless algo.supervision=process
    sampler = build_sampler(engine, policy=plain, tokenizer=tok, autocast_dtype=amp, wrapped=policy)
    sampler = episode_sampler(sampler, tok, make_env, cfg.env, template_kwargs)  # env.name set: multi-turn episodes over it
    optimizer, scheduler = run_optimizer(cfg, policy)
    ctx = logprob_context(cfg, pad_id=tok.pad_token_id, autocast_dtype=amp, device_type=device.type)
    update = update_spec(cfg, ctx)
    critic = build_critic(cfg, device, ctx) if cfg.algo.needs_critic else None  # PPO's value model
    make_batch = batch_builder(cfg, ctx, critic)
    gold = GoldMonitor.build(  # logged, never trained on
        gold_rewards, plain, reference, ctx, measure_kl=cfg.reward.measure_kl, timeout_s=cfg.reward.timeout_s
    )
    data = PromptOrder(len(examples), seed=cfg.seed, shuffle=cfg.data.shuffle)
    # each data-parallel rank its own; under sequence parallelism its group's first rank draws from it, so a
    # D x N job samples as D processes do (distributed/sequence.py)
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed + dist.data_world().rank)
    minibatch_gen = torch.Generator().manual_seed(cfg.seed + 1)
    bad_steps = BadSteps(cfg.train.max_bad_steps, cfg.run_dir)
    no_signal = NoSignal.from_config(cfg)  # zero-std / no-valid-reward steps in a row (runtime/guards.py)
    control = entropy_control(cfg)
    resumable = Resumable(
        policy, tok, optimizer, scheduler, reference, data, sample_gen, minibatch_gen, critic, bad_steps, no_signal,
        entropy_control=control,
    )
    return Run(
        cfg=cfg, rewards=list(rewards), examples=examples, prompt_ids=prompt_ids, policy=policy, unwrapped_policy=plain,
        tokenizer=tok, device=device, reference=reference, critic=critic, process_supervision=process,
        sampler=sampler, optimizer=optimizer, scheduler=scheduler, sampling=sampling_spec(cfg), update=update, build_batch=make_batch,
        gold=gold, prompt_order=data, sampling_generator=sample_gen, minibatch_generator=minibatch_gen, bad_steps=bad_steps,
        no_signal=no_signal, resumable=resumable, entropy_control=control, reward_hooks=hooks,
    )  # fmt: skip


def _full_states(plain, reference) -> tuple[dict, dict]:
    """Rank 0's unsharded (host) weights of the policy and the frozen reference, for the broadcast."""
    frozen = None if reference is None else reference.frozen_model
    return plain.state_dict(), ({} if frozen is None else frozen.state_dict())


def load_model(model_cfg: ModelConfig, *, placement: str = "device", longest_sequence: int = 0):
    """(policy, tokenizer) of ``model_cfg`` on its device (``placement``, ``longest_sequence``:
    models.load_policy); on a CPU no more threads than the cores this process may use."""
    model, tok = load_policy(model_cfg, placement=placement, longest_sequence=longest_sequence)
    if resolve_device(model_cfg).type == "cpu":
        limit_cpu_threads()
    return model, tok


def _start(cfg: Config, point: ResumePoint | None, resumable: Resumable, sampler: Sampler) -> int:
    """Restore the checkpoint (the sampler then takes the resumed weights), or clear a previous run's
    checkpoints (log.overwrite: only now, every check passed); write config.yaml. Returns the last step done."""
    start = 0
    if point is not None:
        start = resumable.restore(point.path, cfg)
        sampler.update_weights(resumable.model)
    if dist.is_main() and point is not None:
        record_resume(cfg, point, start)
    elif dist.is_main():
        clear_previous_run(cfg)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_main():
        (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    return start


def _announce(cfg: Config, model, reference, gold: GoldMonitor, start: int) -> None:
    kind = "frozen copy or adapter-disabled base"  # with beta=0, loaded only to measure train/kl_seq (gold.py)
    described = kind if reference is not None else f"{kind}, measuring the KL only (beta=0)" if gold.active else "none (beta=0)"
    info = {
        **cfg.derived(),
        "policy_parameters": count_parameters(model),
        "trainable_parameters": count_parameters(model, trainable_only=True),
        "reference": described,
        "start_step": start,
    }
    log.info("grpolab train: %s", json.dumps(info))
