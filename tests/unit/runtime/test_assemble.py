"""runtime/assemble.py: a config read into a run holds the parts the config asks for, checked before any
model loads; injected rewards and examples replace the configured ones; the sampler gets the weights
after every policy update and after a resume."""

from __future__ import annotations

import pytest

import grpolab.runtime.assemble as assemble_mod
from grpolab.commands.train import train
from grpolab.config import ConfigError, load_config
from grpolab.rewards import build_reward
from grpolab.rollout.base import EngineRecord, Sampler
from grpolab.rollout.engines import ENGINES, build_hf_sampler
from grpolab.rollout.hf import HFSampler
from grpolab.runtime.assemble import assemble, session
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.arithmetic import arithmetic_examples


def overrides(model_dir, data, out, *extra) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={data}",
        "data.eval_size=4",
        "reward.functions=[{name: exact_match}]",
        "rollout.num_generations=2",
        "rollout.max_completion_length=3",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "train.micro_batch_size=4",
        f"log.output_dir={out}",
        "log.run_name=run",
        "log.progress=false",
        *extra,
    ]


def assembled(cfg, **kwargs):
    with session(cfg):
        run = assemble(cfg, **kwargs)
        run.logger.close()
    return run


@pytest.fixture
def no_model(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the policy was loaded before the bad input was found")

    monkeypatch.setattr(assemble_mod, "load_policy", fail)


def test_a_grpo_run_without_kl_has_no_reference_nor_critic(tiny_model_dir, addition_jsonl, tmp_path):
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "algo.beta=0"))
    run = assembled(cfg)
    assert run.reference is None and run.critic is None and run.process_supervision is None
    assert isinstance(run.sampler, HFSampler) and run.sampler.model is run.unwrapped_policy
    assert run.policy is run.unwrapped_policy  # one process: not wrapped
    assert run.start == 0 and len(run.examples) == 16 - 4 == len(run.prompt_ids)
    assert [r.name for r in run.rewards] == ["exact_match"]
    assert (tmp_path / "run" / "config.yaml").exists() and (tmp_path / "run" / "run_info.json").exists()


def test_a_kl_penalty_brings_a_reference_and_ppo_a_critic(tiny_model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    grpo = assembled(load_config(None, overrides(tiny_model_dir, data, tmp_path, "algo.beta=0.04")))
    assert grpo.reference is not None and grpo.reference.frozen_model is not None and grpo.critic is None
    ppo = assembled(load_config(None, overrides(tiny_model_dir, data, tmp_path, "algo.name=ppo", "log.run_name=ppo")))
    assert ppo.critic is not None and ppo.critic.model is not ppo.unwrapped_policy


def test_vllm_without_its_sampler_is_one_line_before_the_model_loads(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch, no_model
):
    import importlib.util

    find_spec = importlib.util.find_spec  # as in an installation without the extra: no vllm package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "rollout.engine=vllm"))
    with pytest.raises(ConfigError) as err:
        assembled(cfg)
    message = str(err.value)
    assert "rollout.engine=vllm" in message and "pip install 'grpolab[vllm]'" in message and "\n" not in message
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_registered_engine_whose_package_is_missing_says_how_to_install_it(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch, no_model
):
    engine = EngineRecord(build=build_hf_sampler, requires=("grpolab_no_such_package", "pip install 'grpolab[vllm]'"))
    monkeypatch.setitem(ENGINES, "vllm", engine)
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "rollout.engine=vllm"))
    with pytest.raises(ConfigError, match=r"pip install 'grpolab\[vllm\]'"):
        assembled(cfg)


def test_a_bad_config_is_found_before_the_model_loads(tiny_model_dir, addition_jsonl, tmp_path, no_model):
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "reward.functions=[]"))
    with pytest.raises(ConfigError, match="reward.functions is empty"):
        assembled(cfg)


def test_injected_rewards_and_examples_replace_the_configured_ones(tiny_model_dir, tmp_path):
    examples = arithmetic_examples(size=10, seed=3, digits=1)
    rewards = [build_reward("exact_match", alias="injected")]
    cfg = load_config(None, overrides(tiny_model_dir, tmp_path / "absent.jsonl", tmp_path, "reward.functions=[]"))
    run = assembled(cfg, rewards=rewards, examples=examples)
    assert run.rewards == rewards
    assert run.examples == examples[:6]  # data.eval_size=4 still holds out the last four
    result = train(_fresh(cfg), rewards=rewards, examples=examples)
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2] and "rewards/injected/mean" in rows[0]


def _fresh(cfg):
    import dataclasses

    return dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, run_name="trained"))


class RecordingSampler(Sampler):
    """The hf sampler, recording what the loop hands it."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def sample(self, *args, **kwargs):
        self.calls.append("sample")
        return self.inner.sample(*args, **kwargs)

    def update_weights(self, model):
        self.calls.append(("update_weights", model))
        self.inner.update_weights(model)

    def close(self):
        self.calls.append("close")


def test_the_sampler_takes_the_weights_after_each_update_and_after_a_resume(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch
):
    calls: list = []
    policies: list = []

    def recording(spec, **kwargs):
        policies.append(kwargs["wrapped"])
        return RecordingSampler(build_hf_sampler(spec, **kwargs), calls)

    monkeypatch.setitem(ENGINES, "hf", EngineRecord(build=recording))
    data = addition_jsonl(16)
    train(load_config(None, overrides(tiny_model_dir, data, tmp_path, "log.checkpoint_every=1")))
    names = [c if isinstance(c, str) else c[0] for c in calls]
    assert names == ["sample", "update_weights", "sample", "update_weights", "close"]
    assert all(c[1] is policies[0] for c in calls if not isinstance(c, str))
    calls.clear()
    train(load_config(None, overrides(tiny_model_dir, data, tmp_path, "train.num_steps=3")), resume=True)
    names = [c if isinstance(c, str) else c[0] for c in calls]
    assert names == ["update_weights", "sample", "update_weights", "close"]  # the resumed weights first
    assert all(c[1] is policies[1] for c in calls if not isinstance(c, str))


def test_train_deterministic_switches_on_deterministic_kernels_before_the_model_loads(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch
):
    """train.deterministic (TRL's full_determinism): deterministic algorithms and cuBLAS's fixed workspace
    are set before any model loads (cuBLAS reads the workspace size when its first handle is made)."""
    import os

    import torch

    for name in ("CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # undone in reverse: unset again afterwards
    seen = {}
    load = assemble_mod.load_policy

    def load_policy(*args, **kwargs):
        seen["at_load"] = (torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        return load(*args, **kwargs)

    monkeypatch.setattr(assemble_mod, "load_policy", load_policy)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        assembled(load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "algo.beta=0")))
        assert seen["at_load"] == (False, None)  # off by default
        assembled(load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path / "d", "algo.beta=0",
                                              "train.deterministic=true")))  # fmt: skip
        assert seen["at_load"] == (True, ":4096:8")
        assert not torch.is_deterministic_algorithms_warn_only_enabled()  # strict, as TRL: such an op raises
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["FLASH_ATTENTION_DETERMINISTIC"] == "1"
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]
