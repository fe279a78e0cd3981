"""The paper presets end to end on a tiny model: DAPO with dynamic sampling (and rollout correction and an
entropy bonus) resumes exactly; REINFORCE++ trains with one completion per prompt."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from grpolab.commands.train import train
from grpolab.config import load_config
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics


def _cfg(model_dir, dataset, out, name, steps, *extra):
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.path={dataset}",
            "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
            "rollout.num_generations=4",
            "rollout.max_completion_length=4",
            "train.prompts_per_step=2",
            f"train.num_steps={steps}",
            "train.micro_batch_size=8",
            "optim.lr=1e-3",
            f"log.output_dir={out}",
            f"log.run_name={name}",
            "log.checkpoint_every=1",
            "log.progress=false",
            "log.tensorboard=false",
            *extra,
        ],
    )


DAPO = (
    "algo.name=dapo",
    "algo.num_minibatches=2",
    "algo.mask_truncated=false",  # the untrained model never stops within 4 tokens
    "algo.rollout_correction=tis",
    "algo.entropy_coef=0.01",
)


def test_dapo_with_dynamic_sampling_resumes_exactly(tiny_model_dir, addition_jsonl, tmp_path):
    dataset = addition_jsonl(64)
    whole = train(_cfg(tiny_model_dir, dataset, tmp_path, "whole", 2, *DAPO))
    rows = read_metrics(whole.run_dir)
    for r in rows:
        assert r["train/groups_kept"] >= 1 and r["train/sampling_rounds"] >= 1
        assert r["frac_reward_zero_std"] == 0.0 or r["train/groups_kept"] < 2  # only groups with a signal
        assert r["sampling/sampling_logp_difference/mean"] >= 0 and 0 < r["sampling/importance_sampling_ratio/mean"] <= 2
    drawn = [sum(r["train/groups_drawn"] for r in rows[: i + 1]) for i in range(len(rows))]
    g = _cfg(tiny_model_dir, dataset, tmp_path, "whole", 2, *DAPO).rollout.num_generations
    assert [r["sys/samples_seen"] for r in rows] == [n * g for n in drawn]  # every round's samples count
    train(_cfg(tiny_model_dir, dataset, tmp_path, "parts", 1, *DAPO))
    resumed = train(_cfg(tiny_model_dir, dataset, tmp_path, "parts", 2, *DAPO), resume=True)
    a = load_file(latest_checkpoint(whole.run_dir) / "model.safetensors")
    b = load_file(latest_checkpoint(resumed.run_dir) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    last = read_metrics(resumed.run_dir)[-1]
    assert last["train/groups_drawn"] == rows[-1]["train/groups_drawn"]
    assert last["sys/samples_seen"] == rows[-1]["sys/samples_seen"]  # the count resumes with the data sampler


def test_reinforce_pp_trains_with_one_completion_per_prompt(tiny_model_dir, addition_jsonl, tmp_path):
    # 16 prompts: the batch is REINFORCE++'s baseline, and 2 replies of 4 random characters both hold no digit
    # (the same reward: no gradient) a third of the time; 16 all alike, about 2 in 10,000
    cfg = _cfg(
        tiny_model_dir, addition_jsonl(64), tmp_path, "rpp", 1, "algo.name=reinforce_pp", "rollout.num_generations=1",
        "train.prompts_per_step=16",
    )
    result = train(cfg)
    row = read_metrics(result.run_dir)[0]
    assert torch.isfinite(torch.tensor(row["loss"])) and row["grad_norm"] > 0
    assert "beta: 0.01" in (result.run_dir / "config.yaml").read_text()


TRL_1_16 = {
    "gdpo_sapo_masks": ("algo.advantage=gdpo", "algo.policy_loss=sapo", "algo.off_policy_mask_threshold=0.0",
                        "algo.top_entropy_quantile=0.2"),
    "vespo_tis": ("algo.advantage=batch_reward_std", "algo.policy_loss=vespo", "algo.loss_agg=token-mean",
                  "algo.rollout_correction=tis"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRL_1_16))
def test_trl_1_16_options_train_end_to_end(tiny_model_dir, addition_jsonl, tmp_path, name):
    """GDPO advantages from the two reward functions, SAPO's gate, the off-policy sequence mask and the 80/20
    entropy mask together; VESPO with the rollout weights in its sequence weight: each run trains."""
    options = ("algo.num_minibatches=2", "algo.beta=0", *TRL_1_16[name])
    result = train(_cfg(tiny_model_dir, addition_jsonl(64), tmp_path, name, 2, *options))
    for row in read_metrics(result.run_dir):
        assert torch.isfinite(torch.tensor(row["loss"])) and row["grad_norm"] > 0
        assert row["clip_ratio/region_mean"] == 0.0  # neither loss clips
        if "masks" in name:
            assert 0.0 <= row["loss/off_policy_masked_frac"] <= 1.0
