"""Low-precision inference copies and the attention choice (grpolab.models.inference)."""

from __future__ import annotations

import pytest
import torch

from grpolab.models.inference import (
    WeightCopy,
    attention_for,
    attention_implementation,
    enable_checkpointing,
    inference_copy,
    packs_linear,
    use_eager_attention,
)
from grpolab.models.lean_ops import LEAN_EAGER
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=3)


def _ids() -> torch.Tensor:
    return torch.tensor([[5, 9, 12, 7, 30, 31, 2], [8, 8, 40, 41, 42, 6, 9]])


def test_copy_stores_linear_weights_in_bf16_and_keeps_the_rest(model):
    ref = inference_copy(model, BF16)
    layer = ref.model.layers[0]
    assert layer.self_attn.q_proj.weight.dtype == BF16 and layer.self_attn.q_proj.bias.dtype == BF16
    assert layer.mlp.down_proj.weight.dtype == BF16
    assert ref.lm_head.weight.dtype == torch.float32  # the head stays fp32 (tied to the embeddings here)
    assert ref.model.embed_tokens.weight.dtype == torch.float32
    assert layer.input_layernorm.weight.dtype == torch.float32
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the source is untouched


def test_bf16_copy_under_autocast_computes_what_autocast_computes(model):
    ref = inference_copy(model, BF16)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        want = model(input_ids=_ids()).logits.float()
        got = ref(input_ids=_ids()).logits.float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_weight_copy_refresh_follows_the_source_and_release_frees_it():
    source = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=4)
    copy = WeightCopy(source, BF16, pack=False)
    up = copy.model.model.layers[1].mlp.up_proj.weight
    assert up.numel() == 0  # nothing held until the first refresh
    with torch.no_grad():
        source.model.layers[1].mlp.up_proj.weight.mul_(-2.0)
    refreshed = copy.refresh()
    assert refreshed is copy.model and up.dtype == BF16
    assert torch.equal(up, source.model.layers[1].mlp.up_proj.weight.to(BF16))
    embedding, head = refreshed.model.embed_tokens.weight, refreshed.lm_head.weight
    assert source.lm_head.weight is source.model.embed_tokens.weight  # tied in the source
    assert embedding.dtype == torch.float32 and embedding.data_ptr() == source.model.embed_tokens.weight.data_ptr()
    assert head.dtype == BF16 and torch.equal(head, source.lm_head.weight.to(BF16))  # its own, cast once per refresh
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        torch.testing.assert_close(
            refreshed(input_ids=_ids()).logits, source(input_ids=_ids()).logits, atol=1e-5, rtol=0
        )
    copy.release()
    assert up.numel() == 0 and refreshed.lm_head.weight.numel() == 0 and embedding.numel() == 0
    assert source.lm_head.weight.numel() > 0  # the source keeps its weights


@pytest.mark.skipif(not packs_linear(torch.device("cpu"), BF16), reason="this CPU's oneDNN has no native bf16")
def test_packed_copy_computes_what_the_plain_copy_computes_and_frees_its_bf16_weights():
    source = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=5)
    plain, packed = WeightCopy(source, BF16, pack=False), WeightCopy(source, BF16)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        want = plain.refresh()(input_ids=_ids()).logits
        net = packed.refresh()
        q = net.model.layers[0].self_attn.q_proj
        assert q.weight.numel() == 0 and q.forward.group.weight.is_mkldnn  # q/k/v's packed weight replaces theirs
        torch.testing.assert_close(net(input_ids=_ids()).logits, want, atol=1e-5, rtol=0)
        with torch.no_grad():
            source.model.layers[0].mlp.up_proj.weight.mul_(-1.0)  # the next refresh packs the new weights
        moved = plain.refresh()(input_ids=_ids()).logits
        torch.testing.assert_close(packed.refresh()(input_ids=_ids()).logits, moved, atol=1e-5, rtol=0)
        assert (moved - want).abs().max() > 1e-2
    packed.release()
    assert q.forward.group.weight is None and q.weight.numel() == 0


@pytest.mark.skipif(not packs_linear(torch.device("cpu"), BF16), reason="this CPU's oneDNN has no native bf16")
def test_sibling_linears_share_one_product_and_each_input_gets_its_own():
    source = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=1, num_heads=4, seed=8)
    copy = WeightCopy(source, BF16)
    attn, mlp = copy.refresh().model.layers[0].self_attn, copy.model.model.layers[0].mlp
    group = attn.q_proj.forward.group
    assert mlp.gate_proj.forward.group is mlp.up_proj.forward.group and group is attn.v_proj.forward.group
    assert group.weight.is_mkldnn and group.bias.shape == (3 * 64,)  # Qwen2's q/k/v have biases
    src = source.model.layers[0].self_attn
    x, y = torch.randn(3, 64), torch.randn(3, 64)

    def want(linear, inp):
        return torch.nn.functional.linear(inp.to(BF16), linear.weight.to(BF16), linear.bias.to(BF16)).float()

    calls = []
    real = type(group).__call__
    type(group).__call__ = lambda self, inp: calls.append(1) or real(self, inp)
    try:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        assert len(calls) == 1 and group._kept is None  # one product; nothing held once all three took theirs
        k_other, k_again = attn.k_proj(y), attn.k_proj(y)  # another input, then the same member twice
        assert len(calls) == 3
    finally:
        type(group).__call__ = real
    for got, linear, inp in [(q, src.q_proj, x), (k, src.k_proj, x), (v, src.v_proj, x), (k_other, src.k_proj, y)]:
        torch.testing.assert_close(got.float(), want(linear, inp), atol=2e-2, rtol=2e-2)
    assert torch.equal(k_again, k_other)
    copy.release()
    assert group.weight is None and group._kept is None


@pytest.mark.skipif(not packs_linear(torch.device("cpu"), BF16), reason="this CPU's oneDNN has no native bf16")
def test_a_bf16_model_whose_head_is_its_embedding_keeps_that_weight_when_packed():
    source = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=7).to(BF16)
    assert source.lm_head.weight is source.model.embed_tokens.weight
    net = WeightCopy(source, BF16).refresh()
    assert net.model.embed_tokens.weight.shape == source.model.embed_tokens.weight.shape  # not freed by packing
    assert net.model.layers[0].mlp.up_proj.weight.numel() == 0  # the other Linears are packed
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        torch.testing.assert_close(net(input_ids=_ids()).logits, source(input_ids=_ids()).logits, atol=1e-5, rtol=0)


def test_a_head_kept_in_fp32_stays_fp32_in_the_copy():
    from grpolab.models.chunked_head import install_chunked_head, keep_head_in_fp32

    source = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=6)
    install_chunked_head(source)
    keep_head_in_fp32(source)
    copy = WeightCopy(source, BF16, pack=False)
    net = copy.refresh()
    assert net.lm_head.weight.dtype == torch.float32 and net.lm_head.weight.data_ptr() == source.lm_head.weight.data_ptr()
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        torch.testing.assert_close(net(input_ids=_ids()).logits, source(input_ids=_ids()).logits, atol=1e-5, rtol=0)


def test_packing_is_for_bf16_on_a_cpu_only():
    assert not packs_linear(torch.device("cpu"), torch.float32)
    assert not packs_linear(torch.device("cuda"), BF16)
    assert not packs_linear(torch.device("meta"), BF16)


def test_eager_attention_is_chosen_for_small_bf16_work_on_cpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    small = {"rows": 32, "heads": 8, "q_len": 72, "kv_len": 72}
    assert use_eager_attention(cpu, BF16, **small)
    assert not use_eager_attention(cpu, None, **small)  # fp32: SDPA is as fast
    assert not use_eager_attention(cuda, BF16, **small)
    assert not use_eager_attention(cpu, BF16, rows=64, heads=16, q_len=2048, kv_len=2048)  # scores too big
    assert use_eager_attention(cpu, BF16, rows=64, heads=16, q_len=1, kv_len=4096)  # one-token decoding


def test_attention_switch_restores_and_keeps_other_kernels(model):
    assert model.config._attn_implementation == "sdpa"
    with attention_implementation(model, "eager"):  # transformers' eager attention, in its lean form
        assert model.config._attn_implementation == LEAN_EAGER
    assert model.config._attn_implementation == "sdpa"
    with attention_for(model, torch.device("cpu"), BF16, rows=2, q_len=7, kv_len=7):
        assert model.config._attn_implementation == LEAN_EAGER
    with attention_for(model, torch.device("cpu"), None, rows=2, q_len=7, kv_len=7):
        assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "flex_attention"
    try:
        with attention_implementation(model, "eager"):
            assert model.config._attn_implementation == "flex_attention"
    finally:
        model.config._attn_implementation = "sdpa"


def test_eager_and_sdpa_agree(model):
    with torch.no_grad():
        sdpa = model(input_ids=_ids()).logits
        with attention_implementation(model, "eager"):
            eager = model(input_ids=_ids()).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)


def test_checkpointed_backward_recomputes_with_the_forwards_attention():
    """The forward runs eager (bf16 on a CPU, small) and the switch is undone before backward, as in the
    trainer: the recomputation must run eager too (torch refused SDPA's other saved tensors), and the
    gradients are those of the same model without checkpointing."""
    tok = build_char_tokenizer()
    plain, checkpointed = (build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=3) for _ in range(2))
    enable_checkpointing(checkpointed)
    grads = []
    for net in (plain, checkpointed):
        net.train()
        with torch.autocast("cpu", dtype=BF16), attention_for(net, torch.device("cpu"), BF16, rows=2, q_len=7, kv_len=7):
            assert net.config._attn_implementation == LEAN_EAGER
            loss = net(input_ids=_ids()).logits.float().logsumexp(-1).mean()
        assert net.config._attn_implementation == "sdpa"  # backward runs after the switch is undone
        loss.backward()
        grads.append({n: p.grad for n, p in net.named_parameters()})
    assert checkpointed.is_gradient_checkpointing
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_cpu_threads_are_capped_at_the_available_cores(monkeypatch):
    import os

    import grpolab.models.inference as inference

    assert 1 <= inference.available_cpus() <= (os.cpu_count() or 1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(inference, "available_cpus", lambda: 1)
        assert inference.limit_cpu_threads() == 1
        monkeypatch.setattr(inference, "available_cpus", lambda: 8)
        assert inference.limit_cpu_threads() == 1  # never raised: a lower count set by the user is kept
    finally:
        torch.set_num_threads(before)


def test_a_copy_in_the_models_own_dtype_shares_no_weight_with_it():
    """A bf16 checkpoint under bf16 autocast: the frozen reference must not move with the policy it was copied from."""
    model = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2).to(torch.bfloat16)
    frozen = inference_copy(model, torch.bfloat16)
    before = {n: p.clone() for n, p in frozen.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for name, p in frozen.named_parameters():
        assert torch.equal(p, before[name]), name
