"""Rows that used to be read silently wrong, and the character bound checked before any tokenising."""

from __future__ import annotations

import json

import pytest

from grpolab.config import DataConfig
from grpolab.data import DataError, check_prompt_chars, load_examples, prompt_char_limit, tokenize_prompts
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer
from grpolab.types import Example


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "d.jsonl"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _rows(tmp_path, rows) -> str:
    return _write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "1+1=", "answer": "2", "prompt": "9+9="}\n', "d.jsonl:1: key 'prompt' is given twice"),
        ('{"prompt": "1+1=", "answer": {"a": 1, "a": 2}}\n', "d.jsonl:1: key 'a' is given twice"),
        ('{"prompt": "x\\ud800y", "answer": "2"}\n', "field 'prompt' (data.prompt_field) holds a lone surrogate "
         "('\\ud800' at character 2)"),
        ('{"prompt": "1+1=", "answer": "\\udfff"}\n', "field 'answer' (data.answer_field) holds a lone surrogate"),
        ('{"prompt": [{"role": "user", "content": null}], "answer": "2"}\n', "'prompt'[0] has content null"),
        ('{"prompt": [{"role": "robot", "content": "hi"}], "answer": "2"}\n',
         "'prompt'[0] has role 'robot'; a chat message's role is one of system, user, assistant, tool"),
        ('{"prompt": [{"role": "user", "content": [{"type": "image", "url": "x"}]}], "answer": "2"}\n',
         "has a content part {'type': 'image', 'url': 'x'}; only text parts are supported"),
        ('{"prompt": [{"role": "user", "content": "\\ud83d"}], "answer": "2"}\n', "'prompt'[0] holds a lone surrogate"),
    ],
)
def test_rows_read_wrong_before_are_errors_naming_the_row(tmp_path, text, message):
    cfg = DataConfig(path=_write(tmp_path, text), template="none")
    with pytest.raises(DataError, match=None) as err:
        load_examples(cfg, seed=0)
    assert message in str(err.value)


def test_content_as_text_parts_is_joined_as_chat_templates_render_it(tmp_path):
    parts = [{"type": "text", "text": "1+"}, {"type": "text", "text": "1?"}]
    cfg = DataConfig(path=_rows(tmp_path, [{"prompt": [{"role": "user", "content": parts}], "answer": "2"}]),
                     template="none")
    (example,) = load_examples(cfg, seed=0)
    assert example.messages == ({"role": "user", "content": "1+1?"},)
    assert example.meta["question"] == "1+1?" and "[{" not in example.prompt  # not the list's repr
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    assert tok.decode(tokenize_prompts([example], tok, cfg)[0]) == "<bos><user>1+1? <assistant>"


def test_the_character_bound_leaves_prompts_that_may_fit_to_the_token_check():
    """n characters need at least n / K tokens, K the longest vocabulary entry in UTF-8 bytes (4 K with a
    composing normaliser): texts of every kind tokenise to at least that many; under the bound the exact
    token check decides."""
    import random

    tok = build_char_tokenizer()
    longest = max(len(t.encode()) for t in tok.get_vocab())
    rng = random.Random(0)
    alphabet = "0123456789+-*/= ()abc<pad>\n\u00e9\u4e2d"
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        assert len(tok(text, add_special_tokens=False)["input_ids"]) >= len(text) / longest
    assert prompt_char_limit(tok, 7) == 4 * longest * 7
    text = "1+2=" * 40  # 160 characters of one-character tokens
    assert len(tok(text, add_special_tokens=False)["input_ids"]) == 160
    cfg = DataConfig(max_prompt_length=160 // (4 * longest) + 1)
    check_prompt_chars([Example(prompt=text)], tok, cfg)  # 160 <= 4 K L: the exact check decides
    with pytest.raises(DataError, match="over data.max_prompt_length"):
        tokenize_prompts([Example(prompt=text)], tok, cfg)


def test_a_prompt_too_long_in_characters_is_refused_without_tokenising():
    tok = build_char_tokenizer()
    calls = []
    real = type(tok).__call__

    def counting(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    cfg = DataConfig(max_prompt_length=8)
    huge = Example(prompt="7" * (prompt_char_limit(tok, 8) + 1))
    try:
        type(tok).__call__ = counting
        with pytest.raises(DataError, match=r"example 1 has a prompt of \d+ characters: no tokenizer output"):
            tokenize_prompts([Example(prompt="1+1="), huge], tok, cfg)
    finally:
        type(tok).__call__ = real
    assert calls == []
