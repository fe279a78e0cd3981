"""The overoptimisation report (studies/hacking_report.py), from hand-made metrics files."""

from __future__ import annotations

import json

from grpolab.config import dump_config, load_config
from grpolab.studies.hacking_report import write_report

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


def test_the_report_holds_the_numbers_the_sentences_and_the_plot(tmp_path):
    runs = {}
    for beta, gold in ((0.0, GOLD), (0.04, sorted(GOLD))):
        run = _write_metrics(
            tmp_path / f"beta{beta:g}", _rows(gold, [i / 10 for i in range(11)], [0.01] * 11)
        )
        (run / "config.yaml").write_text(dump_config(load_config(None, [f"algo.beta={beta}", "seed=3"])))
        sample = {"step": 11, "prompt": "1+2=", "completion": "3|4", "reward": 0.9, "gold": 0.0}
        (run / "samples.jsonl").write_text(json.dumps(sample) + "\n")
        runs[run.name] = run
    report = write_report(tmp_path, runs, window=1).read_text()
    assert "beta = 0: hacked in 1 of 1 runs (mean gold fall after its peak 0.600" in report
    assert "beta = 0.04: hacked in 0 of 1 runs (mean gold fall after its peak 0.000" in report
    assert "| beta0 | 0 | 3 | 0.200 | 0.600 | 5 | 0.10 | 6 | 0.000 | 0.000 -> 1.000 | 0.10 | yes |" in report
    assert "`3\\|4`" in report and (tmp_path / "plots" / "hacking.png").stat().st_size > 0
