"""The run plumbing's pure parts: the no-signal guard, the config number walk, resume's config diff,
the checkpoint manifest, and optim's lr rebuild after a state load."""

from __future__ import annotations

import logging

import pytest
import torch

from grpolab.config import Config, ConfigError, OptimConfig, RewardConfig, RewardSpec, load_config
from grpolab.config.validate import numeric_fields
from grpolab.errors import TrainingError
from grpolab.rewards import build_reward, score_batch
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.guards import NoSignal
from grpolab.runtime.resume import check_changes, config_changes
from grpolab.training.optim import apply_optim_config, build_optimizer
from grpolab.types import Completion, Example

FLAT = {"train/reward_valid_frac": 1.0, "frac_reward_zero_std": 1.0, "reward_std": 0.0}
SIGNAL = {"train/reward_valid_frac": 1.0, "frac_reward_zero_std": 0.5, "reward_std": 0.4}


def test_no_signal_warns_at_3_and_stops_at_the_limit_and_a_signal_resets_it(caplog):
    guard = NoSignal(5, group_baseline=True)
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):
            guard.observe(step, FLAT)
        assert caplog.text == ""
        guard.observe(3, FLAT)
        assert "steps 1-3: no learning signal, every completion of every group got the same reward" in caplog.text
        guard.observe(4, SIGNAL)
        assert guard.in_a_row == 0
        for step in range(5, 9):
            guard.observe(step, FLAT)
        with pytest.raises(TrainingError, match=r"steps 5-9: 5 steps in a row carried no learning signal"):
            guard.observe(9, FLAT)


def test_no_signal_reads_valid_frac_first_and_reward_std_for_a_learned_baseline():
    assert not NoSignal(0, group_baseline=False).has_signal({**SIGNAL, "train/reward_valid_frac": 0.0})
    ppo = NoSignal(0, group_baseline=False)
    assert ppo.has_signal({**FLAT, "reward_std": 0.1})  # zero-std groups, a value baseline: still signal
    assert not ppo.has_signal(FLAT)
    never = NoSignal(0, group_baseline=True)
    for step in range(1, 100):
        never.observe(step, FLAT)  # 0 = never stop
    assert never.in_a_row == 99


def test_every_number_of_the_config_is_walked_nested_ones_included():
    cfg = Config(reward=RewardConfig(functions=(RewardSpec("a", 2.0), RewardSpec("b", 0.5))))
    found = dict(numeric_fields(cfg))
    assert found["reward.functions[1].weight"] == 0.5 and found["optim.betas[0]"] == 0.9
    assert "log.tensorboard" not in found  # bools are not numbers here
    with pytest.raises(ConfigError, match=r"'reward.functions\[1\].weight' is inf"):
        Config(reward=RewardConfig(functions=(RewardSpec("a"), RewardSpec("b", float("inf")))))
    with pytest.raises(ConfigError, match="'optim.lr' is nan"):
        Config(optim=OptimConfig(lr=float("nan")))


def test_resume_diff_refuses_what_was_trained_and_accepts_the_rest():
    saved = {"optim": {"lr": 1e-3, "schedule": "constant"}, "rollout": {"num_generations": 8}, "log": {"a": 1}}
    new = {"optim": {"lr": 1e-5, "schedule": "cosine"}, "rollout": {"num_generations": 4}, "log": {"a": 2}}
    changes = config_changes(saved, new)
    assert set(changes) == {"optim.lr", "optim.schedule", "rollout.num_generations", "log.a"}
    with pytest.raises(ConfigError) as err:
        check_changes(changes, (), ckpt.Path("x/config.yaml"))
    text = str(err.value)
    assert "optim.schedule: 'constant' -> 'cosine'; rollout.num_generations: 8 -> 4" in text
    assert "optim.lr" not in text and "log.a" not in text
    assert "--resume-allow-change optim.schedule --resume-allow-change rollout.num_generations" in text
    check_changes(changes, ("optim.schedule", "rollout"), ckpt.Path("x"))  # a section allows all its keys


def test_manifest_catches_a_changed_size_and_a_changed_byte(tmp_path):
    (tmp_path / "trainer_state.pt").write_bytes(b"abcdef")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    ckpt.write_manifest(tmp_path)
    assert ckpt.verify_checkpoint(tmp_path) is None
    (tmp_path / "sub" / "w.bin").write_bytes(b"124")
    assert ckpt.verify_checkpoint(tmp_path) == "sub/w.bin does not match its checksum"
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    (tmp_path / "trainer_state.pt").write_bytes(b"abc")
    assert ckpt.verify_checkpoint(tmp_path) == "trainer_state.pt has 3 bytes, 6 were written"
    (tmp_path / "trainer_state.pt").unlink()
    assert ckpt.verify_checkpoint(tmp_path) == "trainer_state.pt is missing"


def test_apply_optim_config_rebases_the_schedule_on_the_new_lr():
    model = torch.nn.Linear(2, 1)
    old = load_config(None, ["optim.lr=1e-3", "optim.schedule=linear", "train.num_steps=10"])
    opt, sched = build_optimizer(model, old)
    for _ in range(4):
        opt.step()
        sched.step()
    state = (opt.state_dict(), sched.state_dict())
    new = load_config(None, ["optim.lr=1e-5", "optim.schedule=linear", "train.num_steps=10", "optim.weight_decay=0.1"])
    opt2, sched2 = build_optimizer(model, new)
    opt2.load_state_dict(state[0])
    sched2.load_state_dict(state[1])
    assert sched2.get_last_lr()[0] == pytest.approx(6e-4)  # the saved state wins without the rebuild
    apply_optim_config(opt2, sched2, new)
    assert sched2.get_last_lr()[0] == pytest.approx(6e-6) and opt2.param_groups[0]["lr"] == pytest.approx(6e-6)
    assert opt2.param_groups[0]["weight_decay"] == 0.1
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(5e-6)  # 1e-5 * (1 - 5/10)


def test_an_alias_renames_a_reward_so_two_of_one_kind_can_be_combined():
    a = build_reward("exact_match", kwargs={"extract": "none"})
    b = build_reward("exact_match", kwargs={"extract": "last_line"}, alias="exact_last_line", weight=0.5)
    result = score_batch([a, b], [Completion("x\n2", 2)], [Example("1+1=", answer="2")], timeout_s=None)
    assert result.components == {"exact_match": [0.0], "exact_last_line": [1.0]}
    assert result.total == [0.5]


def test_no_signal_from_config_picks_the_baseline_and_skips_process_supervision():
    assert NoSignal.from_config(load_config(None, [])).group_baseline
    ppo = NoSignal.from_config(load_config(None, ["algo.name=ppo", "train.max_no_signal_steps=7"]))
    assert not ppo.group_baseline and ppo.limit == 7
    process = NoSignal.from_config(
        load_config(None, ["algo.supervision=process", "reward.process={name: 'my_module:steps'}"])
    )
    for step in range(1, 200):
        process.observe(step, FLAT)  # outcome metrics do not see the step rewards: never judged
    assert process.in_a_row == 0
