"""module_utils/quality_checks.py: the quality gate's requests and judgements, without a server."""

from __future__ import annotations

import json

import pytest
from quality_checks import (
    TOOL_NAME,
    CanaryRecord,
    answer_text,
    canary_problem,
    held_answers,
    needle,
    needle_depth,
    needle_number,
    needle_problem,
    recipe_traits,
    stream_problem,
    tool_call_problem,
)


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


def test_the_needles_stay_within_a_quarter_of_the_context():
    assert needle_depth(16384, 131072) == 16384
    assert needle_depth(16384, 8192) == 2048
    assert needle_depth(16384, 0) == 16384
    assert needle_depth(0, 8192) == 0


def test_a_thinking_model_that_never_answered_is_compared_by_its_reasoning():
    assert answer_text(chat("  Paris. ")) == "Paris."
    assert answer_text(chat(None, "Let me think")) == "Let me think"
    assert canary_problem(chat(None, "Let me think"), "Let me think", True) is None
    assert "expected 'Paris.', got 'Let me think'" in canary_problem(chat(None, "Let me think"), "Paris.", True)


def tool_answer(name: str, arguments: str) -> dict:
    call = {"id": "call-1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}


def test_the_tool_canary_needs_a_call_to_the_tool_with_json_object_arguments():
    assert tool_call_problem(tool_answer(TOOL_NAME, '{"city": "Paris"}')) is None
    assert "no tool call" in tool_call_problem(chat('<tool_call>{"name": "get_weather"}</tool_call>'))
    assert "names 'lookup', not 'get_weather'" in tool_call_problem(tool_answer("lookup", "{}"))
    assert "not JSON: '{city: Paris'" in tool_call_problem(tool_answer(TOOL_NAME, "{city: Paris"))
    assert "not a JSON object: ['Paris']" in tool_call_problem(tool_answer(TOOL_NAME, '["Paris"]'))


def test_recorded_answers_hold_only_for_the_model_they_were_recorded_for():
    model = {"hf_repo": "org/model", "hf_revision": "a" * 40, "max_tokens": 64}
    text = CanaryRecord(model, {"Capital?": "Paris."}).to_json()
    assert held_answers(text, model) == {"Capital?": "Paris."}
    assert held_answers(text, {**model, "hf_revision": "b" * 40}) == {}
    assert held_answers(text, {**model, "max_tokens": 1024}) == {}
    assert held_answers(None, model) == {} and held_answers("{not json", model) == {}
    assert held_answers('["a list"]', model) == {}


def test_a_recipe_says_whether_reasoning_and_tool_calls_are_parsed():
    assert recipe_traits({"max_model_len": 131072, "serve_flags": {"reasoning-parser": "qwen3"}}) == {
        "reasoning_parser": True,
        "tool_parser": False,
        "max_model_len": 131072,
    }
    # vLLM parses tool calls only with automatic tool choice on.
    both = {"tool-call-parser": "openai", "enable-auto-tool-choice": True}
    assert recipe_traits({"serve_flags": both})["tool_parser"] is True
    assert recipe_traits({"serve_flags": {"tool-call-parser": "openai"}})["tool_parser"] is False
    assert recipe_traits({}) == {"reasoning_parser": False, "tool_parser": False, "max_model_len": 0}
