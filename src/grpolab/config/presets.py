"""algo.name -> the paper's recipe: the value of every algo field a preset fills (README "Presets", docs/presets.md).

A field the user sets explicitly wins; the others are filled from here when AlgoConfig is built.
"""

from __future__ import annotations

from typing import Any

# DeepSeekMath GRPO (arXiv 2402.03300, Eq. 3 and Sec. 4.2): every preset states every field it fills.
_GRPO: dict[str, Any] = {
    "advantage": "grpo",
    "loss_agg": "seq-mean-token-mean",
    "policy_loss": "clip",
    "importance_level": "token",
    "kl_in": "loss",
    "kl_estimator": "k3",
    "beta": 0.04,
    "clip_low": 0.2,
    "mu": 1,
    "num_minibatches": 1,
    "dynamic_sampling": False,
    "mask_truncated": False,
}

# algo.name -> the paper's recipe for every algo field left null. README "Presets" has the table.
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": _GRPO,
    # Dr. GRPO (arXiv 2503.20783): no std, constant normaliser (max completion length), no KL.
    "dr_grpo": {**_GRPO, "advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm", "beta": 0.0},
    # DAPO (arXiv 2503.14476): Clip-Higher 0.2/0.28, token-mean, no KL, dynamic sampling, overlong
    # filtering; 512 prompts x 16 in mini-batches of 512 completions = 16 updates per rollout. The soft
    # overlong punishment is a reward: add reward.functions soft_overlong.
    "dapo": {
        **_GRPO,
        "loss_agg": "token-mean",
        "beta": 0.0,
        "clip_high": 0.28,
        "num_minibatches": 16,
        "dynamic_sampling": True,
        "mask_truncated": True,
    },
    # GSPO (arXiv 2507.18071, Sec. 5.1): sequence ratio, clip 3e-4 / 4e-4, no KL, 4 minibatches per rollout.
    "gspo": {
        **_GRPO,
        "importance_level": "sequence",
        "beta": 0.0,
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "num_minibatches": 4,
    },
    # CISPO (MiniMax-M1, arXiv 2506.13585, Eqs. 4-5): clipped stop-gradient IS weight on a REINFORCE term,
    # token-mean, no lower bound on the weight; the paper gives no upper value: 5 (= 1 + 4) as ScaleRL
    # (arXiv 2510.13786) and TRL. DAPO's 16 updates per rollout, the setting CISPO is compared in.
    "cispo": {
        **_GRPO,
        "policy_loss": "cispo",
        "loss_agg": "token-mean",
        "beta": 0.0,
        "clip_low": 1.0,
        "clip_high": 4.0,
        "num_minibatches": 16,
    },
    # RLOO (arXiv 2402.14740): leave-one-out baseline, sequence log-prob (sum over tokens, 1/G), KL (k1)
    # subtracted from the sequence reward; beta 0.05 as TRL's RLOOConfig.
    "rloo": {
        **_GRPO,
        "advantage": "rloo",
        "loss_agg": "seq-mean-token-sum",
        "kl_in": "reward",
        "kl_estimator": "k1",
        "beta": 0.05,
    },
    # Online RFT (DeepSeekMath Eqs. 10-11): I(correct) * (1/|o|) sum_t log pi, no KL.
    "online_rft": {**_GRPO, "advantage": "online_rft", "beta": 0.0},
    # REINFORCE++ (arXiv 2501.03262, Eqs. 8-10): k1 KL in every token's reward, return-to-go, whitened over
    # the batch's tokens; beta 0.01 as OpenRLHF's example (the paper does not pin one). Its PPO-style clip
    # acts only if the policy moves within a rollout, so the rollout is split into mini-batches as in verl's
    # and OpenRLHF's recipes (verl's example: 1024 / 256 = 4); 2 here, which any even prompts_per_step allows.
    "reinforce_pp": {
        **_GRPO,
        "advantage": "reinforce_pp",
        "loss_agg": "token-mean",
        "kl_in": "reward",
        "kl_estimator": "k1",
        "beta": 0.01,
        "num_minibatches": 2,
    },
    # REINFORCE++-baseline (same paper): group mean, then token-weighted batch whitening; k2 KL loss,
    # beta 1e-3 as OpenRLHF's example.
    "reinforce_pp_baseline": {
        **_GRPO,
        "advantage": "reinforce_pp_baseline",
        "loss_agg": "token-mean",
        "kl_estimator": "k2",
        "beta": 1e-3,
    },
    # PPO as DeepSeekMath Eqs. 1-2 write it: GAE with a critic, k1 KL in the per-token reward, (1/|o|)
    # sum_t per completion like GRPO, so `grpolab compare` isolates the critic (TRL and verl use token-mean).
    # Mini-batches per rollout (verl's PPO example: 1024 / 256 = 4; 2 here, as reinforce_pp) so that the ratio
    # clip and the value clip act.
    "ppo": {**_GRPO, "advantage": "gae", "kl_in": "reward", "kl_estimator": "k1", "num_minibatches": 2},
}
