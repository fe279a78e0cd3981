"""k1 and k3 against the exact KL over the vocabulary, on samples of the policy (claim 3 of grpolab claims)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpolab.config import Config, load_config
from grpolab.eval.kl import measure_kl, position_moments, token_kls
from grpolab.runtime.eval_spec import kl_sampler
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def models():
    tok = build_char_tokenizer()
    policy = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=1).eval()
    reference = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=2).eval()
    return tok, policy, reference


def _cfg(length: int = 6) -> Config:
    cfg = load_config(None, [f"rollout.max_completion_length={length}", "rollout.temperature=0.7", "rollout.top_k=5"])
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, autocast="none"))


def test_the_exact_kl_and_the_estimators_match_a_full_logits_computation(models):
    tok, policy, reference = models
    prompt = tok("12+34=")["input_ids"]
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    with torch.no_grad():
        k1, k3, exact, _ = token_kls(policy, reference, prompt, ids, mask)
        want_k1, want_exact = [], []
        for row in range(2):
            n = int(mask[row].sum())
            full = torch.tensor([prompt + ids[row, :n].tolist()])
            lp = torch.log_softmax(policy(full).logits[0].float(), -1)[len(prompt) - 1 : len(prompt) - 1 + n]
            lq = torch.log_softmax(reference(full).logits[0].float(), -1)[len(prompt) - 1 : len(prompt) - 1 + n]
            tokens = ids[row, :n]
            want_k1.append(lp.gather(-1, tokens[:, None])[:, 0] - lq.gather(-1, tokens[:, None])[:, 0])
            want_exact.append((lp.exp() * (lp - lq)).sum(-1))
    want_k1 = torch.cat(want_k1)
    torch.testing.assert_close(k1.float(), want_k1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exact.float(), torch.cat(want_exact), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k3.float(), torch.expm1(-want_k1) + want_k1, atol=1e-5, rtol=1e-5)
    assert bool((exact >= 0).all()) and bool((k3 >= 0).all())


def test_on_the_policy_s_samples_both_estimators_are_unbiased_and_only_k1_goes_negative(models):
    tok, policy, reference = models
    prompts = [tok(f"{a}+{b}=")["input_ids"] for a, b in [(1, 2), (33, 4), (5, 67), (8, 9)]]
    m = measure_kl(policy, reference, kl_sampler(_cfg(), policy, tok), prompts, num_generations=64, seed=0)
    assert m.sequences == 4 * 64 and m.tokens > 1000
    assert m.exact_mean > 0.01  # two random models: a real KL
    assert m.k3_min >= 0.0 and m.k1_negative_share > 0.05 and m.k1_min < 0
    # sampled at T=1 without top-k (the config's 0.7 and top_k=5 are overridden): unbiased for the exact mean
    assert abs(m.k1_mean - m.exact_mean) < 4 * m.k1_bias_se <= 4 * m.k1_se * 1.5
    assert abs(m.k3_mean - m.exact_mean) < 4 * m.k3_bias_se
    assert m.exact_seq_mean == pytest.approx(m.exact_mean * m.tokens / m.sequences, rel=1e-6)


def test_a_policy_equal_to_its_reference_has_no_kl(models):
    tok, policy, _ = models
    m = measure_kl(policy, policy, kl_sampler(_cfg(), policy, tok), [tok("1+1=")["input_ids"]], num_generations=8, seed=0)
    assert abs(m.exact_mean) < 1e-6 and abs(m.k1_mean) < 1e-6 and m.k3_mean < 1e-6


def test_exact_moments_by_hand():
    """Two tokens, pi = (0.75, 0.25), ref = (0.5, 0.5): every moment computed by hand."""
    logp = torch.tensor([[0.75, 0.25]]).log()
    logq = torch.tensor([[0.5, 0.5]]).log()
    m = position_moments(logp, logq)
    k1 = torch.tensor([math.log(1.5), math.log(0.5)], dtype=torch.float64)
    r = torch.tensor([0.5 / 0.75, 0.5 / 0.25], dtype=torch.float64)
    k3 = r - r.log() - 1
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert m["kl"].item() == pytest.approx(kl, rel=1e-6)
    assert m["e1"].item() == pytest.approx(kl, rel=1e-6)
    assert m["e3"].item() == pytest.approx(kl, rel=1e-6)  # sum ref - 1 + KL
    assert m["v1"].item() == pytest.approx(float((p * k1**2).sum()) - kl**2, rel=1e-5)
    assert m["v3"].item() == pytest.approx(float((p * k3**2).sum()) - kl**2, rel=1e-5)
    assert m["k3_min"].item() == pytest.approx(float(k3.min()), rel=1e-5)


def test_a_clamped_ratio_biases_the_implemented_k3_and_not_the_formula():
    """ref puts 0.5 on a token pi gives e^-30: beyond kl_k3's clamp of 20 the implementation loses most of it."""
    logp = torch.tensor([[math.log1p(-math.exp(-30)), -30.0]], dtype=torch.float64)
    logq = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    m = position_moments(logp, logq)
    assert m["e3"].item() == pytest.approx(m["kl"].item(), abs=1e-12)
    assert m["e3_impl"].item() < m["kl"].item() - 0.4  # the clamped ratio e^20 * e^-30 instead of 0.5


def test_on_the_policy_s_samples_the_exact_expectations_are_the_kl(models):
    tok, policy, reference = models
    prompts = [tok(f"{a}+{b}=")["input_ids"] for a, b in [(1, 2), (33, 4)]]
    m = measure_kl(policy, reference, kl_sampler(_cfg(), policy, tok), prompts, num_generations=16, seed=0)
    assert m.exact_mean > 0.01
    assert m.k1_bias_max < 1e-12 and m.k3_bias_max < 1e-12 and m.bias_rel_max < 1e-9
    assert m.k3_vocab_min >= 0.0 and abs(m.clamp_bias_mean) < 1e-12
    assert m.variance["all"]["positions"] == m.tokens
    assert sum(m.variance[b]["positions"] for b in ("near", "middle", "far")) == m.tokens
    assert m.variance["all"]["k1_var"] > 0 and m.variance["all"]["k3_var"] > 0
