"""Each claim's verdict from hand-made numbers: every branch, and the numbers named in its sentence."""

from __future__ import annotations

from grpolab.commands.claims_verdicts import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    critic_verdict,
    group_verdict,
    hacking_verdict,
    kl_verdict,
    overall,
    pass_maj_verdict,
)
from grpolab.commands.hacking_analysis import analyse
from grpolab.eval.intervals import Interval

GRPO = {"models_loaded": ["policy", "reference"], "params_policy": 100, "params_value": None, "params_total": 200,
        "peak_mem_mb": 1000.0, "time_step_s": 10.0}
PPO = {"models_loaded": ["policy", "reference", "value"], "params_policy": 100, "params_value": 101, "params_total": 301,
       "peak_mem_mb": 1500.0, "time_step_s": 16.0}


def test_the_critic_claim_holds_when_ppo_pays_for_exactly_one_more_model():
    v = critic_verdict(GRPO, PPO, [0.1, 0.2, 0.3])
    assert v.word == HELD
    assert "GRPO loaded 2 models, PPO 3" in v.sentence and "500 MB" in v.sentence and "+60%" in v.sentence
    assert "was 0.30 (below 0.5: hard to fit)" in v.sentence


def test_the_critic_claim_fails_on_memory_or_on_a_second_extra_model():
    v = critic_verdict(GRPO, {**PPO, "peak_mem_mb": 900.0}, [0.9])
    assert v.word == NOT_HELD and "peak memory was not above" in v.sentence and "hard to fit" not in v.sentence
    v = critic_verdict(GRPO, {**PPO, "models_loaded": ["policy", "reference", "value", "reward"]}, [])
    assert v.word == NOT_HELD and "no explained variance was logged" in v.sentence


def _g(g, t, mem, zero, gain, groups=80):
    return {"g": g, "time_step_s": t, "peak_mem_mb": mem, "zero_spread": zero, "gain_per_min": gain, "groups": groups}


def test_the_group_claim_reads_the_price_and_the_signal_and_names_the_best_g():
    rows = [_g(16, 30.0, 3000, 0.1, 0.01), _g(4, 9.0, 2000, 0.5, 0.02), _g(8, 16.0, 2500, 0.3, 0.03)]
    v = group_verdict(rows)
    assert v.word == HELD and "G=[4, 8, 16]: 9.0, 16.0, 30.0 s per step" in v.sentence and "was G=8" in v.sentence
    v = group_verdict([_g(4, 9.0, 2000, 0.2, 0.0), _g(8, 16.0, 2500, 0.4, 0.0)])  # +0.2, se 0.071: 2.8 se
    assert v.word == NOT_HELD and "rose from G=4 to 8 by more than 2 standard errors" in v.sentence
    noise = group_verdict([_g(4, 9.0, 2000, 0.53, 0.0), _g(8, 16.0, 2500, 0.56, 0.0)])  # +0.03, se 0.079
    assert noise.word == HELD and "0.53, 0.56 of the groups" in noise.sentence


def _kl(**kw):
    var = {"positions": 500, "kl_mean": 0.01, "k1_var": 0.02, "k3_var": 0.005}
    m = {"tokens": 1000, "exact_mean": 0.010, "k1_mean": 0.011, "k3_mean": 0.0102, "k1_bias_se": 0.001,
         "k3_bias_se": 0.0005, "k1_negative_share": 0.4, "k3_min": 0.0, "k1_min": -0.3, "k1_bias_max": 1e-15,
         "k3_bias_max": 3e-14, "bias_rel_max": 2e-12, "clamp_bias_mean": 0.0, "k3_vocab_min": 0.0,
         "variance": {"near": var, "middle": {**var, "positions": 0}, "far": {**var, "kl_mean": 0.5, "k3_var": 40.0},
                      "all": var}}
    return {**m, **kw}


def test_the_kl_claim_is_judged_on_exact_expectations_not_on_sample_means():
    held = kl_verdict({"GRPO": _kl(k3_mean=0.002)})  # a sample mean 16 standard errors short: variance, not bias
    assert held.word == HELD
    assert "Var k1 0.02, Var k3 40" in held.sentence and "middle" not in held.sentence  # empty bins left out
    v = kl_verdict({"GRPO": _kl(k3_bias_max=2e-9)})  # an expectation off by more than rounding: a real bias
    assert v.word == NOT_HELD and "E_pi[k3] differs from the exact KL by up to 2.00e-09 nats" in v.sentence
    assert kl_verdict({"GRPO": _kl(k3_vocab_min=-1e-6)}).word == NOT_HELD  # negative somewhere in the vocabulary
    assert kl_verdict({"GRPO": _kl(k3_min=-1e-12)}).word == NOT_HELD  # negative on a sampled token
    assert kl_verdict({"GRPO": _kl(k1_negative_share=0.0)}).word == HELD  # k1's sign is reported, not the claim


def iv(value, low, high):
    return Interval(value, low, high, 0.95)


def test_pass_maj_verdict_branches():
    held = pass_maj_verdict("A", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.0, -0.05, 0.05))
    assert held.word == HELD and "maj@64 +0.200 [+0.100, +0.300]" in held.sentence
    assert pass_maj_verdict("A", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.1, 0.02, 0.2)).word == NOT_HELD
    wide = pass_maj_verdict("A", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.05, -0.1, 0.2))
    assert wide.word == INCONCLUSIVE and "too wide" in wide.sentence
    assert "did not rise clearly" in pass_maj_verdict("A", 64, 0.6, iv(0.05, -0.01, 0.1), iv(0, 0, 0)).sentence
    assert "no room to rise" in pass_maj_verdict("A", 64, 0.97, iv(0.2, 0.1, 0.3), iv(0, 0, 0)).sentence
    assert overall([held, wide]).word == INCONCLUSIVE
    assert overall([held, pass_maj_verdict("B", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.1, 0.02, 0.2))]).word == NOT_HELD


def _rows(gold, proxy):
    return [{"step": i + 1, "reward": p, "train/gold_total": g, "train/kl_seq": 0.5 * i} for i, (g, p) in
            enumerate(zip(gold, proxy, strict=True))]


def test_hacking_holds_when_the_gold_falls_as_the_proxy_rises():
    hacked = analyse(_rows([0.2, 0.4, 0.5, 0.3, 0.1], [0.0, 0.5, 1.0, 1.5, 2.0]), window=1)
    honest = analyse(_rows([0.2, 0.3, 0.4, 0.5, 0.6], [0.2, 0.3, 0.4, 0.5, 0.6]), window=1)
    v = hacking_verdict({"rm": hacked}, honest)
    assert v.word == HELD and "in rm" in v.sentence and "gold 0.200 -> 0.600" in v.sentence
    v = hacking_verdict({"rm": honest}, None)
    assert v.word == NOT_HELD and "sqrt(KL) 1.41" in v.sentence
