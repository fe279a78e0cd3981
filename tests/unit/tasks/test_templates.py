import pytest

from grpolab.config.templates import R1_TEMPLATE, TEMPLATES, apply_template, resolve_template


def test_r1_template_is_table_1():
    assert R1_TEMPLATE.startswith("A conversation between User and Assistant. The user asks a question")
    assert "i.e., <think> reasoning process here </think> <answer> answer here </answer>." in R1_TEMPLATE
    assert R1_TEMPLATE.endswith("User: {prompt}. Assistant:")
    assert TEMPLATES["r1_think"] == R1_TEMPLATE + " <think>"
    assert TEMPLATES["none"] == "{prompt}"


@pytest.mark.parametrize(
    ("template", "expected_end"),
    [
        ("r1", "User: What is \\frac{1}{2}?. Assistant:"),
        ("r1_think", "Assistant: <think>"),
        ("none", "\\frac{1}{2}?"),
    ],
)
def test_apply_named_template(template, expected_end):
    # LaTeX braces in the question must survive (no str.format); Table 1 is kept verbatim, "?." included.
    assert apply_template(template, "  What is \\frac{1}{2}?\n", None).endswith(expected_end)


def test_apply_text_template_and_system_prompt():
    assert apply_template("Q: {prompt}\nA:", "1+1", None) == "Q: 1+1\nA:"
    assert apply_template("none", "1+1", "Be brief.\n") == "Be brief.\n1+1"


@pytest.mark.parametrize("bad", ["no placeholder", "{prompt} twice {prompt}", "r2"])
def test_bad_template(bad):
    with pytest.raises(ValueError, match="exactly one '\\{prompt\\}' placeholder"):
        resolve_template(bad)
