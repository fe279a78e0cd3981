"""The lean RMSNorm, SwiGLU, q/k/v projections and eager attention (grpolab.models.lean_ops): the same forward as
transformers' blocks, gradients as accurate as autograd's, and less kept for the backward."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

from grpolab.models.inference import attention_for
from grpolab.models.lean_ops import (
    LEAN_ATTENTIONS,
    LEAN_EAGER,
    RMS_NORMS,
    SWIGLU_MLPS,
    RMSNormFn,
    SiluMulFn,
    install_lean_ops,
    lean_eager_attention,
    register_lean_eager,
)

BF16 = torch.bfloat16
MODULES = {"Llama": modeling_llama, "Qwen2": modeling_qwen2, "Qwen3": modeling_qwen3, "Mistral": modeling_mistral}


def _llama(heads: int = 6, kv_heads: int = 2, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=100, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="eager",
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def _batch(rows: int = 4, width: int = 20, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    if padded:
        mask[0, :5] = 0  # a left-padded row
    return ids, mask


def _grads(model, ids, mask, *, autocast: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        logits = model(ids, attention_mask=mask).logits
    (logits.double().square() * mask[..., None]).mean().backward()
    return logits.detach(), {n: p.grad.double().clone() for n, p in model.named_parameters()}


def _lean(model):
    lean = copy.deepcopy(model)
    install_lean_ops(lean)
    lean.config._attn_implementation = register_lean_eager()
    return lean


def test_the_known_classes_have_the_forward_the_lean_ops_replace():
    """The lists name classes whose transformers source is Llama's: a new transformers that changes one shows here."""
    for cls_names, attr in ((RMS_NORMS, "RMSNorm"), (SWIGLU_MLPS, "MLP")):
        llama = inspect.getsource(getattr(modeling_llama, "Llama" + attr).forward)
        for name in cls_names:
            prefix = name.removesuffix(attr)
            assert inspect.getsource(getattr(MODULES[prefix], name).forward) == llama, name
    llama_eager = inspect.getsource(modeling_llama.eager_attention_forward)
    for name in LEAN_ATTENTIONS:
        module = MODULES[name.removesuffix("Attention")]
        source = inspect.getsource(module.eager_attention_forward)
        assert source == llama_eager, name
        assert "repeat_kv" in inspect.getsource(module.repeat_kv)


def test_install_counts_modules_and_keeps_parameters_and_state_dict():
    model = _llama()
    keys = list(model.state_dict())
    # 2 layers x (2 norms + MLP + attention's projections) + the final norm
    assert install_lean_ops(model) == 9
    assert list(model.state_dict()) == keys
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"  # the class is kept (hf_decode reads it)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_rms_norm_forward_is_transformers_and_its_gradient_matches(dtype):
    norm = modeling_llama.LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 48))
    x = (torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(0)) * 3).to(dtype).requires_grad_()
    ref = norm(x)
    out = RMSNormFn.apply(x, norm.weight, norm.variance_epsilon)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # the same ops in the same order
    g = torch.randn_like(ref)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, norm.weight), g)
    gx, gw = torch.autograd.grad(out, (x, norm.weight), g)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # a bf16 input's gradient is rounded to bf16 either way
    torch.testing.assert_close(gx.float(), gx_ref.float(), rtol=tol, atol=tol * gx_ref.float().abs().max().item())
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-5 * gw_ref.abs().max().item())


def test_silu_mul_matches_autograd_exactly():
    gen = torch.Generator().manual_seed(0)
    gate = torch.randn(6, 40, generator=gen).to(BF16).requires_grad_()
    up = torch.randn(6, 40, generator=gen).to(BF16).requires_grad_()
    g = torch.randn(6, 40, generator=gen).to(BF16)
    ref = torch.nn.functional.silu(gate) * up
    out = SiluMulFn.apply(gate, up)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # the same kernels as autograd's (aten.silu_backward and the products): the same bf16 numbers
    for a, b in zip(torch.autograd.grad(out, (gate, up), g), torch.autograd.grad(ref, (gate, up), g), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (6, 6)])
def test_eager_attention_forward_and_gradients(heads, kv_heads):
    """Grouped (6 query heads on 2 kv heads) and plain multi-head: the output equals transformers' eager attention
    and the gradients do to fp32 rounding, with a left-padded row's mask."""
    attn = _llama(heads, kv_heads).model.layers[0].self_attn
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, heads, 7, 16, generator=gen, requires_grad=True)
    k = torch.randn(2, kv_heads, 9, 16, generator=gen, requires_grad=True)
    v = torch.randn(2, kv_heads, 9, 16, generator=gen, requires_grad=True)
    mask = torch.zeros(2, 1, 7, 9)
    mask[0, :, :, :3] = torch.finfo(torch.float32).min
    ref, _ = modeling_llama.eager_attention_forward(attn, q, k, v, mask, scaling=0.25)
    out, weights = lean_eager_attention(attn, q, k, v, mask, scaling=0.25)
    assert weights is None and out.shape == ref.shape == (2, 7, heads, 16)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_eager_attention_hands_dropout_and_unknown_modules_to_the_models_own():
    attn = _llama().model.layers[0].self_attn
    q, k, v = torch.randn(1, 6, 3, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    attn.train()
    torch.manual_seed(0)
    out, weights = lean_eager_attention(attn, q, k, v, None, scaling=0.25, dropout=0.5)
    assert weights is not None  # transformers' eager attention returns its weights; the lean one returns None
    torch.manual_seed(0)
    ref, _ = modeling_llama.eager_attention_forward(attn, q, k, v, None, scaling=0.25, dropout=0.5)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("build", [_llama, _qwen2], ids=["llama-gqa", "qwen2-bias"])
def test_whole_model_fp32_gradients_match_transformers(build):
    model = build()
    lean = _lean(model)
    ids, mask = _batch()
    logits, grads = _grads(model, ids, mask, autocast=False)
    lean_logits, lean_grads = _grads(lean, ids, mask, autocast=False)
    torch.testing.assert_close(lean_logits, logits, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("build", [_llama, _qwen2], ids=["llama-gqa", "qwen2-bias"])
def test_whole_model_bf16_autocast_gradients_are_as_accurate_as_transformers(build):
    """Under bf16 autocast both differ from the exact (float64) gradient by bf16 rounding (~1%); the lean ops'
    error is autograd's own (over all parameters within 1.25x of it; one tensor's, of a few roundings, within 2x),
    and the logits are the same."""
    model = build()
    lean = _lean(model)
    exact = copy.deepcopy(model).double()
    ids, mask = _batch(padded=False)  # float64's mask minimum overflows on a fully masked row
    logits, grads = _grads(model, ids, mask, autocast=True)
    lean_logits, lean_grads = _grads(lean, ids, mask, autocast=True)
    _, truth = _grads(exact, ids, mask, autocast=False)
    torch.testing.assert_close(lean_logits, logits, rtol=0, atol=2e-2)  # bf16 logits, a product's rounding apart
    errors = {"hf": 0.0, "lean": 0.0}
    for name, t in truth.items():
        hf_err = ((grads[name] - t).norm() / t.norm()).item()
        lean_err = ((lean_grads[name] - t).norm() / t.norm()).item()
        assert lean_err <= 2 * hf_err + 1e-4, (name, lean_err, hf_err)  # one tensor's rounding errors are few
        errors["hf"] += hf_err**2
        errors["lean"] += lean_err**2
    assert errors["lean"] <= 1.25**2 * errors["hf"], errors


def test_a_training_forward_keeps_less_for_the_backward():
    """The bytes autograd keeps for one forward (every saved tensor's storage once) under bf16 autocast."""

    def kept(model) -> int:
        seen: dict[int, int] = {}

        def pack(t):
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            return t

        ids, mask = _batch(rows=8, width=32, padded=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=BF16):
            model(ids, attention_mask=mask)
        params = sum(p.untyped_storage().nbytes() for p in model.parameters())  # weights kept as themselves
        return sum(seen.values()) - params

    model = _llama()
    plain, lean = kept(model), kept(_lean(model))
    assert lean < 0.8 * plain, (lean, plain)


def test_deepcopy_runs_the_copys_own_weights():
    """The reference is a deep copy of the policy: its packed projections must read its own weights."""
    model = _llama()
    install_lean_ops(model)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(0.5)
    ids, mask = _batch(padded=False)
    fresh = _llama()
    with torch.no_grad():
        for p in fresh.parameters():
            p.mul_(0.5)
    for recording in (False, True):
        with torch.set_grad_enabled(recording):
            torch.testing.assert_close(clone(ids, attention_mask=mask).logits, fresh(ids, attention_mask=mask).logits)


def test_packed_projections_equal_the_separate_ones_and_fall_back_on_another_input():
    attn = _qwen2().model.layers[0].self_attn  # q, k, v with biases
    separate = copy.deepcopy(attn)
    install_lean_ops(attn)
    x = torch.randn(2, 5, 64, requires_grad=True)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    for got, layer in zip((q, k, v), (separate.q_proj, separate.k_proj, separate.v_proj), strict=True):
        torch.testing.assert_close(got, layer(x), rtol=1e-6, atol=1e-6)
    assert q.grad_fn is not None and k.grad_fn is not None
    other = torch.randn(2, 5, 64)
    torch.testing.assert_close(attn.k_proj(other), separate.k_proj(other), rtol=0, atol=0)  # not the handed input


def test_lora_wrapped_projections_keep_their_adapters():
    from peft import LoraConfig, get_peft_model

    model = _llama()
    install_lean_ops(model)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "gate_proj"], lora_dropout=0.0))
    ids, mask = _batch(padded=False)
    out = peft_model(ids, attention_mask=mask).logits.square().mean()
    out.backward()
    lora = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert lora and all(p.grad is not None for p in lora)  # the adapters are in the graph


def test_attention_for_switches_eager_to_the_lean_eager():
    model = _llama()
    model.config._attn_implementation = "sdpa"
    seen = []
    with attention_for(model, torch.device("cpu"), BF16, rows=2, q_len=4, kv_len=4):
        seen.append(model.config._attn_implementation)
    assert seen == [LEAN_EAGER] and model.config._attn_implementation == "sdpa"


def test_other_models_keep_transformers_eager_attention():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16))
    model.config._attn_implementation = "sdpa"
    with attention_for(model, torch.device("cpu"), BF16, rows=2, q_len=4, kv_len=4):
        assert model.config._attn_implementation == "eager"
        model(torch.tensor([[1, 2, 3, 4]]))
