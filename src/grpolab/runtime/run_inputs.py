"""Step 1 of assembling a run (runtime/assemble.py): every check that needs no model, in the order a user meets them,
and the training examples, split from the ones held out. Nothing is deleted here.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.config import Config
from grpolab.data import check_prompt_chars, load_examples, split_eval
from grpolab.distributed import dist, parallel
from grpolab.envs.setup import environment_from_config, offers_environments
from grpolab.models.loading import load_tokenizer
from grpolab.rewards import build_rewards, dry_run
from grpolab.rewards.trl_hooks import TrlHooks, attach_hooks
from grpolab.rollout.base import EngineSpec
from grpolab.rollout.engines import check_engine
from grpolab.runtime.judges import close_judges, prepare_judges
from grpolab.runtime.preflight import check_model_source, prepare_run_dir
from grpolab.runtime.trackers import check_trackers
from grpolab.training.gold import build_gold_rewards
from grpolab.types import Completion, Episode, Example


def check_inputs(cfg: Config, engine: EngineSpec, resume: bool, rewards, examples):
    """(parallel mode, resume point, rewards, gold rewards, training examples, make_env or None, the TRL rewards'
    hooks): every check that needs no model, in the order a user meets them. Nothing is deleted here."""
    mode = parallel.resolve_parallel(cfg.train.parallel, dist.world().size)
    dist.check_divisible(cfg.train.prompts_per_step)
    # rank 0 checks the run dir (checkpoint verified, config changes checked) and tells the others
    point = dist.broadcast_object(prepare_run_dir(cfg, resume=resume) if dist.is_main() else None)
    check_model_source(cfg.model)
    rewards = build_rewards(cfg.reward.functions) if rewards is None else list(rewards)
    check_trackers(cfg.log.trackers)
    check_engine(cfg.rollout.engine, engine)  # vllm: installed, the architecture, the KV cache's size
    make_env = environment_from_config(cfg.env)  # None: one completion per prompt (docs/multiturn.md)
    gold_rewards = build_gold_rewards(cfg.reward.gold)  # logged, never in the advantages (training/gold.py)
    # TRL's trainer_state / log_extra / log_metric (and environments), from the dry run on
    hooks = TrlHooks(cfg.train.num_steps, environments=offers_environments(make_env))
    attach_hooks([*rewards, *gold_rewards], hooks)
    examples = training_examples(cfg, examples)
    prepare_judges(cfg, [*rewards, *gold_rewards])  # a judge with serve: its server, before the dry run asks it
    try:
        dry_run_rewards(cfg, rewards, examples, make_env if hooks.environments else None)
        dry_run_rewards(cfg, gold_rewards, examples, make_env if hooks.environments else None)
        check_prompt_chars(examples, load_tokenizer(cfg.model), cfg.data)  # a 30 MB prompt: an error, before the model
    except BaseException:
        close_judges([*rewards, *gold_rewards])
        raise
    return mode, point, rewards, gold_rewards, examples, make_env, hooks


def split_examples(
    cfg: Config, examples: Sequence[Example] | None = None
) -> tuple[list[Example], list[Example]]:
    """(training, held out): the examples of ``cfg.data`` (or ``examples``), the last ``data.eval_size``
    held out for evaluation and never drawn for training."""
    loaded = load_examples(cfg.data, seed=cfg.seed) if examples is None else list(examples)
    return split_eval(loaded, cfg.data.eval_size)


def training_examples(cfg: Config, examples: Sequence[Example] | None = None) -> list[Example]:
    """The examples of ``cfg.data`` (or ``examples``) less the ``data.eval_size`` held out at the end."""
    return split_examples(cfg, examples)[0]


def dry_run_rewards(cfg: Config, rewards, examples, make_env=None) -> None:
    """Check every reward on a few examples (reference answers and an empty completion) before training; with
    ``make_env`` (episodes that keep environment objects) each answer is a one-turn episode of a fresh environment
    reset with its example, as a reward reading TRL's ``environments`` meets them."""
    k = min(cfg.reward.dry_run_examples, len(examples))
    if k == 0:
        return
    picked = [*examples[:k], examples[0]]
    texts = [e.answer or "" for e in examples[:k]] + [""]
    comps = [
        Completion(text=t, num_tokens=max(len(t), 1), episode=None if make_env is None else _answered(make_env, e, t))
        for t, e in zip(texts, picked, strict=True)
    ]
    dry_run(rewards, comps, picked, timeout_s=cfg.reward.timeout_s)


def _answered(make_env, example: Example, text: str) -> Episode:
    """A one-turn episode answering ``example`` with ``text`` (no tool called) in a fresh environment."""
    env = make_env()
    messages = [*env.reset(example), {"role": "assistant", "content": text}]
    return Episode(tuple(messages), env_reward=None, turns=1, environment=getattr(env, "environment", None))
