"""The Python API, in the shape of TRL's GRPOTrainer: no YAML file needed.

    trainer = grpolab.GRPOTrainer("Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[reward_len],
                                  args={"train": {"num_steps": 100}}, train_dataset=dataset)
    trainer.train()

or in one call, ``grpolab.train(config, reward_funcs=[...], train_dataset=dataset)``. Both build a
``Config`` (a grpolab Config, a dict of its sections, dotted keys such as ``{"algo.beta": 0.0}``, or a
YAML path), turn the reward functions and the dataset into what ``reward.functions`` and ``data`` would
build, and run the loop ``grpolab train`` runs (``grpolab.commands.train.train``).

Reward functions are TRL's (``fn(completions, **kwargs) -> list[float | None]``, rewards.trl_style),
grpolab reward objects, per-sample functions ``fn(completion, example)``, or names: a built-in
(``grpolab.rewards.REWARDS``), ``"package.module:function"``, or, as in TRL, any other string is a
reward model's folder or hub id. Dataset rows are read as a data file's rows are (data.py): standard
(``"prompt"`` text) or conversational (``"prompt"`` a list of chat messages), every column passed to
TRL-style rewards.

As in TRL, GRPOTrainer loads the models when it is made (``trainer.model``, ``processing_class``,
``ref_model``; runtime.assemble.load_models) and ``train()`` trains those very objects.

Where this departs from TRL, and why:

* Under torchrun the models load in ``train()`` and are None before: each rank's device is chosen when the
  process group starts, in ``train()``, and FSDP2 reads the weights on rank 0 only.
* ``model`` is a folder, a hub id, or a loaded ``PreTrainedModel`` / ``PeftModel`` (its adapter is trained),
  which is written to a temporary folder and loaded from there (grpolab.api_models says why, and what is
  refused: DDP / FSDP-wrapped, compiled, quantized models): ``trainer.model`` is that copy, not the object.
  ``save_model(dir)`` writes the trained policy (or adapter) as a ``from_pretrained`` folder;
  ``state.log_history`` is the run's metrics, one dict a step, then transformers' end-of-training row.
* Steps without learning signal warn rather than stop (``train.max_no_signal_steps`` 0 unless ``args`` sets
  it; TRL has no such stop), and the config's warnings are logged, as TRL logs its own.
* ``args`` may be TRL's ``GRPOConfig``: it is converted in place by ``grpolab convert-trl``'s rules
  (grpolab.trl.convert), with the world size from ``WORLD_SIZE`` and the run length from the
  dataset's rows; a field grpolab cannot reproduce is a ConfigError naming it and why. The conversion
  (notes, ignored fields) is logged and kept as ``trainer.trl_conversion``.
* ``train(resume_from_checkpoint=True)`` continues the latest checkpoint of the run directory
  (``log.output_dir/log.run_name``), checked as ``grpolab train --resume`` checks it; a path is refused.
* The config records a callable reward as ``"module:qualname"``, so the run's config.yaml says what ran.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpolab.api_args import (
    assemble,
    config_warnings_logged,
    environment_rows,
    eval_generations,
    lora_section,
    model_source,
    no_stop_without_signal,
    note_router_loss,
    raw_args,
    set_key,
    trl_logging_steps,
    with_environment,
)
from grpolab.api_callbacks import Callbacks
from grpolab.api_data import dataset_rows, eval_sets
from grpolab.api_eval import evaluate_policy
from grpolab.api_models import (
    ModelFolder,
    TrainerState,
    model_folder,
    reward_model_folders,
    save_model,
    tokenizer_folder,
    train_summary,
    unlogged_by_trl,
)
from grpolab.api_rewards import RewardFunc, as_list, build_reward_funcs, named_reward, trl_reward_funcs
from grpolab.commands.train import train as train_loop
from grpolab.config import Config
from grpolab.distributed import dist
from grpolab.errors import ConfigError
from grpolab.runtime.assemble import Models, load_models
from grpolab.runtime.logging import read_metrics

if TYPE_CHECKING:
    from grpolab.commands.train import TrainResult

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"  # as ``grpolab`` (cli.py) writes its log

__all__ = ["LOG_FORMAT", "GRPOTrainer", "build_reward_funcs", "dataset_rows", "show_progress_logs", "train"]
"""The API, and the reward and dataset readers (api_rewards.py, api_data.py) under the names callers import from here."""


class GRPOTrainer:
    """``GRPOTrainer(model, reward_funcs, args, train_dataset).train()``, as in TRL.

    Args:
        model: the policy's folder or hub id (``model.name_or_path``).
        reward_funcs: one reward or a list: TRL-style functions, grpolab rewards, or names (module docstring).
        args: a grpolab ``Config``, a dict (sections or dotted keys), a YAML path, or TRL's ``GRPOConfig``
            (converted as ``grpolab convert-trl`` converts it); None = the defaults.
        train_dataset: a ``datasets.Dataset`` or a list of dicts; None = the config's ``data`` section.
        peft_config: a ``peft.LoraConfig``: trains a LoRA adapter (``model.lora``).
        processing_class: the tokenizer's folder or hub id (``model.tokenizer``).
        reward_weights: one weight per reward (TRL's ``GRPOConfig.reward_weights``); None = 1 each.

    Everything that needs no model is checked first; then, as in TRL, the models load (``model``,
    ``processing_class``, ``ref_model`` when ``algo.beta`` > 0; a reward model loads with its reward), on
    the device they train on, and ``train()`` trains those very objects: a change made to them before it
    counts. Under torchrun they load in ``train()`` instead and are None until then (module docstring).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
        args: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *,
        peft_config: Any = None,
        processing_class: str | os.PathLike[str] | None = None,
        reward_weights: Sequence[float] | None = None,
        reward_processing_classes: Any = None,
        callbacks: Sequence[Any] | None = None,
        tools: Sequence[Callable[..., Any]] | None = None,
        environment_factory: Any = None,
    ) -> None:
        self._callbacks = Callbacks(callbacks, args)
        given = as_list(reward_funcs) if reward_funcs is not None else []
        reward_funcs = reward_model_folders(reward_funcs, self)  # a loaded reward model: written to a folder
        with config_warnings_logged():
            tokenizers = self._reward_tokenizers(reward_funcs, reward_processing_classes)
            env = (tools, environment_factory, reward_funcs, reward_weights, tokenizers)
            self._configure(model, args, train_dataset, peft_config, processing_class, env)
            self.eval_dataset = eval_dataset
            """The eval_dataset as given (TRL's attribute)."""
            self._eval_sets = eval_sets(eval_dataset, self.args)
        self.reward_funcs = trl_reward_funcs(given, self._reward_sources, self.rewards)
        """TRL's attribute: the rewards as given, in order (a reward model's id: the loaded model, as TRL loads
        it; a grpolab name: its reward object), then each environment's reward; grpolab scores with ``rewards``."""
        self.trl_logging_steps = trl_logging_steps(args)
        """TRL's logging_steps (optimizer steps) when ``args`` is its GRPOConfig, else None (grpolab logs every step)."""
        self.num_generations_eval = eval_generations(args, self.args)
        """Completions sampled per eval prompt: TRL's num_generations_eval (eval.num_samples), else num_generations."""
        self.reward_func_names = [r.name for r in self.rewards or ()]
        """The rewards' names, as logged (rewards/<name>/mean); TRL's attribute."""
        self.reward_weights = torch.tensor([r.weight for r in self.rewards or ()], dtype=torch.float32)
        """One weight per reward, a float32 tensor as in TRL."""
        given = reward_processing_classes if isinstance(reward_processing_classes, list | tuple) else [reward_processing_classes]
        self.reward_processing_classes = [*given, *[None] * (len(self.reward_func_names) - len(given))]
        """TRL's attribute, one entry per reward: what was given (None where nothing was, and for the environment's
        reward). TRL fills a reward model's missing entry with its tokenizer; grpolab loads that with the reward."""
        self._result: TrainResult | None = None
        self._eval_rows: list[dict[str, Any]] = []
        self._last_step = 0
        self._summary: dict[str, Any] | None = None
        self._models = None if dist.launched() else load_models(self.args)
        self.model: torch.nn.Module | None = self._models.policy if self._models else None
        """The policy being trained (a PeftModel under LoRA); under torchrun None (it loads in ``train()``)."""
        self.processing_class = self._models.tokenizer if self._models else None
        """The policy's tokenizer."""
        reference = self._models.reference if self._models else None
        self.ref_model: torch.nn.Module | None = reference.frozen_model if reference is not None else None
        """The frozen reference (algo.beta > 0, full fine-tuning); None with beta = 0 and under LoRA (the policy
        with its adapter disabled is the reference there), as in TRL."""
        self.aux_loss_enabled = False
        """TRL's flag for the MoE load-balancing loss: False, as grpolab adds none (a GRPOConfig's
        router_aux_loss_coef is refused; with it unset, a note says what TRL would have added)."""
        if self.trl_conversion is not None and self.model is not None:
            note_router_loss(self.model.config)

    def _configure(self, model, args, train_dataset, peft_config, processing_class, env) -> None:
        """``args``, the rewards and the data as a Config, reward objects and examples; a model object or a
        tokenizer object written to a folder (api_models); TRL's tools / environment_factory as env.name trl."""
        tools, environment_factory, reward_funcs, reward_weights, tokenizers = env
        raw, reward_weights, self.trl_conversion = raw_args(args, train_dataset, reward_weights)
        train_dataset = environment_rows(raw, args, train_dataset, environment_factory)  # TRL's environment-owned data
        reward_funcs, reward_weights, tokenizers, self.tools = with_environment(
            self, raw, tools, environment_factory, (reward_funcs, reward_weights, tokenizers)
        )
        """TRL's attribute: the standalone ``tools`` and each environment's methods (of a probe instance), by name once."""
        if not isinstance(args, Config | str | os.PathLike):  # a dict, TRL's GRPOConfig or None
            no_stop_without_signal(raw)
        self.model_folder: ModelFolder | None = None
        if isinstance(model, str | os.PathLike):
            set_key(raw, "model", "name_or_path", os.fspath(model))
            if processing_class is not None and hasattr(processing_class, "save_pretrained"):
                self.model_folder = tokenizer_folder(processing_class, self)
                processing_class = self.model_folder.keys["tokenizer"]
            if processing_class is not None:
                set_key(raw, "model", "tokenizer", model_source(processing_class, "processing_class"))
        else:
            if peft_config is not None and hasattr(model, "peft_config"):
                raise ConfigError("model is a PeftModel and peft_config is given: its adapter is trained; drop peft_config")
            self.model_folder = model_folder(model, processing_class, self)
            for key, value in self.model_folder.keys.items():
                set_key(raw, "model", key, value)
        if peft_config is not None:
            set_key(raw, "model", "lora", lora_section(peft_config))
        self._reward_sources = as_list(reward_funcs) if reward_funcs is not None else []
        self.args, self.rewards, self.train_dataset = assemble(raw, reward_funcs, reward_weights, train_dataset, tokenizers)
        """rewards: grpolab's weighted rewards, one per reward_funcs entry (None: the config's reward.functions)."""

    def _reward_tokenizers(self, reward_funcs, classes) -> list[str | None] | None:
        """TRL's reward_processing_classes: one per reward (a single one for a single reward), each a folder or
        hub id, or a tokenizer object written to a folder removed with the trainer; None = the model's own."""
        if classes is None:
            return None
        classes = list(classes) if isinstance(classes, list | tuple) else [classes]
        funcs = as_list(reward_funcs) if reward_funcs is not None else []
        if len(classes) != len(funcs):
            raise ConfigError(
                f"reward_processing_classes has {len(classes)} entries for {len(funcs)} reward_funcs: the lengths must "
                "match; give one per "
                "reward (None for a reward function, whose entry is not read)"
            )
        out: list[str | None] = []
        for i, (cls, fn) in enumerate(zip(classes, funcs, strict=True)):
            if cls is None or not isinstance(fn, str) or named_reward(fn)["name"] != "reward_model":
                out.append(None)  # as TRL: only a reward model's entry is read
            elif hasattr(cls, "save_pretrained"):
                out.append(str(tokenizer_folder(cls, self).path))
            else:
                out.append(model_source(cls, f"reward_processing_classes[{i}]"))
        return out

    def train(self, resume_from_checkpoint: bool = False) -> TrainResult:
        """Train to ``train.num_steps``; True continues the run directory's latest checkpoint."""
        if not isinstance(resume_from_checkpoint, bool):
            raise ConfigError(
                f"resume_from_checkpoint={resume_from_checkpoint!r}: grpolab resumes the latest checkpoint of "
                f"{self.args.run_dir} (log.output_dir/log.run_name); pass True"
            )
        started, self._summary = time.perf_counter(), None
        if self._callbacks:
            done = self.state.global_step if resume_from_checkpoint else 0
            self._callbacks.train_begin(self.args.train.num_steps, done, self.model, self.processing_class)
        self._result = _train_with(
            self.args, self.rewards, self.train_dataset, resume=resume_from_checkpoint, models=self._models,
            after_step=self._after_step if self._callbacks or self._evaluates_every else None,
        )  # fmt: skip
        rows = read_metrics(self.args.run_dir)
        per_step = self.args.train.prompts_per_step * self.args.rollout.num_generations
        elapsed = time.perf_counter() - started
        self._summary = train_summary(rows, self._result.start_step + 1, self._result.final_step, elapsed, per_step)
        if self.trl_logging_steps:  # TRL's final row also carries what it had not logged yet
            updates = self.args.algo.num_minibatches * self.args.algo.mu
            leftover = unlogged_by_trl(rows, self._result.final_step, self.trl_logging_steps, updates)
            self._summary = {**leftover, **self._summary}
        if self._callbacks:
            self._callbacks.log(self._summary)
            self._callbacks.train_end()
        return self._result

    @property
    def _evaluates_every(self) -> int:
        """eval.every (TRL's eval_strategy="steps" with eval_steps) when there is an eval_dataset, else 0."""
        return self.args.eval.every if self.eval_dataset is not None else 0

    def _after_step(self, step: int, metrics: dict[str, float]) -> bool:
        """Callbacks' on_step_end and on_log, and the evaluation every eval.every steps; True stops training."""
        self._last_step = step
        stop = self._callbacks.step_end(step, metrics) if self._callbacks else False
        if self._evaluates_every and step % self._evaluates_every == 0:
            self.evaluate()
        return stop or bool(self._callbacks.control.should_training_stop)

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """TRL's ``evaluate()``: ``num_generations_eval`` completions per prompt of ``eval_dataset`` (default: the
        one given to the trainer), sampled by the policy as it is now and scored by the rewards; TRL's metric
        names with the ``eval_`` prefix, ``eval_loss`` included (grpolab.api_eval says how)."""
        sets = self._eval_sets if eval_dataset is None else eval_sets(eval_dataset, self.args)
        if sets is None:
            raise ConfigError("evaluate() needs an eval_dataset: give it to GRPOTrainer(eval_dataset=...) or to evaluate()")
        if self.model is None:
            raise ConfigError("evaluate() under torchrun is not supported: the models load in train(); run grpolab eval")
        if not self.rewards:
            raise ConfigError("evaluate() scores with reward_funcs: give them to GRPOTrainer (reward.functions in a config is not read here)")
        metrics: dict[str, float] = {}
        for name, examples in sets.items():  # a dict of datasets: each under eval_<name>_, as transformers does
            metrics |= evaluate_policy(
                self.args, self.model, self.processing_class, self.rewards, examples, self.num_generations_eval,
                prefix=metric_key_prefix if name is None else f"{metric_key_prefix}_{name}",
                reference=self._models.reference, entropy_coef=self._entropy_coef_applied(),
            )  # fmt: skip
        self._eval_rows.append({**metrics, "step": self._last_step})
        if self._callbacks:
            self._callbacks.evaluated(metrics)
        return metrics

    def _entropy_coef_applied(self) -> float:
        """The entropy coefficient the next training step applies, which TRL's eval loss uses too: adaptive
        control's gated one (none before the first step, as TRL's), else algo.entropy_coef."""
        if not self.args.algo.entropy_adaptive:
            return self.args.algo.entropy_coef
        rows = [row for row in read_metrics(self.args.run_dir) if "loss/entropy_coef_next" in row]
        return float(rows[-1]["loss/entropy_coef_next"]) if rows else 0.0

    @property
    def entropy_coef(self) -> float:
        """TRL's attribute: the entropy bonus's coefficient now. Under adaptive control (algo.entropy_adaptive) the
        last step's ``entropy_coef`` metric, the coefficient after that step's last update; before any step, and
        without it, algo.entropy_coef."""
        if self.args.algo.entropy_adaptive:
            for row in reversed(read_metrics(self.args.run_dir)):
                if "entropy_coef" in row:
                    return float(row["entropy_coef"])
        return self.args.algo.entropy_coef

    @property
    def state(self) -> TrainerState:
        """TRL's ``trainer.state``: ``global_step`` and ``log_history``, one dict per step (the run's
        metrics.jsonl, each row with its "step"; grpolab logs every step, TRL every logging_steps), then
        after ``train()`` the end-of-training row with ``train_loss``, as transformers' Trainer logs it."""
        history = read_metrics(self.args.run_dir)
        step = history[-1]["step"] if history else 0
        rows = sorted(history + self._eval_rows, key=lambda row: row["step"])  # an eval row after its step's
        return TrainerState(global_step=step, log_history=rows + ([self._summary] if self._summary else []))

    def save_model(self, output_dir: str | os.PathLike[str] | None = None) -> Path:
        """The trained policy as a ``from_pretrained`` folder (the adapter alone under LoRA), with its tokenizer,
        copied from the run's latest checkpoint; None = TRL's default, the run folder's ``model``."""
        out = Path(output_dir) if output_dir is not None else self.args.run_dir / "model"
        if os.environ.get("RANK", "0") != "0":  # under torchrun the first process writes it, as TRL's main process
            return out
        base = self.model_folder.base_name if self.model_folder else None
        return save_model(self.args.run_dir, out, base)


def train(
    config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
    train_dataset: Any = None,
    reward_weights: Sequence[float] | None = None,
    resume: bool = False,
) -> TrainResult:
    """GRPO (or the variant ``algo.name`` picks) in one call; ``grpolab train`` from Python.

    ``config`` as GRPOTrainer's ``args``; ``reward_funcs`` and ``train_dataset`` replace the config's
    ``reward.functions`` and ``data`` when given. ``resume``: continue the latest checkpoint (``--resume``).
    """
    with config_warnings_logged():
        raw, reward_weights, _ = raw_args(config, train_dataset, reward_weights)
        cfg, rewards, examples = assemble(raw, reward_funcs, reward_weights, train_dataset)
    return _train_with(cfg, rewards, examples, resume=resume)


def _train_with(cfg: Config, rewards, examples, *, resume: bool, models: Models | None = None, after_step=None) -> TrainResult:
    show_progress_logs()
    return train_loop(cfg, resume=resume, rewards=rewards, examples=examples, models=models, after_step=after_step)


def show_progress_logs() -> None:
    """Let a script run off a terminal print progress lines (grpolab/progress.py) without setting up logging.

    Only when nothing is configured (no handler on the root or ``grpolab`` logger): then INFO and above
    from grpolab go to stderr as the command line writes them. A handler set up by the user wins.
    """
    package = logging.getLogger("grpolab")
    if logging.getLogger().handlers or package.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
