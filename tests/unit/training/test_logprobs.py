import torch

from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import build_inputs, completion_logprobs


def _setup():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=1).eval()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    completion = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    return tok, model, prompts, completion, mask


def _reference(model, prompt, completion, temperature):
    """Unpadded forward of one row: log softmax(logits / T) at each completion token."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + t, tok_] for t, tok_ in enumerate(completion)])


def test_build_inputs_left_pads_prompts_and_keeps_positions():
    ids, attn, pos = build_inputs([[9, 8, 7], [5]], torch.tensor([[1, 2], [3, 4]]), pad_id=0)
    assert ids.tolist() == [[9, 8, 7, 1, 2], [0, 0, 5, 3, 4]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]


def test_logprobs_match_unpadded_forward_at_temperature():
    tok, model, prompts, completion, mask = _setup()
    with torch.no_grad():
        lp, ent = completion_logprobs(
            model, prompts, completion, mask, pad_id=0, temperature=0.7, with_entropy=True
        )
        for i in range(2):
            n = int(mask[i].sum())
            want = _reference(model, prompts[i], completion[i, :n].tolist(), 0.7)
            torch.testing.assert_close(lp[i, :n], want, atol=1e-5, rtol=1e-5)
    assert lp.shape == (2, 4)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert (ent[mask] > 0).all()


def test_bf16_autocast_with_fp32_head_stays_close_to_fp32():
    tok, model, prompts, completion, mask = _setup()
    with torch.no_grad():
        fp32, _ = completion_logprobs(model, prompts, completion, mask, pad_id=0)
        bf16, _ = completion_logprobs(
            model, prompts, completion, mask, pad_id=0, autocast_dtype=torch.bfloat16
        )
    # bf16 body, fp32 head: log-probs within 0.05 nats of fp32 on this model
    assert (fp32 - bf16).abs().max() < 0.05
    assert not torch.equal(fp32, bf16)  # the autocast path really ran in bf16


def test_gradients_flow_to_the_model():
    tok, model, prompts, completion, mask = _setup()
    lp, _ = completion_logprobs(model, prompts, completion, mask, pad_id=0)
    lp.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0
