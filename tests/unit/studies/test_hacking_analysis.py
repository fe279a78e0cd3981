"""The overoptimisation analysis's numbers and sentences (studies/hacking_analysis.py), from hand-made
metrics files."""

from __future__ import annotations

import json
import math

import pytest

from grpolab.runtime.logging import read_metrics
from grpolab.studies.hacking_analysis import analyse, pick_samples, sentence, smooth

GOLD = [0.2, 0.3, 0.4, 0.5, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0]  # peaks at step 5, then falls


def _rows(gold, proxy, kl):
    return [
        {"step": i + 1, "reward": p, "train/gold_total": g, "train/kl_seq": k, "kl": 0.0}
        for i, (g, p, k) in enumerate(zip(gold, proxy, kl, strict=True))
    ]


def _write_metrics(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_smooth_is_a_centred_mean_shrunk_at_the_ends():
    assert smooth([0.0, 3.0, 6.0, 9.0], 3) == pytest.approx([1.5, 3.0, 6.0, 7.5])
    assert smooth([1.0, math.nan, 3.0], 3) == pytest.approx([1.0, 2.0, 3.0])


def test_a_gold_peak_then_fall_while_the_proxy_rises_is_hacking(tmp_path):
    proxy = [i / 10 for i in range(11)]
    kl = [(i + 1) ** 2 / 100 for i in range(11)]  # sqrt(KL) = step / 10
    run = _write_metrics(tmp_path / "run", _rows(GOLD, proxy, kl))
    n = analyse(read_metrics(run), window=1, min_drop=0.05)
    assert (n.peak_step, n.gold_peak, n.gold_end, n.gold_start) == (5, 0.6, 0.0, 0.2)
    assert n.turn_step == 6  # 0.5 < 0.6 - 0.05
    assert n.sqrt_kl_at_peak == pytest.approx(0.5) and n.sqrt_kl_end == pytest.approx(1.1)
    assert (n.proxy_at_peak, n.proxy_end) == (0.4, 1.0)
    assert n.hacked and n.gold_drop == pytest.approx(0.6)
    text = sentence(n)
    assert text.startswith("The proxy was hacked in this run") and "0.600" in text and "step 5" in text
    assert "while the proxy rose (0.400 -> 1.000)" in text
    flat = analyse(
        _rows(GOLD, [0.5] * 6 + [0.48] * 5, kl), window=1
    )  # within min_drop of its value at the peak
    assert flat.hacked and "while the proxy held (0.500 -> 0.480)" in sentence(flat)
    # smoothed over 3 steps: peak 0.5333 still at step 5, end (0.1 + 0.0) / 2
    s = analyse(read_metrics(run), window=3, min_drop=0.05)
    assert s.peak_step == 5 and s.gold_peak == pytest.approx(1.6 / 3) and s.gold_end == pytest.approx(0.05)
    assert s.turn_step == 7  # smoothed step 6 = 0.5, not below 0.5333 - 0.05; step 7 = 0.4


def test_rising_gold_is_not_hacking_and_a_joint_fall_is_a_bad_run_not_hacking():
    rising = analyse(_rows([0.1 * i for i in range(6)], [0.1 * i for i in range(6)], [0.0] * 6), window=1)
    assert not rising.hacked and rising.turn_step is None and rising.peak_step == 6
    assert sentence(rising).startswith(
        "The proxy was not hacked in this run: the gold reward went 0.000 -> 0.500"
    )
    proxy_falls = [0.5, 0.6, 0.7, 0.8, 0.9, 0.8, 0.6, 0.4, 0.2, 0.1, 0.0]
    both = analyse(_rows(GOLD, proxy_falls, [0.1] * 11), window=1)
    assert not both.hacked and both.gold_drop == pytest.approx(0.6)
    assert "not hacked in this run, but the run degraded" in sentence(both)
    # a fall smaller than min_drop is noise, not a turn
    small = analyse(_rows([0.5, 0.6, 0.58], [0.1, 0.2, 0.3], [0.0] * 3), window=1, min_drop=0.05)
    assert not small.hacked and small.turn_step is None


def test_negative_kl_estimates_give_sqrt_zero_and_missing_gold_is_an_error():
    n = analyse(_rows([0.1, 0.2], [0.1, 0.2], [-0.04, 0.09]), window=1)
    assert n.sqrt_kl == pytest.approx([0.0, 0.3])
    with pytest.raises(ValueError, match="reward.gold"):
        analyse([{"step": 1, "reward": 0.3}])


def test_pick_samples_takes_the_nearest_logged_step_one_per_prompt():
    samples = [
        {"step": 4, "prompt": "a", "completion": "x", "reward": 0.1, "gold": 1.0},
        {"step": 4, "prompt": "a", "completion": "y", "reward": 0.9, "gold": 0.0},
        {"step": 4, "prompt": "b", "completion": "z", "reward": 0.5, "gold": 0.0},
        {"step": 10, "prompt": "a", "completion": "w", "reward": 0.2, "gold": 1.0},
    ]
    assert [s["completion"] for s in pick_samples(samples, 5, k=2)] == ["x", "z"]
    assert [s["completion"] for s in pick_samples(samples, 5, k=2, hacks_first=True)] == ["y", "z"]
    assert [s["completion"] for s in pick_samples(samples, 9)] == ["w"]
