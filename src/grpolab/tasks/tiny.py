"""A character tokenizer and a tiny causal LM, built in code (no network, no downloads).

They are real transformers objects: the tokenizer is a ``PreTrainedTokenizerFast`` and the model an
``AutoModelForCausalLM`` built from a ``Qwen2Config``, so everything downstream (saving, loading by
path, generation, LoRA) goes through the same code a real model does.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
DEFAULT_CHARS = string.digits + "+-*/=()<>., ?:" + string.ascii_letters
CHAT_TEMPLATE = (  # a chat template the character vocabulary can spell, for conversational data in tests
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_char_tokenizer(chars: str = DEFAULT_CHARS) -> PreTrainedTokenizerFast:
    """One token per character, plus pad / bos / eos / unk; decoding joins characters back."""
    specials = [PAD, BOS, EOS, UNK]
    unique = list(dict.fromkeys(chars))
    vocab = {tok: i for i, tok in enumerate(specials + unique)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 256,
    seed: int = 0,
) -> PreTrainedModel:
    """A Qwen2-architecture causal LM with random weights, sized for a CPU."""
    import torch

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny(path, *, seed: int = 0, **model_kwargs) -> str:
    """Build the tokenizer and model and save both to ``path``; returns the path as a string."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=seed, **model_kwargs)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
