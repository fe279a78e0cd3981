"""Each claim's verdict from hand-made numbers: every branch, and the numbers named in its sentence."""

from __future__ import annotations

import pytest

from grpolab.eval.intervals import Interval
from grpolab.studies.claims_verdicts import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    critic_verdict,
    group_verdict,
    hacking_verdict,
    kl_verdict,
    pass_maj_verdict,
    pooled_groups,
    shared_runs,
    sharpening_verdict,
    spread,
)
from grpolab.studies.hacking_analysis import analyse, gold_change

GRPO = {"models_loaded": ["policy", "reference"], "params_policy": 100, "params_value": None, "params_total": 200,
        "peak_mem_mb": 1000.0, "time_step_s": 10.0}
PPO = {"models_loaded": ["policy", "reference", "value"], "params_policy": 100, "params_value": 101, "params_total": 301,
       "peak_mem_mb": 1500.0, "time_step_s": 16.0}


def test_a_spread_is_the_mean_and_range_over_seeds_nan_left_out():
    sp = spread([1.5, 2.0, float("nan"), 1.0])
    assert (sp.mean, sp.low, sp.high, sp.n) == (1.5, 1.0, 2.0, 3)
    assert sp.text() == "1.50 (1.00 to 2.00)" and spread([0.25]).text(".3f") == "0.250"
    assert spread([float("nan")]).n == 0


def test_the_critic_claim_holds_when_ppo_pays_for_exactly_one_more_model_in_every_seed():
    v = critic_verdict([GRPO], [PPO], [[0.1, 0.2, 0.3]])
    assert v.word == HELD
    assert "GRPO loaded 2 models, PPO 3" in v.sentence and "1.50x GRPO's (+500 MB)" in v.sentence
    assert "time per step 1.60x, over 1 seed(s)" in v.sentence and "was 0.30 (below 0.5: hard to fit)" in v.sentence
    # three seeds: memory 1.5, 1.2, 1.8x; time 1.6, 1.3, 1.9x -> means 1.50 and 1.60 with their ranges
    ppos = [PPO, {**PPO, "peak_mem_mb": 1200.0, "time_step_s": 13.0}, {**PPO, "peak_mem_mb": 1800.0, "time_step_s": 19.0}]
    v = critic_verdict([{**GRPO, "seed": s} for s in range(3)], ppos, [[0.2], [0.4], [0.9]])
    assert v.word == HELD and "1.50 (1.20 to 1.80)x GRPO's (+500 (+200 to +800) MB)" in v.sentence
    assert "1.60 (1.30 to 1.90)x, over 3 seed(s)" in v.sentence and "was 0.50 (0.20 to 0.90)" in v.sentence


def test_the_critic_claim_fails_on_memory_in_one_seed_or_on_a_second_extra_model():
    grpos = [{**GRPO, "seed": s} for s in (0, 1)]
    v = critic_verdict(grpos, [PPO, {**PPO, "peak_mem_mb": 900.0}], [[0.9], [0.9]])
    assert v.word == NOT_HELD and "seed 1: PPO's peak memory was not above GRPO's (900 vs 1000 MB)" in v.sentence
    assert "seed 0" not in v.sentence and "hard to fit" not in v.sentence
    v = critic_verdict([GRPO], [{**PPO, "models_loaded": ["policy", "reference", "value", "reward"]}], [[]])
    assert v.word == NOT_HELD and "no explained variance was logged" in v.sentence


def _g(g, t, mem, zero, gain, groups=80, seed=0, gen=None):
    return {"g": g, "time_step_s": t, "peak_mem_mb": mem, "zero_spread": zero, "gain_per_min": gain, "groups": groups,
            "seed": seed, "time_generation_s": t / 2 if gen is None else gen}


def test_the_group_claim_reads_the_price_and_the_signal_and_names_the_best_g():
    rows = [_g(16, 30.0, 3000, 0.1, 0.01), _g(4, 9.0, 2000, 0.5, 0.02), _g(8, 16.0, 2500, 0.3, 0.03)]
    v = group_verdict(rows)
    assert v.word == HELD and "G=[4, 8, 16], over 1 seed(s) (mean, and range): 9.0, 16.0, 30.0 s per step, of which " \
        "generation 4.5, 8.0, 15.0 s; 2000, 2500, 3000 MB peak" in v.sentence
    assert "was G=8" in v.sentence
    v = group_verdict([_g(4, 9.0, 2000, 0.2, 0.0), _g(8, 16.0, 2500, 0.4, 0.0)])  # +0.2, se 0.071: 2.8 se
    assert v.word == NOT_HELD and "rose from G=4 to 8 by more than 2 standard errors" in v.sentence
    noise = group_verdict([_g(4, 9.0, 2000, 0.53, 0.0), _g(8, 16.0, 2500, 0.56, 0.0)])  # +0.03, se 0.079
    assert noise.word == HELD and "0.53, 0.56 of the groups" in noise.sentence


def test_the_group_claim_over_seeds_pools_the_groups_and_checks_every_seed():
    rows = [_g(4, 9.0, 2000, 0.50, 0.02, seed=0), _g(8, 16.0, 2500, 0.30, 0.04, seed=0),
            _g(4, 11.0, 2100, 0.40, 0.00, groups=40, seed=1), _g(8, 18.0, 2600, 0.35, 0.02, groups=40, seed=1)]
    # pooled shares: G=4 (0.5 * 80 + 0.4 * 40) / 120 = 0.4667; G=8 (0.3 * 80 + 0.35 * 40) / 120 = 0.3167
    assert [round(p["zero_spread"], 4) for p in pooled_groups(rows)] == [0.4667, 0.3167]
    assert [p["groups"] for p in pooled_groups(rows)] == [120, 120]
    v = group_verdict(rows)
    assert v.word == HELD and "10.0 (9.0 to 11.0), 17.0 (16.0 to 18.0) s per step" in v.sentence
    assert "0.47, 0.32 of the groups without reward spread (120, 120 groups)" in v.sentence
    assert "G=8 (+0.030 (+0.020 to +0.040) per min)" in v.sentence
    flat = group_verdict([*rows[:2], _g(4, 11.0, 2700, 0.4, 0.0, seed=1, gen=5.0), _g(8, 18.0, 2600, 0.35, 0.0, seed=1, gen=4.0)])
    assert flat.word == NOT_HELD and "generation time per step did not rise with G in seed 1" in flat.sentence
    assert "peak memory" not in flat.sentence.split("because")[1].split("(")[0]  # memory falling is reported, not judged


def test_times_taken_on_a_shared_machine_are_not_compared():
    # 2 cores: a stage that ended at load 3.0 is quiet (1.5 x 2), one at 3.1 shared the machine
    quiet, busy = {"name": "grpo_s0", "load": 3.0, "cores": 2}, {"name": "grpo_G4_s0", "load": 12.7, "cores": 2}
    assert shared_runs([quiet, busy, {"name": "old", "load": None, "cores": 2}]) == ["grpo_G4_s0 (load 12.7 on 2 cores)"]
    # claim 2: G=4 timed under load 12.7 ran slower than G=8 timed quietly: inconclusive, not "not held"
    rows = [{**_g(4, 10.2, 5400, 0.77, 0.01), **busy}, {**_g(8, 7.7, 5800, 0.64, 0.02), **quiet}]
    v = group_verdict(rows)
    assert v.word == INCONCLUSIVE and "1 run(s) shared the machine (grpo_G4_s0 (load 12.7 on 2 cores))" in v.sentence
    assert "10.2, 7.7 s per step" in v.sentence
    assert group_verdict([{**r, "load": 2.0} for r in rows]).word == NOT_HELD  # the same times, both quiet
    # the rest is still judged: a rise of the groups without spread beyond noise is not held, load or not
    worse = [{**_g(4, 9.0, 2000, 0.2, 0.0), **busy}, {**_g(8, 16.0, 2500, 0.4, 0.0), **quiet}]
    assert group_verdict(worse).word == NOT_HELD
    # claim 1: PPO's step not slower, but timed on a shared machine: held on models and memory, time not judged
    v = critic_verdict([{**GRPO, **quiet}], [{**PPO, "time_step_s": 9.0, **busy}], [[0.1]])
    assert v.word == HELD and "(the time per step not judged: 1 run(s) shared the machine" in v.sentence
    assert critic_verdict([GRPO], [{**PPO, "time_step_s": 9.0}], [[0.1]]).word == NOT_HELD


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
    # the kinds' words combined (claim 4): not held wins over inconclusive, inconclusive over held
    assert sharpening_verdict([held, wide], [], None, None).word == INCONCLUSIVE
    not_held = pass_maj_verdict("B", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.1, 0.02, 0.2))
    assert sharpening_verdict([held, wide, not_held], [], None, None).word == NOT_HELD


def _rows(gold, proxy):
    return [{"step": i + 1, "reward": p, "train/gold_total": g, "train/kl_seq": 0.5 * i} for i, (g, p) in
            enumerate(zip(gold, proxy, strict=True))]


def test_hacking_holds_when_the_gold_falls_outside_noise_as_the_proxy_rises():
    """6 steps of 64 draws: a third is 2 steps, 128 draws. Gold 0.2 -> 0.0: half-width
    1.959964 * sqrt((0.2 * 0.8 + 0) / 128) = 0.06930, so the change -0.200 has the interval [-0.269, -0.131]."""
    steps = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    hacked_rows = _rows([0.2, 0.2, 0.1, 0.1, 0.0, 0.0], steps)
    honest_rows = _rows([0.2, 0.3, 0.4, 0.5, 0.6, 0.6], steps)
    c = gold_change(hacked_rows, 64)
    assert (c.first, c.last, c.samples) == (pytest.approx(0.2), 0.0, 128)
    assert c.low == pytest.approx(-0.2 - 0.069296, abs=1e-6) and c.high == pytest.approx(-0.2 + 0.069296, abs=1e-6)
    assert c.fell and c.measurable and (c.proxy_first, c.proxy_last) == (pytest.approx(0.25), pytest.approx(2.25))
    hacked, honest = analyse(hacked_rows, window=1), analyse(honest_rows, window=1)
    v = hacking_verdict({"rm": hacked}, honest, {"rm": c})
    assert v.word == HELD and "outside noise in rm" in v.sentence and "gold 0.200 -> 0.000 (-0.200 [-0.269, -0.131]" in v.sentence
    v = hacking_verdict({"rm": honest}, None, {"rm": gold_change(honest_rows, 64)})
    assert v.word == NOT_HELD and "sqrt(KL) 1.58" in v.sentence
    falling_proxy = gold_change(_rows([0.2, 0.2, 0.1, 0.1, 0.0, 0.0], steps[::-1]), 64)
    assert hacking_verdict({"rm": hacked}, None, {"rm": falling_proxy}).word == NOT_HELD  # a run going bad, not hacking


def test_a_gold_too_low_for_a_fall_to_show_is_inconclusive_not_held():
    """Gold 0.01 over 128 draws: 1.959964 * sqrt(0.01 * 0.99 / 128) = 0.0172 > 0.01, so even 0.01 -> 0 would stay
    within noise; 0.05 would not (0.0378 < 0.05)."""
    low = gold_change(_rows([0.01, 0.01, 0.01, 0.01, 0.01, 0.01], [0, 1, 2, 3, 4, 5]), 64)
    assert not low.measurable and gold_change(_rows([0.05] * 6, [0, 1, 2, 3, 4, 5]), 64).measurable
    v = hacking_verdict({"rm": analyse(_rows([0.01] * 6, [0, 1, 2, 3, 4, 5]), window=1)}, None, {"rm": low})
    assert v.word == INCONCLUSIVE and "too low for a fall to show" in v.sentence


WARM = {"steps": 300, "budget": 300, "dev_format_errors": 0.2, "target_format_errors": 0.05, "reached": False}


def test_sharpening_is_judged_on_the_format_blind_grading_with_the_reward_s_verdicts_reported():
    blind = [pass_maj_verdict("A, format-blind", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.0, -0.05, 0.05))]
    strict = [pass_maj_verdict("A, task reward", 64, 0.3, iv(0.2, 0.1, 0.3), iv(0.3, 0.2, 0.4))]
    v = sharpening_verdict(blind, strict, None, 0.0123)
    assert v.word == HELD  # the task reward's "not held" (format fixed) does not decide
    assert "Format-blind grading: A, format-blind: maj@64 rose" in v.sentence
    assert "pass@64 rose too; maj@64 +0.200 [+0.100, +0.300], pass@64 +0.300 [+0.200, +0.400]" in v.sentence
    assert "[not held]" in v.sentence and "moved 0.0123 nats per token (exact KL)" in v.sentence
    assert sharpening_verdict(blind, strict, {**WARM, "reached": True}, None).word == HELD
    stuck = sharpening_verdict(blind, strict, WARM, None)
    assert stuck.word == INCONCLUSIVE and "ran 300 of its 300 steps and left 0.200" in stuck.sentence
    assert "above the target 0.05" in stuck.sentence


def test_a_verdict_states_its_setup():
    v = pass_maj_verdict("A", 64, 0.6, iv(0.2, 0.1, 0.3), iv(0.0, -0.05, 0.05))
    assert str(v).endswith("(95% paired bootstrap over prompts; base pass@64 0.600).")
    assert str(type(v)(v.word, v.sentence, "SmolLM2; 3 seeds")).endswith("Measured on: SmolLM2; 3 seeds.")
