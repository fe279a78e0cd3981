"""The chunked LM head equals the full-logits computation: values and gradients, every loss mode."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpolab.algo.kl import kl_k3
from grpolab.algo.losses import AGGREGATIONS, Aggregation, clipped_surrogate_loss
from grpolab.models import chunked_head as chunked_head_module
from grpolab.models.chunked_head import ChunkedLMHead, ChunkedLogprobs, install_chunked_head
from grpolab.models.inference import attention_for
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training import logprobs as logprobs_module
from grpolab.training.logprobs import build_inputs, completion_logprobs
from grpolab.training.spec import PolicyLossSpec
from grpolab.training.step import policy_loss
from grpolab.types import RolloutBatch

TEMPERATURE = 0.7


def _setup(seed=1):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed)
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 1, 1, 0, 1)]
    completion = torch.randint(4, 60, (6, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[1, 5:] = mask[3, 2:] = False
    return model, rows, completion, mask


def _reference_logprobs(model, rows, completion, mask, amp=None):
    """The unchunked computation as it was before the chunked head: one padded forward of the decoder,
    the full fp32 logits [n, t, V], log-softmax and entropy over them."""
    t = int(mask.sum(-1).max())
    ids = completion[:, :t]
    input_ids, attn, pos = build_inputs(rows, ids[:, :-1], pad_id=0)
    shape = {"rows": len(rows), "q_len": input_ids.shape[1], "kv_len": input_ids.shape[1]}
    with torch.autocast("cpu", dtype=amp, enabled=amp is not None), attention_for(model, input_ids.device, amp, **shape):
        hidden = model.model(input_ids=input_ids, attention_mask=attn, position_ids=pos).last_hidden_state[:, -t:]
    dtype = amp or torch.float32  # under autocast the head's GEMM is bf16, as every other matmul; then fp32
    logits = torch.nn.functional.linear(hidden.to(dtype), model.lm_head.weight.to(dtype)).float() / TEMPERATURE
    logz = torch.logsumexp(logits, -1)
    lp = logits.gather(-1, ids[..., None]).squeeze(-1) - logz
    entropy = (logz - (torch.softmax(logits, -1) * logits).sum(-1)).detach()
    pad = completion.shape[1] - t
    zero = torch.zeros_like(lp)
    return (
        torch.nn.functional.pad(torch.where(mask[:, :t], lp, zero), (0, pad)),
        torch.nn.functional.pad(torch.where(mask[:, :t], entropy, zero), (0, pad)),
    )


def _loss_and_grads(model, lp, rows, completion, mask, mode):
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2])[:, None].expand_as(mask) * mask
    ref = lp.detach() - 0.1 * torch.linspace(0, 1, lp.numel()).view_as(lp)  # a non-zero KL term
    batch = RolloutBatch(rows, completion, mask, mask, advantages, ref_logprobs=ref)
    surrogate = functools.partial(clipped_surrogate_loss, clip_low=0.2, clip_high=0.2, dual_clip=None, level="token")
    spec = PolicyLossSpec(surrogate, Aggregation.named(mode, norm_len=7), kl=kl_k3, beta=0.04)
    old = lp.detach() + 0.05 * torch.linspace(-1, 1, lp.numel()).view_as(lp)  # ratios != 1, some clipped
    loss, _ = policy_loss(lp, old, batch, spec, total_seqs=6.0, total_tokens=float(mask.sum()))
    model.zero_grad()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt", "row-by-row-prompt"])
def test_chunked_head_equals_full_logits_in_every_loss_mode(shared, monkeypatch):
    model, rows, completion, mask = _setup()
    if not shared:
        monkeypatch.setattr(logprobs_module._Forward, "can_share_prefix", lambda self: False)
    for mode in AGGREGATIONS:
        want_lp, want_ent = _reference_logprobs(model, rows, completion, mask)
        want_loss, want_grads = _loss_and_grads(model, want_lp, rows, completion, mask, mode)
        lp, ent = completion_logprobs(
            model, rows, completion, mask, pad_id=0, temperature=TEMPERATURE, with_entropy=True, chunk=4
        )
        assert isinstance(model.lm_head, ChunkedLMHead)
        torch.testing.assert_close(lp, want_lp, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ent, want_ent, atol=2e-5, rtol=1e-5)
        loss, grads = _loss_and_grads(model, lp, rows, completion, mask, mode)
        torch.testing.assert_close(loss, want_loss, atol=1e-6, rtol=1e-5)
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], atol=1e-6, rtol=1e-4, msg=f"{mode}: {name}")


def test_chunked_head_under_bf16_autocast_matches_the_fp32_head(monkeypatch):
    model, rows, completion, mask = _setup(seed=2)
    monkeypatch.setattr(logprobs_module._Forward, "can_share_prefix", lambda self: False)  # same bf16 body
    want, _ = _reference_logprobs(model, rows, completion, mask, amp=torch.bfloat16)
    got, _ = completion_logprobs(
        model, rows, completion, mask, pad_id=0, temperature=TEMPERATURE, autocast_dtype=torch.bfloat16, chunk=5
    )
    # same bf16 body and bf16 head GEMM, softmax in fp32 on both sides (only summation order differs)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_head_gemms_run_in_the_autocast_dtype_with_fp32_softmax_and_gradients():
    """Under bf16 autocast the logits and both gradient GEMMs take bf16 operands (what autocast's own
    linear does); log-softmax, entropy and the returned gradients' accumulation stay fp32."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 16, generator=g, requires_grad=True)
    weight = torch.randn(23, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 23, (9,), generator=g)
    head = ChunkedLMHead.sharing(torch.nn.Linear(16, 23, bias=False))
    head.weight = torch.nn.Parameter(weight.detach().clone())
    seen = []
    request = chunked_head_module.HeadRequest(targets[None], TEMPERATURE, chunk=4)
    with chunked_head_module.head_request(head, request), _recording_mm(seen):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = head(hidden[None])
        (out[..., 0].sum() + 0.3 * out[..., 1].sum()).backward()
    # 3 chunks: 3 logits GEMMs forward; 3 recomputed + 3 hidden-gradient + 3 weight-gradient backward
    assert out.dtype == torch.float32 and len(seen) == 12 and set(seen) == {torch.bfloat16}, seen
    # the reference: autocast's bf16 linear, fp32 log-softmax and entropy, plain autograd
    h2, w2 = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.nn.functional.linear(h2, w2)
    z = z.float() / TEMPERATURE
    logp = torch.log_softmax(z, -1)
    lp, ent = logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)
    (lp.sum() + 0.3 * ent.sum()).backward()
    torch.testing.assert_close(out[0, :, 0], lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0, :, 1], ent, atol=1e-5, rtol=1e-5)
    assert head.weight.grad.dtype == torch.float32
    torch.testing.assert_close(hidden.grad, h2.grad, atol=2e-2, rtol=2e-2)  # bf16 operands on both sides
    torch.testing.assert_close(head.weight.grad, w2.grad, atol=2e-2, rtol=2e-2)
    # and it is not the fp32 head: that one's log-probs differ by bf16 rounding of the logits
    fp32 = torch.log_softmax(torch.nn.functional.linear(hidden, weight) / TEMPERATURE, -1).gather(-1, targets[:, None])
    assert (fp32.squeeze(-1) - out[0, :, 0]).abs().max() > 1e-4


class _recording_mm(TorchDispatchMode):
    """Records the operand dtype of each matrix product (forward and backward)."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.out):
            self.seen.append(args[-1].dtype)
        return func(*args, **(kwargs or {}))


def test_chunks_are_sized_by_device():
    assert chunked_head_module.chunk_tokens(151_936) == 110  # 64 MiB of fp32 logits on a CPU
    assert chunked_head_module.chunk_tokens(151_936, "cuda") == 1766  # 1 GiB on CUDA
    assert chunked_head_module.chunk_tokens(10**9) == 16


def test_install_shares_the_tied_weight_and_keeps_keys_and_generation():
    model, rows, completion, mask = _setup(seed=3)
    keys = list(model.state_dict())
    ids = torch.tensor([rows[0]])
    before = model.generate(ids, max_new_tokens=5, do_sample=False)
    logits = model(ids).logits
    assert install_chunked_head(model)
    assert isinstance(model.lm_head, ChunkedLMHead)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(ids).logits, logits, rtol=0, atol=0)
    assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), before)


def test_chunked_logprobs_gradcheck_with_bias_and_uneven_chunks():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)

    def logprobs(h, w, b):
        return ChunkedLogprobs.apply(h, w, b, targets, 0.7, 3)[0]

    assert torch.autograd.gradcheck(logprobs, (hidden, weight, bias))
    full = torch.log_softmax((hidden @ weight.T + bias) / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs(hidden, weight, bias), full)


def test_entropy_gradient_through_the_chunked_head_equals_autograd_on_full_logits():
    """An entropy bonus (algo.entropy_coef) needs d H / d logits; the chunked backward gives it, alone and
    mixed with the log-prob gradient, and gradcheck agrees with finite differences."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    a, b = torch.randn(7, dtype=torch.float64, generator=g), torch.randn(7, dtype=torch.float64, generator=g)

    def mixed(h, w, bb):
        lp, ent = ChunkedLogprobs.apply(h, w, bb, targets, 0.7, 3)
        return (a * lp).sum() + (b * ent).sum()

    assert torch.autograd.gradcheck(mixed, (hidden, weight, bias))
    z = (hidden @ weight.T + bias) / 0.7
    logp = torch.log_softmax(z, -1)
    full = (a * logp.gather(-1, targets[:, None]).squeeze(-1)).sum() + (b * -(logp.exp() * logp).sum(-1)).sum()
    expected = torch.autograd.grad(full, (hidden, weight, bias))
    got = torch.autograd.grad(mixed(hidden, weight, bias), (hidden, weight, bias))
    for e, r in zip(expected, got, strict=True):
        torch.testing.assert_close(r, e)


def test_gradient_checkpointing_gives_the_same_gradients_through_the_chunked_head():
    model, rows, completion, mask = _setup(seed=4)
    model.train()

    def grads():
        lp, _ = completion_logprobs(model, rows, completion, mask, pad_id=0, chunk=4)
        model.zero_grad()
        (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    lp, want = grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lp_ckpt, got = grads()
    torch.testing.assert_close(lp_ckpt, lp, atol=2e-5, rtol=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_models_that_post_process_logits_take_the_plain_path():
    model, rows, completion, mask = _setup(seed=5)
    model.config.logit_scale = 1.0  # the key alone routes to the plain path; Qwen2 applies no scale
    want, _ = _reference_logprobs(model, rows, completion, mask)
    got, _ = completion_logprobs(model, rows, completion, mask, pad_id=0, temperature=TEMPERATURE)
    assert not isinstance(model.lm_head, ChunkedLMHead)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("entropy_weight", [0.0, 0.3], ids=["logprob-only", "with-entropy-grad"])
def test_weight_gradient_added_into_an_existing_grad_equals_autograd_accumulation(entropy_weight):
    """into_grad (a training step's micro-batches after the first): the head adds its weight gradient
    straight into weight.grad and returns none to autograd; the sum is autograd's, to float tolerance."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(13, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(13, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 13, (9,), generator=g)
    a, b = torch.randn(9, dtype=torch.float64, generator=g), entropy_weight * torch.randn(9, dtype=torch.float64, generator=g)

    def loss(into_grad):
        lp, ent = ChunkedLogprobs.apply(hidden, weight, bias, targets, 0.7, 4, into_grad)
        return (a * lp).sum() + (b * ent).sum()

    want = torch.autograd.grad(loss(False), (hidden, weight, bias))
    earlier = torch.randn(13, 5, dtype=torch.float64, generator=g)  # an earlier micro-batch's gradient
    weight.grad = earlier.clone()
    held = weight.grad
    loss(True).backward()
    assert weight.grad is held  # added in place, not replaced
    torch.testing.assert_close(weight.grad, earlier + want[1])
    torch.testing.assert_close(hidden.grad, want[0])
    torch.testing.assert_close(bias.grad, want[2])
    weight.grad = hidden.grad = bias.grad = None  # no gradient yet: returned to autograd as usual
    loss(True).backward()
    torch.testing.assert_close(weight.grad, want[1])


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt", "row-by-row-prompt"])
def test_micro_batches_with_into_grad_accumulate_the_one_forward_gradient(shared, monkeypatch):
    """Two micro-batches of a tied-embedding model through completion_logprobs(into_grad=True): the
    second adds its head gradient into .grad; the total equals one forward over all rows."""
    model, rows, completion, mask = _setup(seed=6)
    if not shared:
        monkeypatch.setattr(logprobs_module._Forward, "can_share_prefix", lambda self: False)
    weights = torch.linspace(-1, 1, completion.numel()).view_as(completion)

    def backward(idx, into_grad):
        lp, _ = completion_logprobs(
            model, [rows[i] for i in idx], completion[idx], mask[idx], pad_id=0, temperature=TEMPERATURE,
            chunk=4, into_grad=into_grad,
        )
        (lp * weights[idx]).sum().backward()

    model.zero_grad()
    backward(list(range(6)), into_grad=False)
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    added = []
    real = chunked_head_module._accumulating_grad
    monkeypatch.setattr(chunked_head_module, "_accumulating_grad", lambda *a: added.append(real(*a)) or added[-1])
    backward([0, 1, 2], into_grad=True)
    backward([3, 4, 5], into_grad=True)
    assert added[0] is None and added[-1] is model.lm_head.weight.grad  # the second micro-batch added in place
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], atol=1e-6, rtol=1e-4, msg=name)


def test_fp32_entropy_at_logit_std_10_matches_float64():
    """H = -sum p log p on the log-probs: at logit std 10, lz - sum p z cancels to ~1e-4 nats off in fp32
    (measured 1.0e-4 on these inputs); the chunked head's fp32 entropy stays within 2e-5 of float64."""
    g = torch.Generator().manual_seed(0)
    m, h, v = 256, 64, 4096
    hidden = torch.randn(m, h, generator=g)
    weight = torch.randn(v, h, generator=g) * (10 / h**0.5)  # logits of std 10
    targets = torch.randint(0, v, (m,), generator=g)
    _, entropy = ChunkedLogprobs.apply(hidden, weight, None, targets, 1.0, 64)
    z = hidden.double() @ weight.double().T
    assert 9 < float(z.std()) < 11
    reference = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    assert entropy.dtype == torch.float32
    assert float((entropy.double() - reference).abs().max()) < 2e-5
    z32 = hidden @ weight.T
    lz = torch.logsumexp(z32, -1)
    cancelled = lz - torch.linalg.vecdot((z32 - lz[:, None]).exp(), z32)  # the formula this replaced
    assert float((cancelled.double() - reference).abs().max()) > 5e-5  # so the test tells the two apart


def test_a_request_without_entropies_gives_the_same_log_probs_and_no_entropy_gradient():
    """HeadRequest.entropy=False (reference and old-policy forwards, which discard the entropies): the same
    log-probs and gradients, zeros for the entropies, and a gradient sent to them is refused."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(40, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (40,), generator=g)
    with_h = ChunkedLogprobs.apply(hidden, weight, None, targets, 0.7, 16)
    without = ChunkedLogprobs.apply(hidden, weight, None, targets, 0.7, 16, False, None, False)
    assert torch.equal(with_h[0], without[0]) and with_h[1].abs().min() > 0 and not without[1].any()
    grads = [torch.autograd.grad(out[0].sum(), (hidden, weight), retain_graph=True) for out in (with_h, without)]
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="did not compute them"):
        without[1].sum().add(without[0].sum()).backward()


def test_reference_log_probs_skip_the_entropies(monkeypatch):
    """completion_logprobs asks the head for entropies only when they are returned (with_entropy)."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, seed=0)
    asked = []
    original = ChunkedLogprobs.apply

    def spy(*args):
        asked.append(args[8] if len(args) > 8 else True)
        return original(*args)

    monkeypatch.setattr(ChunkedLogprobs, "apply", spy)
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool)
    with torch.no_grad():
        plain, none = completion_logprobs(model, [[3, 4]], ids, mask, pad_id=0)
        both, entropy = completion_logprobs(model, [[3, 4]], ids, mask, pad_id=0, with_entropy=True)
    assert asked == [False, True] and none is None and entropy.abs().min() > 0
    assert torch.equal(plain, both)


@pytest.mark.parametrize("gemm", [torch.bfloat16, None], ids=["bf16-gemm", "fp32"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_a_cpu_call_reuses_one_set_of_chunk_buffers_with_the_same_results(monkeypatch, gemm, bias):
    """Every chunk of a forward (and of a backward) writes its logits into the same [chunk, V] buffers, made once
    per call, instead of fresh ones the allocator hands back to the kernel: the same log-probs, entropies and
    gradients as fresh tensors per chunk (the path without buffers, as on CUDA)."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(11, 16, generator=g)
    weight = torch.randn(23, 16, generator=g)
    b = torch.randn(23, generator=g) if bias else None
    targets = torch.randint(0, 23, (11,), generator=g)
    made = []
    real = chunked_head_module._ChunkBuffers.__init__

    def counted(self, rows, w):
        made.append((rows, w.dtype))
        real(self, rows, w)

    def run(buffered: bool):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        bb = None if b is None else b.clone().requires_grad_(True)
        with monkeypatch.context() as m:
            m.setattr(chunked_head_module._ChunkBuffers, "__init__", counted)
            if not buffered:
                m.setattr(chunked_head_module._ChunkBuffers, "of", staticmethod(lambda rows, w: None))
            lp, ent = ChunkedLogprobs.apply(h, w, bb, targets, TEMPERATURE, 4, False, gemm, True)
            (lp * torch.linspace(0.5, 1.5, 11)).sum().add(0.3 * ent.sum()).backward()
        return [lp, ent, h.grad, w.grad] + ([] if bb is None else [bb.grad])

    fresh = run(buffered=False)
    assert made == []
    reused = run(buffered=True)
    assert made == [(4, gemm or torch.float32)] * 2  # 3 chunks: one set for the forward, one for the backward
    for x, y in zip(reused, fresh, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)
