"""A tiny llama GGUF file written with the ``gguf`` package, as llama.cpp's converter writes one.

Its tensor names, the query / key rows permuted for llama.cpp's rotary layout, the byte-level BPE
tokenizer (``tokenizer.ggml.model = gpt2``) with its tokens, merges, token types, special ids and chat
template as metadata. Used by tests/unit/models/test_sources.py and tests/integration/test_recipe.py.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["1 2", "3 4", "Ġ +"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokens() -> list[str]:
    alphabet = list(bytes_to_unicode().values())
    return SPECIALS + alphabet + [m.replace(" ", "") for m in MERGES]


def _llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf permutation of q / k rows (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, *, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer llama with tied embeddings, its weights in F32, as a GGUF file; returns the model."""
    tokens = _tokens()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a swapped tensor would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3 = control
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _gguf_tensors(model).items():
        writer.add_tensor(name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    sd, heads, kv = model.state_dict(), model.config.num_attention_heads, model.config.num_key_value_heads
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    names = {
        "input_layernorm": "attn_norm", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    for i in range(model.config.num_hidden_layers):
        pre = f"model.layers.{i}."
        for hf, gg in names.items():
            out[f"blk.{i}.{gg}.weight"] = sd[f"{pre}{hf}.weight"]
        out[f"blk.{i}.attn_q.weight"] = _llama_permute(sd[f"{pre}self_attn.q_proj.weight"], heads)
        out[f"blk.{i}.attn_k.weight"] = _llama_permute(sd[f"{pre}self_attn.k_proj.weight"], kv)
    return out
