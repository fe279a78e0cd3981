"""The ``algo`` section of a run config: the algorithm preset and every choice of the loss, the
advantage, the KL and the rollout correction (its ``Literal`` choices are held to ``grpolab.algo``'s
registries by tests/unit/config/test_algo_section.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from grpolab.config.presets import ALGO_PRESETS
from grpolab.config.resolve import fill_preset
from grpolab.errors import ConfigError

AlgoName = Literal[
    "grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "online_rft", "reinforce_pp", "reinforce_pp_baseline", "ppo"
]
AdvantageName = Literal[
    "grpo", "dr_grpo", "rloo", "online_rft", "batch_std", "batch_reward_std", "gdpo", "reinforce_pp",
    "reinforce_pp_baseline", "gae",
]
GROUP_BASELINES: frozenset[str] = frozenset(
    {"grpo", "dr_grpo", "rloo", "batch_std", "batch_reward_std", "gdpo", "reinforce_pp_baseline"}
)
"""Advantage estimators whose baseline is the prompt's own group: equal rewards within a group give zero
advantage, so they need rollout.num_generations >= 2 and a temperature above 0. A test holds this set to
what ``grpolab.algo``'s estimators do."""
LossAgg = Literal[
    "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum", "batch-token-mean"
]


@dataclass(frozen=True)
class AlgoConfig:
    name: AlgoName = "grpo"
    """Algorithm preset: the paper's recipe (ALGO_PRESETS) fills every field below marked "null = preset"
    that the user left unset, before the config is built (config/resolve.py); a value set explicitly always
    wins, also when a study switches algo.name (``derive``). The config printed by ``grpolab config`` and
    written to the run's config.yaml holds the resolved values."""
    advantage: AdvantageName | None = None
    """Advantage estimator (null = from the preset). grpo: (r - group mean) / (group std + eps); dr_grpo: no std;
    batch_std: the std of the batch's group-centred rewards; batch_reward_std: the std of the batch's rewards
    (TRL scale_rewards=batch); gdpo: each reward function normalised in its group, the weighted sum whitened
    over the batch (TRL multi_objective_aggregation=normalize_then_sum); docs/algorithms.md has the rest."""
    std: Literal["unbiased", "population"] = "unbiased"
    """Which std normalises group rewards (TRL and verl: unbiased)."""
    eps: float = 1e-4
    """Added to the std before dividing."""
    beta: float | None = None
    """KL coefficient (DeepSeekMath: 0.04). 0 skips the reference model entirely. null = preset."""
    kl_estimator: Literal["k1", "k2", "k3", "abs"] | None = None
    """Per-token KL estimator, in the loss (DeepSeekMath eq. 4 is k3) or in the reward (algo.kl_in=reward:
    RLOO, REINFORCE++ and PPO use k1), as verl's kl_penalty (kl = k1, mse = k2, low_var_kl = k3, abs). null = preset."""
    kl_in: Literal["loss", "reward"] | None = None
    """Where the KL penalty goes: the loss (GRPO) or the per-token reward (PPO, RLOO). null = preset."""
    clip_low: float | None = None
    """epsilon below 1 for the ratio clip (CISPO: for the IS weight). null = preset."""
    clip_high: float | None = None
    """epsilon above 1 (Clip-Higher, DAPO: 0.28); null = the preset's, or clip_low where the preset's clip is symmetric."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages (verl: 3.0); null = off."""
    importance_level: Literal["token", "sequence"] | None = None
    """token = PPO/GRPO ratio; sequence = GSPO's length-normalised sequence ratio. null = preset."""
    loss_agg: LossAgg | None = None
    """Loss aggregation (null = preset); batch-token-mean: each batch of loss_agg_batch_rows rows, cut from the
    optimizer step's shuffled rows on each rank, divided by its own tokens, the batches averaged (TRL's bnpo)."""
    loss_agg_batch_rows: int | None = None
    """batch-token-mean: rows per normalising batch (TRL's per_device_train_batch_size); unused by the others."""
    mu: int | None = None
    """Optimisation passes over each generation batch (DeepSeekMath mu; TRL num_iterations). null = preset."""
    num_minibatches: int | None = None
    """Optimizer steps per pass: the generation batch is split into this many minibatches (DAPO: 16). null = preset."""
    ref_reset_every: int = 0
    """Reset the reference to the current policy every N steps (DeepSeek-R1: 400); 0 = never."""
    ref_mixup_alpha: float = 1.0
    """At each reset, pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref (TR-DPO, arXiv 2404.09656; TRL's
    ref_model_mixup_alpha, 0.6 there); 1 = the reference becomes the policy."""
    mask_truncated: bool | None = None
    """DAPO overlong filtering: completions without EOS get no loss. null = preset."""
    supervision: Literal["outcome", "process"] = "outcome"
    """outcome: one advantage per completion from reward.functions; process: per-step advantages from
    reward.process (DeepSeekMath Sec. 4.1.3), with reward.functions only logged."""
    gamma: float = 1.0
    """PPO: GAE discount (TRL, verl: 1.0); a completion is one episode scored at its end."""
    lam: float = 1.0
    """PPO: GAE lambda. 1.0, not TRL's 0.95: DeepSeek-R1 supp. A.3 found PPO close to GRPO only with lambda = 1.0
    (0.95 was clearly worse); with gamma = lambda = 1, A_t = (score - sum of later KL penalties) - V(s_t)."""
    vf_coef: float = 0.1
    """PPO: value-loss coefficient (TRL: 0.1). The critic has its own AdamW, so this scales its gradient
    before the optim.max_grad_norm clip rather than its step size."""
    value_clip: float | None = 0.2
    """PPO: c_v of the clipped value loss, clip(V, V_old - c_v, V_old + c_v) (verl, TRL: 0.2); null = unclipped."""
    value_lr: float | None = None
    """PPO: learning rate of the critic's own optimizer (OpenRLHF: 9x the actor's); null = optim.lr."""
    critic_warmup_steps: int = 0
    """PPO: for the first N steps only the critic is trained; the policy is left unchanged."""
    whiten_advantages: bool = True
    """PPO: whiten the GAE advantages over the batch's counted tokens (masked mean and std, as verl and TRL)."""
    value_init: Literal["policy", "reward_model"] = "policy"
    """PPO: the value model's body starts from the policy checkpoint (with a zero scalar head) or from a
    reward model (body and head)."""
    value_init_path: str | None = None
    """PPO: reward-model folder or hub id (AutoModelForSequenceClassification, 1 label) for value_init=reward_model."""

    policy_loss: Literal["clip", "cispo", "sapo", "vespo"] | None = None
    """clip = PPO/GRPO's clipped surrogate (GSPO with importance_level=sequence); cispo = MiniMax-M1's clipped
    stop-gradient IS weight on a REINFORCE term (clip_low / clip_high bound the weight); sapo = SAPO's smooth
    gate sigmoid(tau (ratio - 1)) 4 / tau in place of the clip; vespo = VESPO's REINFORCE term weighted by
    w^k e^{lambda (1 - w)} of the summed sequence ratio w (sapo, vespo: clip_low / clip_high unused). null = preset."""
    sapo_temperature_pos: float = 1.0
    """SAPO: the gate's temperature tau for tokens with a positive advantage (TRL: 1.0); larger fades faster."""
    sapo_temperature_neg: float = 1.05
    """SAPO: tau for tokens with a zero or negative advantage (TRL: 1.05; the paper keeps it above the positive one)."""
    vespo_k_pos: float = 2.0
    """VESPO: the power k of phi(w) = w^k e^{lambda (1 - w)} for a non-negative advantage (TRL: 2.0); a larger
    k weighs sequences whose ratio fell below 1 down harder."""
    vespo_lambda_pos: float = 3.0
    """VESPO: the decay lambda for a non-negative advantage (TRL: 3.0); a larger lambda weighs ratios above 1 down."""
    vespo_k_neg: float = 3.0
    """VESPO: k for a negative advantage (TRL: 3.0)."""
    vespo_lambda_neg: float = 2.0
    """VESPO: lambda for a negative advantage (TRL: 2.0)."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence masking: a completion with a negative advantage whose mean per-token
    log pi_sampler - log pi_theta (the sampler's log-probs against the current policy's) exceeds this many nats
    gets no policy-gradient loss (its KL term stays). TRL's off_policy_mask_threshold; e.g. 0.5. null = off."""
    top_entropy_quantile: float = 1.0
    """The 80/20 rule (arXiv 2506.01939): only the tokens whose entropy under the current policy is in this top
    fraction of the optimizer step's counted tokens (every rank's) get policy-gradient loss; 0.2 as the paper,
    1.0 = every token. Costs one extra forward without gradient per optimizer step."""
    dynamic_sampling: bool | None = None
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts until the step
    has train.prompts_per_step groups or algo.max_sampling_rounds are spent. null = preset."""
    max_sampling_rounds: int = 10
    """Dynamic sampling: at most this many generation rounds per step (verl max_num_gen_batches: 10); when they
    are spent the step trains on the groups it kept."""
    rollout_correction: Literal["none", "tis", "mis"] = "none"
    """Correct for the sampler / trainer log-prob mismatch: tis = truncated importance sampling (weight capped
    at rollout_correction_cap), mis = mask tokens (or sequences) whose weight exceeds the cap. The mismatch
    itself (sampling/sampling_logp_difference/mean, rollout/sampler_kl) is logged every step either way."""
    rollout_correction_level: Literal["token", "sequence"] = "token"
    """One correction weight per token, or per sequence (the product of its token weights)."""
    rollout_correction_cap: float = 2.0
    """The truncation / masking threshold of the correction weight (TIS: 2; verl suggests 1.5-5 per token,
    2-10 per sequence)."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss gets -entropy_coef x the mean per-token entropy of the optimizer step's counted
    tokens (TRL's; whatever loss_agg). 0 = off. With entropy_adaptive, the starting coefficient."""
    entropy_adaptive: bool = False
    """Skywork-OR1's adaptive entropy control (arXiv 2505.22312; TRL's use_adaptive_entropy): after each optimizer
    step the coefficient moves by entropy_coef_delta, up when that step's mean entropy is at or below
    entropy_target, down otherwise, within [entropy_coef_min, entropy_coef_max]; a step applies the bonus only
    when the previous step's entropy was at or below the target (none on the first). Resumes with the run."""
    entropy_target: float = 0.2
    """entropy_adaptive: the target mean per-token entropy in nats (TRL: 0.2), over the tokens the policy loss
    counts (the high-entropy ones with top_entropy_quantile < 1)."""
    entropy_coef_delta: float = 0.005
    """entropy_adaptive: the coefficient's change per optimizer step (TRL: 0.005)."""
    entropy_coef_min: float = 0.0
    """entropy_adaptive: the coefficient's lower bound (TRL: 0.0)."""
    entropy_coef_max: float = 1.0
    """entropy_adaptive: the coefficient's upper bound (TRL: 1.0)."""

    def __post_init__(self) -> None:
        # Presets are filled before an AlgoConfig is built (config/resolve.py), so a built one holds every
        # effective value and is never changed; a null here means it was built around that step.
        unfilled = [key for key in _PRESET_KEYS if getattr(self, key) is None]
        if unfilled and self.name in ALGO_PRESETS:
            raise ConfigError(
                f"AlgoConfig(name={self.name!r}) leaves {', '.join(unfilled)} null: build configs with "
                "grpolab.config.load_config / config_from_dict (or preset_algo), which fill the preset's values"
            )

    @property
    def preset(self) -> dict[str, Any]:
        return ALGO_PRESETS[self.name]

    @property
    def ratio_is_one(self) -> bool:
        """True when the policy never moves before its batch is used up: the importance ratio is exactly 1."""
        return self.mu == 1 and self.num_minibatches == 1

    @property
    def needs_old_logprobs(self) -> bool:
        """Old log-probs must be recomputed before the first update: the policy moves within the batch."""
        return not self.ratio_is_one

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0

    @property
    def needs_critic(self) -> bool:
        """True for PPO: GAE needs a learned value model."""
        return self.advantage == "gae"


_PRESET_KEYS: tuple[str, ...] = (*ALGO_PRESETS["grpo"], "clip_high")
"""The fields every preset fills (each preset states every one)."""


def preset_algo(name: str = "grpo", **explicit: Any) -> AlgoConfig:
    """The AlgoConfig of preset ``name`` with ``explicit`` fields set, for code that builds one directly (a run
    config comes from load_config / config_from_dict, which also fit the minibatch count to the batch)."""
    values, _ = fill_preset({"name": name, **explicit})
    return AlgoConfig(**values)
