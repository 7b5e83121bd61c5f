"""What the pretend model answers when a question's answer stands in its prompt.

The stand-in computes nothing, but a model that reads its context answers "What is the X?" with the Y of a
sentence "The X is Y." placed anywhere before the question. That is all the quality gate's needles ask
(module_utils/quality_checks.py), and what a real model does at the depths it holds. Any other prompt gets the
stand-in's usual sentence (engine.ANSWER_WORDS).

VLLM_STANDIN_FAULT_CONTEXT_WORDS (config.Faults.context_words) makes it read only the last N words: a fact placed
earlier is lost, as in a model that drops the start of a long context.
"""

from __future__ import annotations

import re

QUESTION = re.compile(r"What is the ([\w' -]+?)\?")


def recalled_answer(prompt_words: tuple[str, ...], context_words: int = 0) -> tuple[str, ...]:
    """The answer's words (the fact, then a full stop) when the prompt's last question has its fact in the words
    read; () when it has none."""
    text = " ".join(prompt_words)
    questions = QUESTION.findall(text)
    if not questions:
        return ()
    read = prompt_words[-context_words:] if context_words > 0 else prompt_words
    fact = re.search(rf"\bThe {re.escape(questions[-1])} is ([^\s.]+)", " ".join(read))
    return (fact.group(1), ".") if fact else ()
