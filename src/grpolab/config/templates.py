"""Plain-text prompt templates, with a ``{prompt}`` placeholder for the question.

Tokenizer chat templates are applied elsewhere; these are for base models (R1-Zero style).
"""

from __future__ import annotations

# DeepSeek-R1 (arXiv 2501.12948), Table 1, verbatim.
R1_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. User: {prompt}. Assistant:"
)

TEMPLATES: dict[str, str] = {
    "none": "{prompt}",
    "r1": R1_TEMPLATE,
    # The completion starts inside the think block: pair with r1_format(prefilled_think=True).
    "r1_think": R1_TEMPLATE + " <think>",
}


def resolve_template(template: str) -> str:
    """A ``TEMPLATES`` key, or template text with exactly one ``{prompt}``."""
    text = TEMPLATES.get(template, template)
    if text.count("{prompt}") != 1:
        raise ValueError(
            f"template {template[:60]!r} is neither one of {', '.join(TEMPLATES)} nor a text with exactly "
            "one '{prompt}' placeholder; add '{prompt}' where the question goes"
        )
    return text


def apply_template(template: str, question: str, system_prompt: str | None = None) -> str:
    """Put ``question`` (stripped) in place of ``{prompt}``; a system prompt goes first, on its own line.

    ``str.replace``, not ``str.format``: questions hold LaTeX braces.
    """
    text = resolve_template(template).replace("{prompt}", question.strip())
    if system_prompt:
        text = system_prompt.rstrip() + "\n" + text
    return text
