"""grpolab convert-trl: every field of the installed TRL's GRPOConfig is accounted for, and each mapping
reproduces what TRL 1.16's GRPOTrainer computes (the TRL formulas below are copied from
trl/trainer/grpo_trainer.py: _generate_and_score_completions and _compute_loss)."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from grpolab.config import ConfigError, config_from_dict, load_config
from grpolab.trl.convert import SCRIPT_FIELDS, TRL_FIELDS, convert_trl, markdown_table, trl_defaults

trl = pytest.importorskip("trl")
DOC = Path(__file__).parents[3] / "docs" / "coming_from_trl.md"


def keys(**trl_values):
    return convert_trl(trl_values).keys


def test_the_table_holds_exactly_the_installed_grpoconfig_fields():
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init}
    assert fields - set(TRL_FIELDS) == set(), "TRL added fields: give each a rule in trl/fields.py"
    assert set(TRL_FIELDS) - fields == set(), "TRL dropped fields: remove them from trl/fields.py"
    assert set(SCRIPT_FIELDS).isdisjoint(TRL_FIELDS)


def test_a_real_grpoconfig_object_converts_with_every_field_accounted_for(tmp_path):
    cfg = trl.GRPOConfig(
        output_dir=str(tmp_path / "qwen-grpo"), use_cpu=True, learning_rate=3e-6, num_generations=4,
        per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=4, max_steps=20,
        beta=0.04, epsilon_high=0.28, loss_type="grpo", logging_steps=2, log_completions=True, save_steps=8,
        report_to=["wandb"], mask_truncated_completions=True, warmup_steps=4, lr_scheduler_type="cosine",
    )
    out = convert_trl(cfg)
    k = out.keys
    assert (k["train.prompts_per_step"], k["rollout.num_generations"], k["algo.num_minibatches"]) == (8, 4, 2)
    assert (k["train.num_steps"], k["train.micro_batch_size"], k["algo.mu"]) == (10, 8, 1)
    assert (k["optim.lr"], k["optim.schedule"], k["optim.warmup_steps"]) == (3e-6, "cosine", 4)
    assert (k["algo.beta"], k["algo.clip_low"], k["algo.clip_high"]) == (0.04, 0.2, 0.28)
    assert (k["algo.loss_agg"], k["algo.mask_truncated"]) == ("seq-mean-token-mean", True)
    assert (k["log.samples_every"], k["log.checkpoint_every"], k["log.report_to"]) == (1, 4, ["wandb"])
    assert (k["log.output_dir"], k["log.run_name"]) == (str(tmp_path), "qwen-grpo")
    assert k["model.autocast"] == "bf16"  # TRL's bf16=None becomes True
    # the use_bias_correction_kl difference is stated: the ratio is not 1 with 2 optimizer steps per batch
    assert any("use_bias_correction_kl" in n for n in out.notes)
    config_from_dict(out.config_dict())
    assert [i.split("=")[0] for i in out.ignored] == ["dataloader_pin_memory"]  # use_cpu=True turned it off


def test_a_field_unknown_to_trl_and_a_refused_value_name_themselves():
    with pytest.raises(ConfigError, match="no_such_field: not fields of TRL's GRPOConfig"):
        convert_trl({"no_such_field": 1})
    with pytest.raises(ConfigError, match=r"regex='a\+': grpolab has no constrained decoding.*neftune_noise_alpha=5"):
        convert_trl({"vllm_structured_outputs_regex": "a+", "neftune_noise_alpha": 5})


def test_not_applicable_fields_are_listed_not_converted():
    out = convert_trl({"deepspeed": "ds.json", "push_to_hub": True, "dataloader_num_workers": 4})
    assert sorted(i.split("=")[0] for i in out.ignored) == ["dataloader_num_workers", "deepspeed", "push_to_hub"]
    assert not any("deepspeed" in key for key in out.keys)


# ----------------------------------------------------------------------------- batch geometry and run length


@pytest.mark.parametrize(
    "trl_values, expected",
    [
        # TRL's default: 8 completions per device and generation = 1 prompt x 8
        ({}, {"train.prompts_per_step": 1, "algo.num_minibatches": 1, "algo.mu": 1}),
        ({"per_device_train_batch_size": 16, "num_generations": 4, "gradient_accumulation_steps": 4},
         {"train.prompts_per_step": 16, "algo.num_minibatches": 1, "train.micro_batch_size": 16}),
        ({"per_device_train_batch_size": 8, "steps_per_generation": 4, "num_iterations": 2},
         {"train.prompts_per_step": 4, "algo.num_minibatches": 4, "algo.mu": 2}),
        ({"per_device_train_batch_size": 8, "generation_batch_size": 32},
         {"train.prompts_per_step": 4, "algo.num_minibatches": 4}),
    ],
)
def test_batch_geometry(trl_values, expected):
    k = keys(**trl_values)
    assert {key: k[key] for key in expected} == expected


def test_processes_multiply_the_per_device_batch():
    k = convert_trl({"per_device_train_batch_size": 8}, num_processes=4).keys
    assert k["train.prompts_per_step"] == 4 and k["train.micro_batch_size"] == 8


def test_max_steps_counts_optimizer_steps_and_epochs_need_the_dataset_size():
    assert keys(max_steps=12, steps_per_generation=3, num_iterations=2)["train.num_steps"] == 2
    out = convert_trl({"num_train_epochs": 2}, dataset_rows=10)
    assert out.keys["train.num_steps"] == 20  # 2 epochs x 10 rows / 1 prompt per step
    assert "train.num_steps" not in keys() and any("num_train_epochs" in t for t in convert_trl({}).todo)


def test_an_optimizer_step_spanning_two_generations_is_refused():
    with pytest.raises(ConfigError, match="steps_per_generation=2 is not a multiple of gradient_accumulation"):
        keys(steps_per_generation=2, gradient_accumulation_steps=4)


# ----------------------------------------------------------------------------- advantages (scale_rewards)


def _trl_advantages(rewards, scale_rewards, g):
    """grpo_trainer._generate_and_score_completions, sum_then_normalize, one reward function."""
    mean = rewards.view(-1, g).mean(1).repeat_interleave(g)
    if scale_rewards in ("group", "none"):
        std = rewards.view(-1, g).std(1).repeat_interleave(g)
    else:
        std = rewards.std().expand_as(rewards)
    adv = rewards - mean
    return adv / (std + 1e-4) if scale_rewards != "none" else adv


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_scale_rewards_maps_to_the_estimator_that_computes_trls_advantages(scale):
    from grpolab.algo.advantages import OUTCOME_ESTIMATORS

    k = keys(scale_rewards=scale)
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.25], [2.0, 1.0, 0.0, 3.0]])  # different group means
    ours = OUTCOME_ESTIMATORS[k["algo.advantage"]](
        rewards, torch.ones_like(rewards, dtype=torch.bool), std=k["algo.std"], eps=k["algo.eps"]
    )
    torch.testing.assert_close(ours.flatten(), _trl_advantages(rewards.flatten(), scale, 4))


def test_scale_rewards_batch_is_not_batch_std():
    from grpolab.algo.advantages import grpo_advantages

    rewards = torch.tensor([[1.0, 0.0], [5.0, 4.0]])  # different group means: the two stds differ
    trl_adv = _trl_advantages(rewards.flatten(), "batch", 2)
    assert not torch.allclose(grpo_advantages(rewards, scale="batch").flatten(), trl_adv)
    assert keys(scale_rewards="batch")["algo.advantage"] == "batch_reward_std"


def test_loss_type_dr_grpo_keeps_the_group_std():
    """TRL's dr_grpo changes only the normaliser; the advantage still follows scale_rewards."""
    k = keys(loss_type="dr_grpo")
    assert (k["algo.advantage"], k["algo.loss_agg"], k["algo.beta"]) == ("grpo", "seq-mean-token-sum-norm", 0.0)
    assert keys(loss_type="dr_grpo", scale_rewards="none")["algo.advantage"] == "dr_grpo"


def test_multi_objective_normalize_then_sum_is_gdpo_whatever_scale_rewards_says():
    from grpolab.algo.gdpo import COMPONENT_ESTIMATORS

    out = convert_trl({"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "none"})
    k = out.keys
    assert k["algo.advantage"] == "gdpo" and any("not read with multi_objective_aggregation" in n for n in out.notes)
    # TRL, two functions with weights (1, 2), no missing value: each normalised in its group, summed, whitened
    per_func = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 3.0], [2.0, 1.0], [2.0, 4.0], [1.0, 0.0]])
    weights = torch.tensor([1.0, 2.0])
    grouped = per_func.view(-1, 3, 2)
    normed = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1, 2)
    summed = (normed * weights).sum(1)
    trl_adv = (summed - summed.mean()) / (summed.std() + 1e-4)
    ours = COMPONENT_ESTIMATORS["gdpo"](
        per_func.view(2, 3, 2), torch.ones(2, 3, 2, dtype=torch.bool), weights, std=k["algo.std"], eps=k["algo.eps"]
    )
    torch.testing.assert_close(ours.flatten(), trl_adv)
    with pytest.raises(ConfigError, match="sum_then_normalize and normalize_then_sum"):
        keys(multi_objective_aggregation="mean")


# ----------------------------------------------------------------------------- the loss normaliser (loss_type)


def _trl_loss(per_token_loss, mask, loss_type, max_len, accumulation):
    """_compute_loss's aggregation over `accumulation` equal micro-batches, summed as gradient accumulation
    does; dapo's normaliser is the generation batch's tokens (steps_per_generation = accumulation)."""
    total = 0.0
    num_items = mask.sum()
    for lo, m in zip(per_token_loss.chunk(accumulation), mask.chunk(accumulation), strict=True):
        if loss_type in ("grpo", "sapo"):
            loss = ((lo * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / accumulation
        elif loss_type == "bnpo":
            loss = (lo * m).sum() / m.sum().clamp(min=1.0) / accumulation
        elif loss_type == "dr_grpo":
            loss = (lo * m).sum() / (lo.size(0) * max_len) / accumulation
        elif loss_type == "luspo":
            loss = (lo * m).sum(-1).mean() / accumulation
        else:  # dapo, cispo, vespo
            loss = (lo * m).sum() / (num_items.clamp(min=1.0) * accumulation / accumulation)
        total = total + loss
    return total


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "sapo", "luspo", "vespo"])
def test_loss_type_maps_to_the_aggregation_that_computes_trls_loss(loss_type):
    from grpolab.algo.losses import aggregate

    gen = torch.Generator().manual_seed(0)
    per_token = torch.randn(8, 6, generator=gen)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    k = keys(loss_type=loss_type, max_completion_length=6, per_device_train_batch_size=2,
             gradient_accumulation_steps=4, num_generations=2)
    # grpolab: the micro-batches of one minibatch, each scaled by the minibatch totals
    ours = sum(
        aggregate(lo, m, k["algo.loss_agg"], norm_len=k["rollout.max_completion_length"], total_seqs=8,
                  total_tokens=float(mask.sum()))
        for lo, m in zip(per_token.chunk(4), mask.chunk(4), strict=True)
    )
    torch.testing.assert_close(ours, _trl_loss(per_token, mask, loss_type, 6, 4))


def test_bnpo_is_batch_token_mean_over_trls_micro_batches():
    from grpolab.algo.losses import aggregate, batch_row_norms

    gen = torch.Generator().manual_seed(1)
    per_token, mask = torch.randn(8, 5, generator=gen), torch.rand(8, 5, generator=gen) > 0.3
    k = keys(loss_type="bnpo", per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=4)
    assert (k["algo.loss_agg"], k["algo.loss_agg_batch_rows"]) == ("batch-token-mean", 2)
    # TRL's micro-batches of 2 rows in the order its shuffle left them; grpolab's batches of 2 in the same order
    norms = batch_row_norms(mask, k["algo.loss_agg_batch_rows"])
    ours = aggregate(per_token, mask, k["algo.loss_agg"], row_norm=norms)
    torch.testing.assert_close(ours, _trl_loss(per_token, mask, "bnpo", 5, 4))
    # at one row per micro-batch it is grpo
    torch.testing.assert_close(_trl_loss(per_token, mask, "bnpo", 5, 8), _trl_loss(per_token, mask, "grpo", 5, 8))


def test_a_loss_type_trl_lacks_is_refused():
    with pytest.raises(ConfigError, match="no 'gmpo' loss"):
        keys(loss_type="gmpo")


def test_vespo_takes_its_gamma_coefficients_and_a_token_level_ratio():
    out = convert_trl({"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_neg": 2.5,
                       "importance_sampling_level": "sequence"})  # fmt: skip
    k = out.keys
    assert (k["algo.policy_loss"], k["algo.loss_agg"], k["algo.importance_level"]) == ("vespo", "token-mean", "token")
    assert (k["algo.vespo_k_pos"], k["algo.vespo_lambda_pos"], k["algo.vespo_k_neg"], k["algo.vespo_lambda_neg"]) == (
        1.5, 3.0, 3.0, 2.5,
    )  # fmt: skip
    assert any("VESPO's loss builds its own sequence weight" in n for n in out.notes)
    config_from_dict(out.config_dict())


def test_sapo_takes_its_temperatures_and_no_clip():
    k = keys(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.2, epsilon_high=0.28, delta=3.0)
    assert (k["algo.policy_loss"], k["algo.loss_agg"]) == ("sapo", "seq-mean-token-mean")
    assert (k["algo.sapo_temperature_pos"], k["algo.sapo_temperature_neg"]) == (0.9, 1.2)
    assert not any(key.startswith(("algo.clip", "algo.dual_clip")) for key in k)  # TRL's sapo reads no epsilon
    config_from_dict(convert_trl({"loss_type": "sapo"}).config_dict())


def test_luspo_is_the_clipped_loss_summed_over_each_sequence():
    out = convert_trl({"loss_type": "luspo", "importance_sampling_level": "sequence"})
    assert (out.keys["algo.policy_loss"], out.keys["algo.loss_agg"]) == ("clip", "seq-mean-token-sum")
    assert out.keys["algo.importance_level"] == "sequence" and not any("LUSPO" in n for n in out.notes)
    assert any("LUSPO's paper" in n for n in convert_trl({"loss_type": "luspo"}).notes)


def test_off_policy_mask_and_top_entropy_quantile_map_to_their_keys():
    out = convert_trl({"off_policy_mask_threshold": 0.5, "use_vllm": True, "top_entropy_quantile": 0.2})
    assert (out.keys["algo.off_policy_mask_threshold"], out.keys["algo.top_entropy_quantile"]) == (0.5, 0.2)
    assert not any("quantile" in n or "log-probs" in n for n in out.notes)  # TRL's quantile spans the same rows
    out = convert_trl({"off_policy_mask_threshold": 0.5, "top_entropy_quantile": 0.2, "gradient_accumulation_steps": 4})
    assert any("the trainer's own log-probs" in n for n in out.notes)
    assert any("over the optimizer step's (4 micro-steps)" in n for n in out.notes)
    assert keys()["algo.off_policy_mask_threshold"] is None and keys()["algo.top_entropy_quantile"] == 1.0
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\]"):
        keys(top_entropy_quantile=1.5)


# ----------------------------------------------------------------------------- clipping, KL, entropy


def _trl_clip_loss(logps, old, adv, eps_low, eps_high, delta):
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * adv, coef_2 * adv)


def _ratio_cases():
    old = torch.zeros(2, 5)
    logps = torch.log(torch.tensor([[0.5, 0.9, 1.0, 1.5, 4.0], [0.5, 0.9, 1.0, 1.5, 4.0]]))
    adv = torch.tensor([[1.0], [-1.0]])
    return logps, old, adv


@pytest.mark.parametrize("delta", [None, 3.0])
def test_epsilon_epsilon_high_and_delta_give_trls_clipped_loss(delta):
    from grpolab.algo.losses import clipped_surrogate_loss

    k = keys(epsilon=0.2, epsilon_high=0.28, delta=delta)
    logps, old, adv = _ratio_cases()
    ours = clipped_surrogate_loss(
        logps, old, adv[:, 0], clip_low=k["algo.clip_low"], clip_high=k["algo.clip_high"], dual_clip=k["algo.dual_clip"]
    ).loss
    torch.testing.assert_close(ours, _trl_clip_loss(logps, old, adv, 0.2, 0.28, delta))


def test_a_delta_inside_the_clip_range_is_refused():
    with pytest.raises(ConfigError, match="delta=1.1"):
        keys(delta=1.1)


def test_cispo_caps_the_weight_at_epsilon_high_itself():
    from grpolab.algo.losses import cispo_loss

    k = keys(loss_type="cispo", epsilon_high=5.0)
    assert (k["algo.name"], k["algo.policy_loss"], k["algo.loss_agg"]) == ("cispo", "cispo", "token-mean")
    logps, old, adv = _ratio_cases()
    logps = logps * 2  # ratios up to 16: past the cap of 5
    ours = cispo_loss(logps, old, adv[:, 0], clip_low=k["algo.clip_low"], clip_high=k["algo.clip_high"]).loss
    trl_loss = -torch.clamp(torch.exp(logps - old), max=5.0) * adv * logps  # loss_type == "cispo"
    torch.testing.assert_close(ours, trl_loss)
    # epsilon_high defaults to epsilon = 0.2: TRL caps every weight at 0.2 (clip_high -0.8), said in a note
    k = keys(loss_type="cispo")
    assert (k["algo.clip_low"], k["algo.clip_high"]) == (1.0, pytest.approx(-0.8))
    ours = cispo_loss(logps, old, adv[:, 0], clip_low=k["algo.clip_low"], clip_high=k["algo.clip_high"]).loss
    torch.testing.assert_close(ours, -torch.clamp(torch.exp(logps - old), max=0.2) * adv * logps)
    load_config(None, ["algo.name=cispo", "algo.clip_low=1.0", "algo.clip_high=-0.8"])  # a valid config
    with pytest.raises(ConfigError, match="cispo: clip_high down to > -1"):
        load_config(None, ["algo.name=cispo", "algo.clip_low=0.5", "algo.clip_high=-0.8"])  # an empty range


def test_beta_uses_trls_k3_in_the_loss():
    from grpolab.algo.kl import KL_ESTIMATORS

    k = keys(beta=0.04)
    assert (k["algo.beta"], k["algo.kl_in"]) == (0.04, "loss")
    logps, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    trl_kl = torch.exp(ref - logps) - (ref - logps) - 1
    torch.testing.assert_close(KL_ESTIMATORS[k["algo.kl_estimator"]](logps, ref), trl_kl)


def test_sync_ref_model_resets_or_mixes_the_reference_as_tr_dpo():
    assert keys(beta=0.04, sync_ref_model=True, ref_model_mixup_alpha=1.0, ref_model_sync_steps=64,
                steps_per_generation=2, per_device_train_batch_size=8)["algo.ref_reset_every"] == 32
    assert keys()["algo.ref_reset_every"] == 0
    k = keys(sync_ref_model=True)  # TRL's defaults: alpha 0.6 every 512 optimizer steps
    assert (k["algo.ref_reset_every"], k["algo.ref_mixup_alpha"]) == (512, 0.6)


def test_the_reference_mixes_in_the_policy_by_alpha():
    """pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (TR-DPO's soft update, TRL's sync_ref_model)."""
    from grpolab.models.loading import Reference
    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    policy = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    reference = Reference(policy, torch.float32)
    ref_before = {k: v.clone() for k, v in reference.frozen_model.state_dict().items()}
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    reference.reset_to(policy, alpha=0.6)
    for name, value in reference.frozen_model.state_dict().items():  # 0.6 (w + 1) + 0.4 w = w + 0.6
        torch.testing.assert_close(value, ref_before[name] + 0.6)
    reference.reset_to(policy, alpha=1.0)
    for name, value in reference.frozen_model.state_dict().items():
        torch.testing.assert_close(value, policy.state_dict()[name])


def test_entropy_coef_and_its_adaptive_form():
    assert keys(entropy_coef=0.01)["algo.entropy_coef"] == 0.01
    assert keys(entropy_coef=0.01, entropy_target=3.0)["algo.entropy_adaptive"] is False
    k = keys(entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=3.0, entropy_coef_delta=0.002)
    got = {n: k[f"algo.{n}"] for n in ("entropy_adaptive", "entropy_coef", "entropy_target", "entropy_coef_delta",
                                       "entropy_coef_min", "entropy_coef_max")}  # fmt: skip
    assert got == {"entropy_adaptive": True, "entropy_coef": 0.01, "entropy_target": 3.0, "entropy_coef_delta": 0.002,
                   "entropy_coef_min": 0.0, "entropy_coef_max": 1.0}  # fmt: skip


def test_cast_lm_head_to_fp32_is_model_lm_head_fp32():
    assert keys(cast_lm_head_to_fp32=True)["model.lm_head_fp32"] is True
    assert keys(cast_lm_head_to_fp32=False)["model.lm_head_fp32"] is False


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_vllm_importance_sampling_maps_to_the_rollout_correction(mode):
    from grpolab.algo.correction import rollout_correction_weights

    k = keys(use_vllm=True, vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=2.0)
    old = torch.tensor([[-1.0, -0.2, -3.0], [-0.5, -0.5, -0.1]])
    sampler = torch.tensor([[-1.2, -1.5, -2.0], [-0.4, -0.6, -0.1]])
    mask = torch.ones_like(old, dtype=torch.bool)
    ours = rollout_correction_weights(
        old, sampler, mask, mode=k["algo.rollout_correction"], level=k["algo.rollout_correction_level"],
        cap=k["algo.rollout_correction_cap"],
    )
    diff = old - sampler  # TRL: per token, or summed per sequence
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    trl_w = ratio.clamp(max=2.0) if mode.endswith("truncate") else ratio.masked_fill(ratio > 2.0, 0.0)
    torch.testing.assert_close(ours, trl_w.expand_as(old))
    assert keys()["algo.rollout_correction"] == "none"  # TRL corrects vLLM's samples only
    with pytest.raises(ConfigError, match="from above only"):
        keys(use_vllm=True, vllm_importance_sampling_clip_min=0.5)


# ----------------------------------------------------------------------------- optimizer, model, logging


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_lr_schedule_follows_transformers_after_the_warmup(schedule):
    from transformers import get_scheduler

    from grpolab.training.optim import lr_lambda

    k = keys(lr_scheduler_type=schedule, warmup_steps=2, max_steps=10)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(schedule, opt, num_warmup_steps=2, num_training_steps=10)
    theirs = []
    for _ in range(10):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [lr_lambda(s, warmup=k["optim.warmup_steps"], total=10, schedule=k["optim.schedule"]) for s in range(10)]
    start = k["optim.warmup_steps"]  # warm-up differs by one step (noted); the schedule after it is TRL's
    assert ours[start:] == pytest.approx(theirs[start:], abs=1e-9)
    assert keys(warmup_steps=0.25, max_steps=8)["optim.warmup_steps"] == 2  # a fraction of 8 optimizer steps


def test_optimizer_precision_and_model_fields():
    k = keys(learning_rate=2e-5, adam_beta1=0.8, adam_beta2=0.95, weight_decay=0.1, max_grad_norm=0.5,
             bf16=False, gradient_checkpointing=False, model_init_kwargs={"dtype": "bfloat16"}, seed=7)
    assert (k["optim.lr"], k["optim.betas"], k["optim.weight_decay"], k["optim.max_grad_norm"]) == (
        2e-5, [0.8, 0.95], 0.1, 0.5
    )
    assert (k["model.autocast"], k["model.gradient_checkpointing"], k["model.dtype"], k["seed"]) == (
        "none", False, "bfloat16", 7
    )
    for bad, match in [({"fp16": True, "bf16": False}, "fp16"), ({"optim": "adafactor"}, "AdamW"),
                       ({"model_init_kwargs": {"device_map": "auto"}}, "device_map"),
                       ({"lr_scheduler_type": "polynomial"}, "polynomial"), ({"adam_epsilon": 1e-6}, "eps")]:
        with pytest.raises(ConfigError, match=match):
            keys(**bad)


def test_logging_checkpoint_and_eval_fields():
    k = keys(save_steps=100, save_total_limit=3, logging_steps=10, log_completions=True, max_steps=400,
             steps_per_generation=2, per_device_train_batch_size=8, report_to="none", project="p",
             eval_strategy="steps", eval_steps=50, num_generations_eval=4, shuffle_dataset=False)
    assert (k["log.checkpoint_every"], k["log.keep_last"], k["log.samples_every"]) == (50, 3, 5)
    assert (k["log.report_to"], k["log.project"], k["data.shuffle"]) == ([], "p", False)
    assert (k["eval.every"], k["eval.num_samples"], k["train.num_steps"]) == (25, 4, 200)
    assert keys(max_steps=10, save_steps=5)["log.keep_last"] == 10  # TRL keeps every checkpoint
    assert keys(eval_strategy="steps", logging_steps=3)["eval.every"] == 3  # eval_steps defaults to logging_steps
    with pytest.raises(ConfigError, match="mlflow"):
        keys(report_to=["mlflow"])


def test_sampling_fields():
    k = keys(temperature=0.7, top_p=0.9, top_k=50, max_completion_length=1024, importance_sampling_level="sequence",
             mask_truncated_completions=True)
    assert (k["rollout.temperature"], k["rollout.top_p"], k["rollout.top_k"]) == (0.7, 0.9, 50)
    assert (k["rollout.max_completion_length"], k["algo.importance_level"], k["algo.mask_truncated"]) == (
        1024, "sequence", True
    )
    # min-p and the repetition penalty shape the draw only, in TRL (its log-probs are of logits / T) and here
    assert (k["rollout.min_p"], k["rollout.repetition_penalty"]) == (0.0, 1.0)  # TRL's None and 1.0
    k = keys(min_p=0.05, repetition_penalty=1.1)
    assert (k["rollout.min_p"], k["rollout.repetition_penalty"]) == (0.05, 1.1)


def test_script_fields_give_model_data_lora_and_trls_own_reward_functions():
    k = keys(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", dataset_name="trl-lib/DeepMath-103K",
             use_peft=True, lora_r=8, reward_funcs=["accuracy_reward", "my_pkg.rewards.brevity"],
             reward_weights=[1.0, 0.5])
    assert (k["model.name_or_path"], k["data.source"], k["data.path"]) == (
        "Qwen/Qwen2.5-0.5B-Instruct", "hf", "trl-lib/DeepMath-103K"
    )
    assert (k["model.lora.enabled"], k["model.lora.r"]) == (True, 8)
    assert k["reward.functions"] == [
        {"name": "trl.rewards:accuracy_reward", "kind": "trl", "weight": 1.0},
        {"name": "my_pkg.rewards:brevity", "kind": "trl", "weight": 0.5},
    ]
    # a LoRA on a Mixture-of-Experts' stacked expert weights (peft's target_parameters): those alone, as peft does
    k = keys(use_peft=True, lora_target_parameters=["mlp.experts.down_proj"])
    assert (k["model.lora.target_parameters"], k["model.lora.target_modules"]) == (["mlp.experts.down_proj"], [])
    assert config_from_dict(convert_trl({"use_peft": True, "lora_target_parameters": ["mlp.experts.down_proj"],
                                         "use_cpu": True, "bf16": False}).config_dict()).model.lora.target_modules == ()


def test_trl_cli_args_and_yaml(tmp_path):
    trl_yaml = tmp_path / "trl.yaml"
    trl_yaml.write_text("learning_rate: 1e-6\nnum_generations: 4\nbeta: 0.0\n")
    out = convert_trl(["--config", str(trl_yaml), "--beta", "0.02", "--no_shuffle_dataset", "--report_to",
                       "wandb", "tensorboard", "--max_steps=5"])
    k = out.keys
    assert (k["optim.lr"], k["rollout.num_generations"], k["algo.beta"]) == (1e-6, 4, 0.02)
    assert (k["data.shuffle"], k["log.report_to"], k["train.num_steps"]) == (False, ["wandb", "tensorboard"], 5)
    assert convert_trl(trl_yaml).keys["optim.lr"] == 1e-6  # YAML reads 1e-6 as text; TRL's field is a float
    assert convert_trl([str(trl_yaml), "--num_generations", "2"]).keys["rollout.num_generations"] == 2
    with pytest.raises(ConfigError, match="expected a TRL YAML file or --field value"):
        convert_trl(["learning_rate", "1e-6"])


def test_the_cli_writes_a_config_that_loads(tmp_path, capsys):
    from grpolab.cli import main
    from grpolab.config import load_config

    out = tmp_path / "grpolab.yaml"
    assert main(["convert-trl", "--out", str(out), "--learning_rate", "1e-5", "--max_steps", "3",
                 "--model_name_or_path", "m", "--dataset_name", "d.jsonl"]) == 0
    assert "fill in: reward.functions" in capsys.readouterr().err
    cfg = load_config(out)
    assert (cfg.optim.lr, cfg.train.num_steps, cfg.data.source) == (1e-5, 3, "jsonl")
    assert main(["convert-trl", "--loss_type", "gmpo"]) == 2
    assert capsys.readouterr().err.startswith("grpolab: error: convert-trl: grpolab cannot reproduce loss_type")


def test_the_doc_shows_the_table():
    assert markdown_table() in DOC.read_text(), "docs/coming_from_trl.md differs from markdown_table(): paste it"


def test_defaults_come_from_the_installed_trl():
    d = trl_defaults()
    assert (d["loss_type"], d["beta"], d["num_generations"]) == ("dapo", 0.0, 8)
    assert math.isclose(d["learning_rate"], 1e-6)


def test_model_device_sharding_and_run_name_fields():
    out = convert_trl({"trust_remote_code": True, "use_cpu": True, "fsdp": "full_shard", "disable_dropout": True,
                       "output_dir": "runs/a", "run_name": "b"})
    k = out.keys
    assert (k["model.trust_remote_code"], k["model.device"], k["train.parallel"]) == (True, "cpu", "fsdp")
    assert (k["log.output_dir"], k["log.run_name"]) == ("runs", "a")
    here = Path.cwd()  # TRL writes into output_dir itself; log.run_name is a plain name
    assert (keys(output_dir=".")["log.output_dir"], keys(output_dir=".")["log.run_name"]) == (str(here.parent), here.name)
    assert any("run_name='b'" in n for n in out.notes) and not any("disable_dropout" in n for n in out.notes)
    assert "model.device" not in keys() and "train.parallel" not in keys()
    assert any("disable_dropout=False" in n for n in convert_trl({}).notes)
    assert (keys(full_determinism=True)["train.deterministic"], keys()["train.deterministic"]) == (True, False)


def test_trls_named_rewards_build_as_trl_style_rewards():
    from grpolab.rewards import build_reward

    spec = keys(reward_funcs=["think_format_reward"])["reward.functions"][0]
    reward = build_reward(spec["name"], kind=spec["kind"])
    assert reward.name == "think_format_reward"
    with pytest.raises(ConfigError, match="soft_overlong"):
        keys(reward_funcs=["get_soft_overlong_punishment"])


def test_chat_template_kwargs_are_the_datas():
    assert keys(chat_template_kwargs={"enable_thinking": False})["data.chat_template_kwargs"] == {"enable_thinking": False}
    assert keys()["data.chat_template_kwargs"] == {}  # TRL's None: the template's defaults
