"""`grpolab recipe` end to end from a GGUF file: convert, evaluate, train, evaluate, report."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gguf", reason="the GGUF path needs the gguf package: pip install 'grpolab[real]'")

from gguf_files import write_tiny_gguf  # noqa: E402

from grpolab.cli import main  # noqa: E402


def test_recipe_from_a_gguf_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    gguf_file = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_file)
    overrides = [
        f"model.name_or_path={gguf_file}", "model.device=cpu",
        "data.source=arithmetic", "data.size=12", "data.eval_size=4", "data.chat_template=true",
        "data.params={style: question, digits: 1}",
        "reward.functions=[{name: exact_match, kwargs: {extract: last_number}}]",
        "rollout.num_generations=2", "rollout.max_completion_length=4",
        "train.num_steps=1", "train.prompts_per_step=2", "train.max_no_signal_steps=0",
        "eval.num_samples=2", f"log.output_dir={tmp_path}", "log.run_name=recipe", "log.progress=false",
        "log.tensorboard=false",
    ]  # fmt: skip
    assert main(["recipe", *overrides]) == 0
    out = capsys.readouterr().out
    for phase in ("1/3 evaluating the starting model", "2/3 training: 1 GRPO steps", "3/3 evaluating the trained"):
        assert phase in out
    run = tmp_path / "recipe"
    evals = json.loads((run / "eval.json").read_text())
    assert [e["label"] for e in evals] == ["base", "GRPO"] and all(e["num_prompts"] == 4 for e in evals)
    assert evals[0]["path"].startswith(str(tmp_path / "cache" / "gguf"))  # the converted folder was evaluated
    assert evals[1]["path"] == str(run / "checkpoints" / "step_1")
    report = (run / "report.md").read_text()
    assert "| base pass@K |" in report and "| GRPO maj@K |" in report and f"`{gguf_file}`" in report
    assert (run / "plots" / "pass_maj.png").read_bytes()[:4] == b"\x89PNG"


def test_recipe_fails_on_a_bad_source_before_any_work(tmp_path, capsys):
    bad = tmp_path / "m.gguf"
    bad.write_text("not a gguf")
    assert main(["recipe", f"model.name_or_path={bad}", "data.source=arithmetic", "data.eval_size=4",
                 "reward.functions=[{name: exact_match}]", f"log.output_dir={tmp_path}"]) == 2  # fmt: skip
    assert "is not a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
