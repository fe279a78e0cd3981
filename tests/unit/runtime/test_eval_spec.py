"""The config read into an evaluation's parts (runtime/eval_spec.py): the grader, the eval section, the samplers."""

from __future__ import annotations

import pytest
import torch

from grpolab.config import ConfigError, load_config
from grpolab.runtime.eval_spec import build_grader, eval_spec, kl_sampler, sampler_maker
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model


def test_the_eval_spec_resolves_its_ks_and_keeps_the_seed():
    spec = eval_spec(load_config(None, ["eval.num_samples=6", "eval.temperature=0.6", "eval.greedy=false", "seed=7"]))
    assert spec.ks == (1, 2, 4, 6)  # eval.ks empty: powers of two up to n, and n
    assert (spec.num_samples, spec.temperature, spec.greedy, spec.seed, spec.blind_grader) == (6, 0.6, False, 7, None)
    assert eval_spec(load_config(None, ["eval.num_samples=8", "eval.ks=[1,8]"])).ks == (1, 8)


def test_the_grader_is_built_with_train_s_checks():
    cfg = load_config(None, [
        "reward.functions=[{name: exact_match}]", "reward.gold=[{name: math_accuracy}]", "eval.correct_threshold=0.25",
        "reward.timeout_s=9", "eval.blind_grader=answer_anywhere",
    ])  # fmt: skip
    grader = build_grader(cfg)
    assert [wr.name for wr in grader.rewards] == ["exact_match"] and [wr.name for wr in grader.gold] == ["math_accuracy"]
    assert (grader.threshold, grader.timeout_s, grader.blind.name) == (0.25, 9.0, "answer_anywhere")
    bad = load_config(None, ["reward.functions=[{name: exact_match}, {name: exact_match}]"])
    with pytest.raises(ConfigError, match=r"reward.functions\[0\] and reward.functions\[1\] are both named"):
        build_grader(bad)


def test_the_samplers_take_the_temperature_and_the_kl_sampler_samples_the_policy_exactly():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=1).eval()
    cfg = load_config(None, ["rollout.temperature=0.7", "rollout.top_k=5", "rollout.top_p=0.9", "model.autocast=bf16"])
    greedy = sampler_maker(cfg, model, tok)(0.0)
    assert greedy.temperature == 0.0 and greedy.autocast_dtype is torch.bfloat16  # model.autocast, as training's
    assert greedy.top_k == 5 and greedy.top_p == 0.9  # the rollout settings stay
    exact = kl_sampler(cfg, model, tok)
    assert (exact.temperature, exact.top_k, exact.top_p, exact.autocast_dtype) == (1.0, 0, 1.0, None)
    for sampler in (greedy, exact):
        sampler.close()
