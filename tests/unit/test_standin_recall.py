"""The stand-in vLLM's recall (tests/standins/vllm/vllm_standin/recall.py): a question whose fact stands in the
prompt is answered with it, and VLLM_STANDIN_FAULT_CONTEXT_WORDS loses a fact placed before the last N words."""

from __future__ import annotations

import sys

from helpers import ROOT
from quality_checks import needle

sys.path.insert(0, str(ROOT / "tests" / "standins" / "vllm"))
from vllm_standin.recall import recalled_answer


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def test_the_quality_gates_needle_is_recalled_wherever_it_sits():
    for fraction in (0.1, 0.5, 0.9):
        item = needle(1000, fraction, 40)
        assert recalled_answer(words(item.prompt)) == (item.number, ".")


def test_a_question_without_its_fact_gets_no_recalled_answer():
    assert recalled_answer(words("What is the capital of France? Answer in one word.")) == ()
    assert recalled_answer(words("Say hello in one short sentence.")) == ()


def test_a_fact_before_the_last_words_read_is_lost():
    early = needle(1000, 0.1, 40)
    late = needle(1000, 0.9, 40)
    assert recalled_answer(words(early.prompt), context_words=300) == ()
    assert recalled_answer(words(late.prompt), context_words=300) == (late.number, ".")
