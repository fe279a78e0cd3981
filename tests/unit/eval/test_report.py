"""The report's computed sentence, tables and plots, from hand-given numbers (no model)."""

from __future__ import annotations

import json

from grpolab.eval.report import pass_maj_table, summary_sentence, write_report
from grpolab.eval.results import ModelEval, load_evals, save_evals

KS = [1, 2, 4, 8, 16, 32, 64]


def _eval(label: str, passes: list[float], majs: list[float], greedy: float | None = 0.5) -> ModelEval:
    sample = {
        "prompt": "123+456=",
        "answer": "9750",
        "greedy": "9750",
        "sampled": ["9750", "9751"],
        "sampled_correct": [True, False],
    }
    return ModelEval(
        label=label,
        path=f"/models/{label}",
        num_prompts=300,
        num_samples=64,
        temperature=1.0,
        pass_at=dict(zip(KS, passes, strict=True)),
        maj_at=dict(zip(KS, majs, strict=True)),
        greedy_accuracy=greedy,
        mean_length=5.0,
        samples=[sample],
    )


# docs/algorithms.md 6.1: SFT vs GRPO step 200 (design A).
SFT = _eval(
    "SFT",
    [0.432, 0.636, 0.807, 0.911, 0.963, 0.986, 0.997],
    [0.432, 0.433, 0.549, 0.629, 0.651, 0.671, 0.693],
)
GRPO = _eval(
    "GRPO", [0.777, 0.926, 0.981, 0.995, 0.999, 1.0, 1.0], [0.777, 0.777, 0.898, 0.936, 0.948, 0.953, 0.953]
)


def test_sentence_for_the_deepseekmath_picture_with_a_ceiling():
    text = summary_sentence(SFT, GRPO)
    assert text.startswith(
        "pass@1 rose from 0.432 to 0.777 (+0.345); maj@64 rose from 0.693 to 0.953 (+0.260); "
        "pass@64 stayed at 1.000 (from 0.997). "
    )
    assert "Maj@64 gained +0.260 while Pass@64 moved +0.003" in text
    assert "DeepSeekMath Fig. 7" in text
    assert "already 0.997 before RL" in text and "ceiling" in text


def test_sentence_for_a_narrowing_pass_at_k_without_a_ceiling():
    # docs/algorithms.md 6.3 (design C at K = 32 ... written here at 64 for the shape)
    before = _eval(
        "SFT", [0.174, 0.3, 0.47, 0.68, 0.87, 0.93, 0.965], [0.174, 0.174, 0.184, 0.2, 0.2, 0.2, 0.203]
    )
    after = _eval(
        "GRPO",
        [0.414, 0.51, 0.61, 0.70, 0.76, 0.78, 0.805],
        [0.414, 0.414, 0.443, 0.455, 0.482, 0.485, 0.487],
    )
    text = summary_sentence(before, after)
    assert "pass@64 moved by -0.160 (0.965 to 0.805)" in text
    assert "Pass@64 fell" in text and "ceiling" not in text


def test_sentence_when_rl_does_not_help_and_when_pass_at_k_widens():
    flat = summary_sentence(SFT, SFT)
    assert flat.startswith("pass@1 stayed at 0.432") and "did not improve pass@1" in flat
    low = _eval("A", [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4], [0.1] * 7)
    high = _eval("B", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], [0.3] * 7)
    assert "widened what the model solves" in summary_sentence(low, high)


def test_table_plots_report_and_json_roundtrip(tmp_path):
    table = pass_maj_table([SFT, GRPO]).splitlines()
    assert table[0] == "| | K=1 | K=2 | K=4 | K=8 | K=16 | K=32 | K=64 |"
    assert table[2] == "| SFT pass@K | 0.432 | 0.636 | 0.807 | 0.911 | 0.963 | 0.986 | 0.997 |"
    assert table[5] == "| GRPO maj@K | 0.777 | 0.777 | 0.898 | 0.936 | 0.948 | 0.953 | 0.953 |"
    rows = [
        {"step": s, "reward": 0.1 * s, "frac_reward_zero_std": 0.1, "kl": 0.01 * s}
        for s in (1, 2, 3)
    ]
    report = write_report(tmp_path, [SFT, GRPO], metrics_rows=rows, setup={"task": "addition"})
    text = report.read_text()
    assert summary_sentence(SFT, GRPO) in text and "| SFT pass@K |" in text and "- task: addition" in text
    for png in ("pass_maj.png", "training.png"):
        assert (tmp_path / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    saved = save_evals([SFT, GRPO], tmp_path / "eval.json")
    assert json.loads(saved.read_text())[0]["pass_at"]["64"] == 0.997
    assert load_evals(saved) == [SFT, GRPO]
