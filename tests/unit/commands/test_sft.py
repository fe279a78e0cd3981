"""SFT: targets (answer + EOS only), the accuracy early stop, and the saved model folder."""

from __future__ import annotations

import json

import pytest
import torch

from grpolab.cli import main
from grpolab.commands import sft as sft_module
from grpolab.config import load_config
from grpolab.runtime.lock import hold_run_dir
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.tiny import build_char_tokenizer
from grpolab.types import Example


def test_targets_are_the_formatted_answer_then_eos():
    tok = build_char_tokenizer()
    targets = sft_module.tokenize_targets([Example("1+2=", "3"), Example("9+9=", "81")], tok, "<{answer}>")
    assert targets == [
        [*tok("<3>", add_special_tokens=False)["input_ids"], tok.eos_token_id],
        [*tok("<81>", add_special_tokens=False)["input_ids"], tok.eos_token_id],
    ]
    ids, mask = sft_module.pad_targets(targets, pad_id=0)
    assert ids.shape == (2, 5) and mask.sum(-1).tolist() == [4, 5] and ids[0, 4] == 0
    with pytest.raises(ValueError, match="reference answer"):
        sft_module.tokenize_targets([Example("1+2=", None)], tok, "{answer}")


def _cfg(model_dir, out, *extra):
    return load_config(None, _overrides(model_dir, out, *extra))


def _overrides(model_dir, out, *extra) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        "data.source=arithmetic",
        "data.size=100",
        "data.params={digits: 1}",
        "data.eval_size=10",
        "reward.functions=[{name: exact_match, kwargs: {extract: none}}]",
        "rollout.max_completion_length=3",
        "sft.batch_size=8",
        "sft.lr=3e-3",
        "sft.dev_size=6",
        "sft.check_every=2",
        f"log.output_dir={out}",
        "log.progress=false",
        *extra,
    ]


def test_stops_at_the_first_check_that_reaches_the_target(tiny_model_dir, tmp_path, monkeypatch):
    checks = iter(sft_module.DevCheck(a, 0.5) for a in [0.1, 0.4, 0.7, 0.9])
    monkeypatch.setattr(sft_module, "dev_checker", lambda *a: lambda: next(checks))
    result = sft_module.sft(_cfg(tiny_model_dir, tmp_path, "sft.steps=20", "sft.target_accuracy=0.6"))
    assert result.steps == 6 and result.reached_target and result.dev_accuracy == 0.7
    rows = read_metrics(result.output_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.get("sft/dev_greedy_accuracy") for r in rows] == [None, 0.1, None, 0.4, None, 0.7]
    assert json.loads((result.output_dir / "sft_result.json").read_text())["steps"] == 6


@pytest.mark.parametrize(
    ("targets", "steps"),
    [
        (["sft.target_format_errors=0.1"], 6),  # the third check's 0.08 errors
        (["sft.target_format_errors=0.1", "sft.target_accuracy=0.5"], 8),  # both: accuracy 0.5 at the fourth
    ],
)
def test_stops_once_format_errors_are_rare_and_every_other_target_is_met(tiny_model_dir, tmp_path, monkeypatch, targets, steps):
    checks = iter(sft_module.DevCheck(a, e) for a, e in [(0.1, 0.6), (0.2, 0.3), (0.3, 0.08), (0.5, 0.02), (0.6, 0.0)])
    monkeypatch.setattr(sft_module, "dev_checker", lambda *a: lambda: next(checks))
    result = sft_module.sft(_cfg(tiny_model_dir, tmp_path, "sft.steps=20", *targets))
    assert result.steps == steps and result.reached_target
    assert result.dev_format_errors == {6: 0.08, 8: 0.02}[steps]
    rows = read_metrics(result.output_dir)
    assert [r.get("sft/dev_format_errors") for r in rows if r["step"] % 2 == 0] == [0.6, 0.3, 0.08, 0.02][: steps // 2]
    assert json.loads((result.output_dir / "sft_result.json").read_text())["dev_format_errors"] == result.dev_format_errors


def test_a_format_target_never_reached_runs_the_budget_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(sft_module, "dev_checker", lambda *a: lambda: sft_module.DevCheck(0.0, 0.5))
    result = sft_module.sft(_cfg(tiny_model_dir, tmp_path, "sft.steps=4", "sft.target_format_errors=0.1"))
    assert result.steps == 4 and not result.reached_target and result.dev_format_errors == 0.5


def test_the_dev_check_counts_format_errors_with_the_blind_grader(tiny_model_dir):
    """A random tiny model's greedy replies, graded by hand the way the check grades them."""
    from grpolab.eval.metrics import format_errors
    from grpolab.eval.runner import greedy_decode
    from grpolab.runtime.assemble import load_model
    from grpolab.runtime.eval_spec import build_grader, sampler_maker

    cfg = _cfg(tiny_model_dir, "/tmp", "eval.blind_grader=answer_anywhere",
               "reward.functions=[{name: exact_match, kwargs: {extract: last_number}}]")
    model, tok = load_model(cfg.model)
    dev = [sft_module.Example("1+2=", "3"), sft_module.Example("4+4=", "8")]
    result = sft_module.dev_checker(cfg, model, tok, dev)()
    sampler = sampler_maker(cfg, model, tok)(0.0)
    graded = greedy_decode(sampler, sft_module.tokenize_prompts(dev, tok, cfg.data), dev, build_grader(cfg))
    sampler.close()
    expected = format_errors(graded.correct, graded.answers, graded.blind)
    assert result == sft_module.DevCheck(sum(graded.correct) / 2, sum(expected) / 2)


@pytest.mark.parametrize("override", ["sft.target_format_errors=1.5", "sft.target_format_errors=-0.1"])
def test_out_of_range_targets_are_config_errors(override):
    from grpolab.config import ConfigError

    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])


def test_runs_all_steps_when_the_target_is_not_reached_and_saves_a_loadable_model(tiny_model_dir, tmp_path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "sft.steps=5",
        "sft.target_accuracy=1.01",
        "sft.output_dir=" + str(tmp_path / "m"),
    )
    result = sft_module.sft(cfg)
    assert result.steps == 5 and not result.reached_target and 0 <= result.dev_accuracy <= 1
    rows = read_metrics(result.output_dir)
    assert rows[-1]["sft/dev_greedy_accuracy"] == result.dev_accuracy  # checked at the last step too
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"]

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert any(not torch.equal(a, b) for a, b in zip(before.parameters(), after.parameters(), strict=True))
    assert (tmp_path / "m" / "tokenizer.json").exists() and (tmp_path / "m" / "config.yaml").exists()


def test_a_second_sft_into_a_held_folder_is_one_line(tiny_model_dir, tmp_path, capsys):
    """Another run holds the output folder: grpolab sft stops with one line, before any model loads."""
    overrides = _overrides(tiny_model_dir, tmp_path, "sft.steps=2")
    with hold_run_dir(load_config(None, overrides).sft_dir):
        assert main(["sft", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpolab: error: ") and "in use by another run" in err[0]
    assert err[0].endswith("choose another sft.output_dir")
