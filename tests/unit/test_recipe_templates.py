"""A recipe's --chat-template written on one line (a unit's command line holds no line break) must give the prompt
of the template file it stands for. The qwen3-reranker-0.6b recipe carries vLLM's qwen3_reranker.jinja that way
(tests/fixtures/recorded/vllm-templates/); both are rendered as transformers compiles a chat template for vLLM
(transformers.utils.chat_template_utils._compile_jinja_template: an ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, no trailing newline kept)."""

from __future__ import annotations

import pytest
from helpers import ROOT
from jinja2.sandbox import ImmutableSandboxedEnvironment
from recipe_rules import load_recipe

RECORDED = ROOT / "tests" / "fixtures" / "recorded" / "vllm-templates"
QUERY = {"role": "query", "content": "Where does the cat sit?"}
DOCUMENT = {"role": "document", "content": "The cat sits on the mat."}


def render(template: str, **context: object) -> str:
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(**context)


@pytest.mark.parametrize(
    "context",
    [
        {"messages": [QUERY, DOCUMENT]},
        {"messages": [{"role": "system", "content": "Find the answer."}, QUERY, DOCUMENT]},
        {"messages": [QUERY, DOCUMENT], "instruction": "Rank support articles."},
    ],
    ids=["default instruct", "system message", "instruction"],
)
def test_the_rerankers_one_line_template_gives_vllms_prompt(context):
    one_line = load_recipe("qwen3-reranker-0.6b", ROOT / "recipes")["serve_flags"]["chat-template"]
    assert "\n" not in one_line
    original = (RECORDED / "qwen3_reranker.jinja").read_text(encoding="utf-8")
    prompt = render(original, **context)
    assert render(one_line, **context) == prompt
    assert "<Query>: Where does the cat sit?\n<Document>: The cat sits on the mat.<|im_end|>" in prompt
