from __future__ import annotations

import pytest
import torch

from grpolab.rollout.base import Sampler
from grpolab.rollout.hf import HFSampler

G = 4


def teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """Reference: one unpadded full forward, log_softmax(logits / T) of each completion token."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def assert_logprobs_match_reference(model, out, temperature: float, atol: float) -> None:
    for row in range(out.num_sequences):
        n = int(out.lengths[row])
        completion = out.completion_ids[row, :n].tolist()
        expected = teacher_forced_logprobs(model, out.prompt_ids[row], completion, temperature)
        torch.testing.assert_close(out.logprobs[row, :n], expected, atol=atol, rtol=0)


def greedy_ids_one_by_one(model, tok, prompts, max_new_tokens: int, eos: int) -> list[list[int]]:
    """Reference greedy tokens from model.generate, one unpadded prompt at a time."""
    rows = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id,
        )
        rows.append(out[0, len(p) :].tolist())
    return rows


def test_is_a_sampler(model, tok):
    assert isinstance(HFSampler(model, tok, max_completion_length=4), Sampler)


def test_group_shape_and_prompt_major_rows(model, tok, prompts):
    out = HFSampler(model, tok, max_completion_length=6, temperature=0).sample(prompts, num_generations=G)
    n = len(prompts) * G
    assert out.completion_ids.shape == out.completion_mask.shape == out.logprobs.shape == (n, 6)
    assert out.completion_ids.dtype == torch.long and out.completion_mask.dtype == torch.bool
    assert out.logprobs.dtype == torch.float32
    assert out.num_generations == G and len(out.texts) == len(out.finish_reasons) == n
    assert out.prompt_ids == [p for p in prompts for _ in range(G)]
    # Row p*G + g belongs to prompt p: each prompt sampled alone gives its G rows.
    for p, prompt in enumerate(prompts):
        alone = HFSampler(model, tok, max_completion_length=6, temperature=0).sample(
            [prompt], num_generations=G
        )
        assert torch.equal(out.completion_ids[p * G : (p + 1) * G], alone.completion_ids)
    assert not torch.equal(out.completion_ids[0], out.completion_ids[G])


@pytest.mark.parametrize(("model_name", "top_k", "top_p"), [("eos_model", 0, 1.0), ("model", 5, 0.8)])
def test_logprobs_equal_teacher_forced_forward(request, tok, prompts, model_name, top_k, top_p):
    # Left-padded prompts of different lengths; logprobs are over the full, unfiltered distribution.
    # (With filters on, the EOS-biased model would stop every row at once: use the plain one.)
    model = request.getfixturevalue(model_name)
    sampler = HFSampler(model, tok, max_completion_length=10, temperature=0.7, top_k=top_k, top_p=top_p)
    out = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(1))
    assert out.lengths.max() >= 5  # some tokens well past the prompt to compare (the seed gives them)
    assert_logprobs_match_reference(model, out, temperature=0.7, atol=1e-4)


def test_eos_mask_padding_and_finish_reasons(eos_model, tok, prompts):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    sampler = HFSampler(eos_model, tok, max_completion_length=8, temperature=1.0)
    out = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(3))
    assert set(out.finish_reasons) == {"stop", "length"}  # the seed gives both kinds
    for row in range(out.num_sequences):
        ids, mask = out.completion_ids[row].tolist(), out.completion_mask[row].tolist()
        hits = [t for t, i in enumerate(ids) if i == eos]
        if out.finish_reasons[row] == "stop":
            first = hits[0]
            assert mask == [True] * (first + 1) + [False] * (len(ids) - first - 1)
            assert ids[first + 1 :] == [pad] * (len(ids) - first - 1)
            assert out.logprobs[row, first + 1 :].eq(0).all()
            assert out.texts[row] == tok.decode(ids[:first], skip_special_tokens=True)
            assert out.items()[row].num_tokens == first + 1
        else:
            assert hits == [] and all(mask) and len(ids) == 8
            assert out.texts[row] == tok.decode(ids, skip_special_tokens=True) and out.items()[row].truncated


def test_loop_stops_when_every_row_has_finished(model, tok, prompts):
    # Make the first greedy token of prompt 0 the EOS: its rows stop at step 0, others run on.
    first = HFSampler(model, tok, max_completion_length=1, temperature=0).sample(
        prompts[:1], num_generations=1
    )
    stop_id = int(first.completion_ids[0, 0])
    out = HFSampler(model, tok, max_completion_length=5, temperature=0, eos_token_ids=[stop_id]).sample(
        prompts[:1], num_generations=2
    )
    assert out.completion_ids.shape == (2, 1) and out.finish_reasons == ["stop", "stop"]
    assert out.texts == ["", ""]  # the EOS itself is never in the text


def test_greedy_equals_generate(model, tok, prompts):
    out = HFSampler(model, tok, max_completion_length=7, temperature=0).sample(prompts, num_generations=1)
    expected = greedy_ids_one_by_one(model, tok, prompts, 7, eos=tok.eos_token_id)
    assert out.completion_ids.tolist() == expected
    assert_logprobs_match_reference(model, out, temperature=1.0, atol=1e-4)  # T = 1 for greedy


def test_greedy_equals_generate_with_early_eos(model, tok, prompts):
    # A token that greedy decoding emits mid-sequence for prompt 0 plays EOS: rows stop at different steps.
    free = HFSampler(model, tok, max_completion_length=7, temperature=0).sample(prompts, num_generations=1)
    stop_id = int(free.completion_ids[0, 2])
    out = HFSampler(model, tok, max_completion_length=7, temperature=0, eos_token_ids=[stop_id]).sample(
        prompts, num_generations=1
    )
    expected = greedy_ids_one_by_one(model, tok, prompts, 7, eos=stop_id)
    width = out.completion_ids.shape[1]
    assert out.completion_ids.tolist() == [e + [tok.pad_token_id] * (width - len(e)) for e in expected]
    assert out.finish_reasons[0] == "stop"


def test_top_k_1_equals_greedy(model, tok, prompts):
    greedy = HFSampler(model, tok, max_completion_length=6, temperature=0).sample(prompts, num_generations=2)
    top1 = HFSampler(model, tok, max_completion_length=6, temperature=0.7, top_k=1).sample(
        prompts, num_generations=2, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(greedy.completion_ids, top1.completion_ids)


def test_same_seed_same_result(eos_model, tok, prompts):
    sampler = HFSampler(eos_model, tok, max_completion_length=8, temperature=0.9, top_p=0.95)
    a, b, c = (
        sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(s))
        for s in (7, 7, 8)
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.texts == b.texts and a.finish_reasons == b.finish_reasons
    assert not torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.parametrize("max_batch_sequences", [1, 3, 5, 64])
def test_chunking_gives_identical_greedy_results(model, tok, prompts, max_batch_sequences):
    # A mid-sequence EOS gives rows of different lengths, so blocks end at different T.
    free = HFSampler(model, tok, max_completion_length=7, temperature=0).sample(prompts, num_generations=1)
    kwargs = dict(max_completion_length=7, temperature=0, eos_token_ids=[int(free.completion_ids[0, 2])])
    whole = HFSampler(model, tok, **kwargs).sample(prompts, num_generations=G)
    chunked = HFSampler(model, tok, max_batch_sequences=max_batch_sequences, **kwargs).sample(
        prompts, num_generations=G
    )
    assert torch.equal(whole.completion_ids, chunked.completion_ids)
    assert torch.equal(whole.completion_mask, chunked.completion_mask)
    torch.testing.assert_close(whole.logprobs, chunked.logprobs, atol=1e-5, rtol=0)
    assert whole.texts == chunked.texts and whole.finish_reasons == chunked.finish_reasons
    assert whole.prompt_ids == chunked.prompt_ids


def test_bf16_autocast_logprobs_close_to_fp32(model, tok, prompts):
    sampler = HFSampler(model, tok, max_completion_length=8, temperature=0.7, autocast_dtype=torch.bfloat16)
    out = sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(0))
    assert out.logprobs.dtype == torch.float32
    # bf16 keeps 8 mantissa bits (relative error ~4e-3); 0.05 nats absolute covers it on this model.
    assert_logprobs_match_reference(model, out, temperature=0.7, atol=0.05)


def test_peft_model_and_training_mode_restored(tok, prompts):
    from peft import LoraConfig, get_peft_model

    from grpolab.tasks.tiny import build_tiny_model

    base = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=2)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    model.train()
    out = HFSampler(model, tok, max_completion_length=5, temperature=0.7).sample(
        prompts, num_generations=2, generator=torch.Generator().manual_seed(0)
    )
    assert model.training
    model.eval()
    assert_logprobs_match_reference(model, out, temperature=0.7, atol=1e-4)


def test_outputs_are_usable_under_autograd(model, tok, prompts):
    out = HFSampler(model, tok, max_completion_length=4).sample(prompts, num_generations=2)
    logits = torch.randn(*out.completion_ids.shape, 11, requires_grad=True)
    picked = logits.log_softmax(-1).gather(-1, (out.completion_ids % 11)[..., None])  # saves the index
    (picked.squeeze(-1) - out.logprobs).sum().backward()
    assert logits.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_completion_length": 0}, "max_completion_length"),
        ({"max_completion_length": 4, "temperature": -1.0}, "temperature"),
        ({"max_completion_length": 4, "top_p": 0.0}, "top_p"),
        ({"max_completion_length": 4, "top_k": -1}, "top_k"),
        ({"max_completion_length": 4, "min_p": 1.5}, "min_p"),
        ({"max_completion_length": 4, "repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_completion_length": 4, "max_batch_sequences": 0}, "max_batch_sequences"),
    ],
)
def test_bad_settings_are_rejected(model, tok, kwargs, match):
    with pytest.raises(ValueError, match=match):
        HFSampler(model, tok, **kwargs)


def test_bad_prompts_are_rejected(model, tok):
    sampler = HFSampler(model, tok, max_completion_length=4)
    with pytest.raises(ValueError, match=r"prompts \[1\] have no tokens"):
        sampler.sample([[5], []], num_generations=2)
    with pytest.raises(ValueError, match="num_generations"):
        sampler.sample([[5]], num_generations=0)


@pytest.mark.parametrize("every", [3, 16])
def test_asking_whether_all_stopped_every_few_tokens_gives_the_same_completions(model, tok, prompts, monkeypatch, every):
    """On CUDA the "every row stopped?" host sync runs every few tokens (rollout/hf.py); the steps it
    runs past the last stop are masked and trimmed, so the completions equal the every-token check's."""
    import grpolab.rollout.hf as hf

    free = HFSampler(model, tok, max_completion_length=9, temperature=0).sample(prompts, num_generations=1)
    stop_id = int(free.completion_ids[0, 1])  # rows stop at different steps
    make = lambda: HFSampler(model, tok, max_completion_length=9, temperature=0, eos_token_ids=[stop_id])  # noqa: E731
    want = make().sample(prompts, num_generations=2)
    assert hf.finished_check_every(torch.device("cpu")) == 1 and hf.finished_check_every(torch.device("cuda")) == 16
    monkeypatch.setattr(hf, "finished_check_every", lambda device: every)
    got = make().sample(prompts, num_generations=2)
    assert got.completion_ids.tolist() == want.completion_ids.tolist()
    assert got.completion_mask.tolist() == want.completion_mask.tolist()
    assert got.finish_reasons == want.finish_reasons and got.texts == want.texts
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-6, rtol=1e-6)


def test_decode_mask_mode_keeps_the_2d_mask_where_it_is_needed_or_free():
    import grpolab.rollout.hf as hf

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    sdpa, flash = type("C", (), {"_attn_implementation": "sdpa"}), type("C", (), {"_attn_implementation": "flash_attention_2"})
    assert hf.decode_mask_mode(cpu, sdpa, padded=True, reserved=False) == "2d"  # a CPU's sync is free
    assert hf.decode_mask_mode(cpu, sdpa, padded=False, reserved=False) == "2d"
    assert hf.decode_mask_mode(cuda, sdpa, padded=False, reserved=True) == "2d"  # unwritten slots to hide
    assert hf.decode_mask_mode(cuda, sdpa, padded=False, reserved=False) == "none"
    assert hf.decode_mask_mode(cuda, flash, padded=False, reserved=False) == "none"
    assert hf.decode_mask_mode(cuda, sdpa, padded=True, reserved=False) == "4d"
    assert hf.decode_mask_mode(cuda, flash, padded=True, reserved=False) == "2d"  # flash unpads 2-D masks itself


@pytest.mark.parametrize("mode, padded", [("4d", True), ("none", False)])
def test_the_cuda_decode_masks_give_the_2d_masks_completions_without_asking_for_padding(
    model, tok, prompts, monkeypatch, mode, padded
):
    """On CUDA the decode steps pass SDPA's boolean 4-D mask (padded rows) or none (no row padded), so that
    transformers never asks ``padding_mask.all()``, a host sync per token; the completions and log-probs
    are the 2-D mask's. Run here on a CPU by forcing the mode the CUDA device would get."""
    import transformers.masking_utils as masking

    import grpolab.rollout.hf as hf

    assert model.config._attn_implementation == "sdpa"
    batch = prompts if padded else [tok.encode("1+2="), tok.encode("9*8="), tok.encode("ab=c")]
    make = lambda: HFSampler(model, tok, max_completion_length=8, temperature=1.0)  # noqa: E731
    want = make().sample(batch, num_generations=2, generator=torch.Generator().manual_seed(3))
    asked = []
    real_all = masking.fast_all
    monkeypatch.setattr(masking, "fast_all", lambda m: asked.append(m.shape) or real_all(m))
    monkeypatch.setattr(hf, "decode_mask_mode", lambda *a, **k: mode)
    got = make().sample(batch, num_generations=2, generator=torch.Generator().manual_seed(3))
    assert got.completion_ids.tolist() == want.completion_ids.tolist()
    assert got.completion_mask.tolist() == want.completion_mask.tolist()
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
    width = max(map(len, batch))
    assert all(shape[-1] == width for shape in asked)  # the prefill's own questions, none per decoded token


def test_greedy_with_a_repetition_penalty_equals_generate(model, tok, prompts):
    out = HFSampler(model, tok, max_completion_length=7, temperature=0, repetition_penalty=1.8).sample(
        prompts, num_generations=1
    )
    expected = []
    for p in prompts:  # one unpadded prompt at a time: generate would penalise its left padding too
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=7,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, repetition_penalty=1.8)
        expected.append(gen[0, len(p) :].tolist())
    assert out.completion_ids.tolist() == expected
    plain = HFSampler(model, tok, max_completion_length=7, temperature=0).sample(prompts, num_generations=1)
    assert out.completion_ids.tolist() != plain.completion_ids.tolist()  # the penalty changed what was drawn
    assert_logprobs_match_reference(model, out, temperature=1.0, atol=1e-4)  # not the log-probs


def test_min_p_and_the_penalty_shape_the_draw_not_the_logprobs(model, tok, prompts):
    sampler = HFSampler(model, tok, max_completion_length=10, temperature=0.7, min_p=0.2, repetition_penalty=1.3)
    out = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(0))
    assert_logprobs_match_reference(model, out, temperature=0.7, atol=1e-4)


def test_a_hybrid_mamba_model_samples_each_prompts_rows_from_its_own_states(tok, prompts):
    """NemotronH's cache holds Mamba conv / recurrent states in layers without batch_select_indices: each prompt's
    prefilled row is repeated for its samples with reorder_cache (rollout.hf_cache.select_rows). Wrong states for a row
    would show as log-probs unlike the teacher-forced forward's."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(vocab_size=len(tok), hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=32, layers_block_type=["mamba", "attention"], mamba_num_heads=8,
                             mamba_head_dim=4, mamba_n_groups=1, ssm_state_size=16, mamba_d_conv=4, mamba_expand=2,
                             use_mamba_kernels=False, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = NemotronHForCausalLM(config).eval()
    sampler = HFSampler(model, tok, max_completion_length=6, temperature=0.7)
    out = sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(0))
    assert out.completion_ids.shape[0] == 2 * len(prompts)
    assert_logprobs_match_reference(model, out, temperature=0.7, atol=1e-4)
