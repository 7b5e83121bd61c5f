"""module_utils/quality_checks.py: the quality gate's requests and judgements, without a server."""

from __future__ import annotations

import json

import pytest
from quality_checks import canary_problem, needle, needle_number, needle_problem, stream_problem


def chat(content: str | None, reasoning: str | None = None) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content, "reasoning": reasoning}}]}


def sse(*chunks: object, done: bool = True) -> str:
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return "".join(events) + ("data: [DONE]\n\n" if done else "")


TOKEN = {"choices": [{"index": 0, "delta": {"content": "Paris"}, "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}


def test_a_needle_sits_at_its_fraction_and_each_has_its_own_number():
    early, late = needle(1000, 0.1, 44), needle(1000, 0.9, 44)
    assert early.number != late.number and needle_number(1000, 0.1) == early.number
    assert early.prompt.index(early.number) < len(early.prompt) * 0.2
    assert late.prompt.index(late.number) > len(late.prompt) * 0.8
    assert early.prompt.endswith("Answer with the number only.")
    with pytest.raises(ValueError, match="between 0 and 1"):
        needle(1000, 1.5, 44)


def test_a_needle_passes_only_with_its_number():
    item = needle(500, 0.5, 44)
    assert needle_problem(chat(f"It is {item.number}."), item) is None
    assert f"the number {item.number} is not in the answer: 'I do not know.'" == needle_problem(
        chat("I do not know."), item
    )


@pytest.mark.parametrize(
    ("answer", "expected", "reasoning_parser", "problem"),
    [
        (chat("The capital of France is Paris."), "The capital of France is Paris.", False, None),
        (chat(" Paris \n"), "Paris", False, None),
        (chat("Lyon"), "Paris", False, "expected 'Paris', got 'Lyon'"),
        (chat(None), None, False, "no text in content or reasoning"),
        (chat("<think>hm</think>Paris"), None, True, "a <think> block in content"),
        (chat(None, reasoning="thinking..."), None, True, None),
    ],
)
def test_canaries_check_the_shape_and_the_exact_answer(answer, expected, reasoning_parser, problem):
    found = canary_problem(answer, expected, reasoning_parser)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (sse(TOKEN, LAST, USAGE), None),
        (sse(TOKEN, done=False), "the stream ends without data: [DONE] (cut short?)"),
        (sse(TOKEN, USAGE), "no choice ended with a finish reason"),
        (sse(TOKEN, LAST), "no usage chunk"),
        (sse(LAST, USAGE), "the stream carried no text"),
        ("data: {not json\n\ndata: [DONE]\n\n", "an event that is not JSON"),
        (sse({"error": {"message": "boom"}}), "an error in the stream"),
        ("", "no server-sent event"),
    ],
)
def test_a_stream_must_be_complete_and_well_formed(body, problem):
    found = stream_problem(body)
    assert (found is None) if problem is None else (problem in found), found
