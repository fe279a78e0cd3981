"""TRL's conversational format: a prompt given as chat messages is rendered with the tokenizer's chat template."""

import json

import pytest

from grpolab.config import DataConfig
from grpolab.data import DataError, load_examples, tokenize_prompts
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]


def _jsonl(tmp_path, rows):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _chat_tokenizer():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_message_prompts_are_rendered_with_the_chat_template(tmp_path):
    rows = [{"prompt": CHAT, "answer": 2}, {"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4}]
    cfg = DataConfig(path=_jsonl(tmp_path, rows), system_prompt="Think.")
    first, second = load_examples(cfg, seed=0)
    assert first.messages == tuple(CHAT)  # it had a system turn: data.system_prompt is not added
    assert second.messages == ({"role": "system", "content": "Think."}, {"role": "user", "content": "2+2?"})
    assert first.prompt == "system: Be brief.\nuser: 1+1?" and first.meta["question"] == "1+1?"
    tok = _chat_tokenizer()
    ids = tokenize_prompts([first, second], tok, cfg)
    assert tok.decode(ids[0]) == "<bos><system>Be brief. <user>1+1? <assistant>"  # one BOS: the template's
    assert tok.decode(ids[1]) == "<bos><system>Think. <user>2+2? <assistant>"


def test_text_and_message_prompts_mix(tmp_path):
    rows = [{"prompt": CHAT, "answer": 2}, {"prompt": "3+3=", "answer": 6}]
    cfg = DataConfig(path=_jsonl(tmp_path, rows))
    chat, text = load_examples(cfg, seed=0)
    assert text.messages is None
    tok = _chat_tokenizer()
    ids = tokenize_prompts([chat, text], tok, cfg)
    assert tok.decode(ids[1]) == "3+3=" and tok.decode(ids[0]).endswith("<assistant>")


@pytest.mark.parametrize(
    ("prompt", "cfg_kwargs", "message"),
    [
        ([{"content": "hi"}], {}, "row 1: 'prompt'[0] is {'content': 'hi'}; a conversational prompt is a list"),
        ([], {}, "row 1: 'prompt' is an empty list of messages"),
        (CHAT, {"template": "r1"}, "data.template='r1' applies to text prompts only: set data.template=none"),
    ],
)
def test_bad_message_rows_name_the_row(tmp_path, prompt, cfg_kwargs, message):
    cfg = DataConfig(path=_jsonl(tmp_path, [{"prompt": prompt, "answer": 1}]), **cfg_kwargs)
    with pytest.raises(DataError) as err:
        load_examples(cfg, seed=0)
    assert message in str(err.value)


def test_a_tokenizer_without_chat_template_is_an_error(tmp_path):
    cfg = DataConfig(path=_jsonl(tmp_path, [{"prompt": CHAT, "answer": 1}]))
    with pytest.raises(DataError, match="prompts are chat messages, but the tokenizer has no chat template"):
        tokenize_prompts(load_examples(cfg, seed=0), build_char_tokenizer(), cfg)


def test_chat_template_kwargs_reach_the_template(tmp_path):
    """data.chat_template_kwargs (TRL's chat_template_kwargs) are the template's variables, e.g. Qwen3's enable_thinking."""
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4}]
    tok = _chat_tokenizer()
    tok.chat_template = CHAT_TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
    plain = DataConfig(path=_jsonl(tmp_path, rows))
    off = DataConfig(path=plain.path, chat_template_kwargs={"enable_thinking": False})
    assert tok.decode(tokenize_prompts(load_examples(plain, seed=0), tok, plain)[0]) == "<bos><user>2+2? <assistant>"
    assert tok.decode(tokenize_prompts(load_examples(off, seed=0), tok, off)[0]) == "<bos><user>2+2? <assistant><nothink>"
