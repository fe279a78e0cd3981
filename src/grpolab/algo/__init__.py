"""The pure math of grpolab: advantages, KL estimators, losses and masked reductions.

Tensors and scalars in, tensors out; nothing here sees a model, a tokenizer or a config, and nothing
here imports transformers.
"""

from grpolab.algo.advantages import (
    OUTCOME_ESTIMATORS,
    gae_advantages,
    grpo_advantages,
    grpo_process_advantages,
    kl_shaped_token_rewards,
    rft_advantages,
    rloo_advantages,
)
from grpolab.algo.correction import ROLLOUT_CORRECTIONS, mismatch_sums, rollout_correction_weights
from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.algo.gdpo import COMPONENT_ESTIMATORS, gdpo_advantages
from grpolab.algo.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from grpolab.algo.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    Aggregation,
    SurrogateLoss,
    aggregate,
    batch_row_norms,
    cispo_loss,
    clipped_surrogate_loss,
    dpo_loss,
    value_loss,
)
from grpolab.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten
from grpolab.algo.reinforce import TOKEN_ESTIMATORS, reinforce_pp_advantages, reinforce_pp_baseline_advantages
from grpolab.algo.selection import high_entropy_mask, off_policy_sequence_mask
from grpolab.algo.soft import sapo_loss, vespo_loss

__all__ = [
    "AGGREGATIONS",
    "AdaptiveEntropy",
    "COMPONENT_ESTIMATORS",
    "KL_ESTIMATORS",
    "OUTCOME_ESTIMATORS",
    "POLICY_LOSSES",
    "ROLLOUT_CORRECTIONS",
    "TOKEN_ESTIMATORS",
    "Aggregation",
    "SurrogateLoss",
    "aggregate",
    "batch_row_norms",
    "cispo_loss",
    "clipped_surrogate_loss",
    "dpo_loss",
    "gae_advantages",
    "gdpo_advantages",
    "grpo_advantages",
    "grpo_process_advantages",
    "high_entropy_mask",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_shaped_token_rewards",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mismatch_sums",
    "off_policy_sequence_mask",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rft_advantages",
    "rollout_correction_weights",
    "rloo_advantages",
    "sapo_loss",
    "value_loss",
    "vespo_loss",
]
