"""The config's sections (config/algo_section.py) held to grpolab.algo: the group-baseline list and each
``Literal`` choice set equal what the algo registries implement."""

import typing

import torch

from grpolab.algo.advantages import OUTCOME_ESTIMATORS, Std
from grpolab.algo.correction import ROLLOUT_CORRECTIONS, Level
from grpolab.algo.gdpo import COMPONENT_ESTIMATORS
from grpolab.algo.kl import KL_ESTIMATORS
from grpolab.algo.losses import AGGREGATIONS, POLICY_LOSSES
from grpolab.algo.reinforce import TOKEN_ESTIMATORS
from grpolab.config import AdvantageName, AlgoConfig, LossAgg
from grpolab.config.algo_section import GROUP_BASELINES


def _choices(annotation) -> set[str]:
    """The strings of a Literal, through ``X | None``."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_choices(arg) for arg in typing.get_args(annotation) if arg is not type(None)))


def _field(name: str) -> set[str]:
    return _choices(typing.get_type_hints(AlgoConfig)[name])


def _flat_group_advantages() -> dict[str, torch.Tensor]:
    """Every estimator's advantages for rewards equal within each group and different across groups."""
    rewards = torch.tensor([0.0, 1.0, 2.5]).repeat_interleave(4).reshape(3, 4)  # [P=3, G=4]
    valid = torch.ones_like(rewards, dtype=torch.bool)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1, 3, 4, 2, 5, 4, 3])
    mask = torch.arange(5).expand(12, 5) < lengths[:, None]  # [N=12, T=5], completions of several lengths
    out = {name: fn(rewards, valid, std="unbiased", eps=1e-4) for name, fn in OUTCOME_ESTIMATORS.items()}
    for name, fn in TOKEN_ESTIMATORS.items():
        out[name] = fn(rewards, valid, mask, None, beta=0.0, gamma=1.0)
    for name, fn in COMPONENT_ESTIMATORS.items():  # two functions, each flat within every group
        parts = torch.stack([rewards, 2 * rewards + 1], dim=-1)
        out[name] = fn(parts, torch.ones_like(parts, dtype=torch.bool), torch.tensor([1.0, 0.5]))
    return out


def test_group_baselines_are_the_estimators_that_give_a_flat_group_zero_advantage():
    advantages = _flat_group_advantages()
    zero = {name for name, adv in advantages.items() if torch.equal(adv, torch.zeros_like(adv))}
    assert zero == GROUP_BASELINES, f"zero advantage for {sorted(zero)}; GROUP_BASELINES: {sorted(GROUP_BASELINES)}"


def test_advantage_choices_are_the_estimators_and_gae():
    # "gae" is in neither registry: PPO's advantages come from the value model (training/ppo.py calls
    # algo.advantages.gae_advantages), so algo.advantage=gae needs algo.name=ppo (config/checks.py).
    # "gdpo" reads each reward function apart (grpolab.algo.gdpo.COMPONENT_ESTIMATORS)
    assert set(OUTCOME_ESTIMATORS).isdisjoint(TOKEN_ESTIMATORS) and set(COMPONENT_ESTIMATORS).isdisjoint(OUTCOME_ESTIMATORS)
    registries = set(OUTCOME_ESTIMATORS) | set(TOKEN_ESTIMATORS) | set(COMPONENT_ESTIMATORS)
    assert _choices(AdvantageName) == registries | {"gae"}
    assert _field("advantage") == _choices(AdvantageName)


def test_kl_loss_and_policy_loss_choices_are_the_algo_registries():
    assert _field("kl_estimator") == set(KL_ESTIMATORS)
    assert _choices(LossAgg) == set(AGGREGATIONS) and _field("loss_agg") == set(AGGREGATIONS)
    assert _field("policy_loss") == set(POLICY_LOSSES)


def test_rollout_correction_choices_are_the_registry_and_none():
    # "none" is the config's "no correction": the trainer skips the weights, so the registry has no entry.
    assert _field("rollout_correction") == set(ROLLOUT_CORRECTIONS) | {"none"}
    assert _field("rollout_correction_level") == set(typing.get_args(Level))
    assert _field("importance_level") == set(typing.get_args(Level))


def test_std_choices_are_algos():
    assert _field("std") == set(typing.get_args(Std))
