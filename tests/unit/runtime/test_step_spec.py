"""The config read once into the step's spec: each setting bound where the step will call it."""

from __future__ import annotations

import pytest
import torch

from grpolab.algo.kl import kl_k3
from grpolab.algo.losses import AGGREGATIONS, cispo_loss, clipped_surrogate_loss
from grpolab.algo.soft import sapo_loss
from grpolab.config import load_config
from grpolab.runtime.step_spec import (
    critic_optim,
    logprob_context,
    policy_loss_spec,
    run_optimizer,
    sampling_spec,
    update_spec,
    value_model_spec,
)

MASK = torch.tensor([[True, True], [True, False]])


def test_the_loss_settings_are_bound_functions():
    overrides = ["algo.name=dr_grpo", "rollout.max_completion_length=8", "algo.beta=0.04", "algo.clip_high=0.28", "algo.mu=2"]
    cfg = load_config(None, overrides)
    spec = policy_loss_spec(cfg)
    assert spec.aggregate.reduce is AGGREGATIONS["seq-mean-token-sum-norm"] and spec.aggregate.norm_len == 8
    assert spec.surrogate.func is clipped_surrogate_loss
    assert spec.surrogate.keywords == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None, "level": "token"}
    assert spec.kl is kl_k3 and spec.beta == 0.04  # algo.kl_in=loss with beta > 0
    assert spec.correction is None and not spec.correction_in_loss
    # ratio 2 on every counted token, advantage 1: clipped at 1.28 (the 2 tokens of row 0 and 1 of row 1)
    lp = torch.log(torch.full((2, 2), 2.0))
    sur = spec.surrogate(lp, torch.zeros(2, 2), torch.ones(2), mask=MASK)
    torch.testing.assert_close(sur.loss, torch.tensor([[-1.28, -1.28], [-1.28, 0.0]]))


def test_each_loss_gets_its_own_coefficients():
    sapo = policy_loss_spec(load_config(None, ["algo.policy_loss=sapo", "algo.sapo_temperature_neg=2", "algo.mu=2"]))
    assert sapo.surrogate.func is sapo_loss and sapo.surrogate.keywords["temperature_neg"] == 2
    cispo = policy_loss_spec(load_config(None, ["algo.name=cispo", "algo.rollout_correction=tis", "train.prompts_per_step=16"]))
    assert cispo.surrogate.func is cispo_loss and cispo.correction.keywords["mode"] == "tis"
    rloo = policy_loss_spec(load_config(None, ["algo.name=rloo"]))
    assert rloo.kl is None  # RLOO's KL is in the reward


@pytest.mark.parametrize(("device", "rows"), [("cpu", 64), ("cuda", 8)])
def test_the_forwards_settings_travel_in_one_context(device, rows):
    cfg = load_config(None, ["rollout.temperature=0.7", "train.padding_free=true", "train.max_tokens_per_micro_batch=2048"])
    ctx = logprob_context(cfg, pad_id=3, autocast_dtype=torch.bfloat16, device_type=device)
    assert (ctx.pad_id, ctx.temperature, ctx.autocast_dtype) == (3, 0.7, torch.bfloat16)
    assert (ctx.micro_batch_size, ctx.max_tokens, ctx.padding_free) == (rows, 2048, True)  # "auto" rows by device
    update = update_spec(load_config(None, ["algo.mu=3", "algo.num_minibatches=2", "optim.max_grad_norm=0.5"]), ctx)
    assert (update.mu, update.num_minibatches, update.max_grad_norm) == (3, 2, 0.5) and update.logprobs is ctx


def test_the_sampling_spec_holds_dapos_rounds_the_failed_group_stop_and_the_reward_bounds():
    cfg = load_config(None, [
        "algo.name=dapo", "train.prompts_per_step=16", "rollout.num_generations=4", "algo.max_sampling_rounds=3",
        "train.max_failed_group_share=0.25", "reward.timeout_s=7", "reward.max_retries=2",
    ])  # fmt: skip
    spec = sampling_spec(cfg)
    assert (spec.prompts_per_step, spec.num_generations, spec.dynamic_sampling, spec.max_sampling_rounds) == (16, 4, True, 3)
    assert (spec.max_failed_group_share, spec.reward_timeout_s, spec.reward_max_retries) == (0.25, 7.0, 2)
    assert sampling_spec(load_config(None, [])).dynamic_sampling is False  # GRPO's preset: null resolved to False


def test_the_value_model_comes_from_algo_value_init_with_the_policy_s_model_section():
    cfg = load_config(None, [
        "algo.name=ppo", "algo.value_init=reward_model", "algo.value_init_path=/rm", "data.max_prompt_length=100",
        "rollout.max_completion_length=28",
    ])  # fmt: skip
    spec = value_model_spec(cfg)
    assert spec.model is cfg.model and (spec.init, spec.init_path) == ("reward_model", "/rm")
    assert (spec.sequence_parallel, spec.longest_sequence) == (1, 128)


def test_the_schedule_spans_every_optimizer_step_and_the_critic_takes_value_lr():
    cfg = load_config(None, [
        "algo.name=ppo", "train.num_steps=5", "algo.mu=2", "algo.num_minibatches=2", "optim.schedule=linear",
        "optim.lr=1e-3", "algo.value_lr=1e-2",
    ])  # fmt: skip
    model = torch.nn.Linear(2, 1)
    optimizer, scheduler = run_optimizer(cfg, model)
    for _ in range(10):  # 5 steps x 4 optimizer steps = 20: half way, the linear schedule is at half the rate
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.5e-3)
    assert critic_optim(cfg).lr == 1e-2 and critic_optim(load_config(None, ["algo.name=ppo", "optim.lr=3e-4"])).lr == 3e-4
    _, critic_scheduler = run_optimizer(cfg, torch.nn.Linear(2, 1), critic_optim(cfg))
    assert critic_scheduler.get_last_lr()[0] == pytest.approx(1e-2)
