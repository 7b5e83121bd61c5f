"""The quality gate's checks, without the network: what each request asks and whether its answer passes.

A served model can be up and wrong: a stale image that answers garbage behind a green /health, a bug that shows
from the 5th request on, a long prompt that loses its middle. library/vllm_quality_gate.py sends these requests to
an endpoint after its warm-up; this module builds them and judges the answers, so that the rules can be read and
tested alone:

- canaries: greedy (temperature 0) prompts whose exact answer is known for this model (recorded at its first good
  start when none was given), and the answer's shape: text in `content`, reasoning in `reasoning` (never a
  `<think>` block left in `content` by a missing or wrong reasoning parser);
- needles: one fact placed at a fraction of a prompt of a given depth (real sentences around it, not random
  tokens), and a question at the end whose answer is the fact's number; the depth stays well inside the model's
  context (needle_depth);
- tools: a model served with a tool parser must answer a request that needs a tool with a tool call whose
  arguments are a JSON object (tool_call_problem);
- soak: streamed requests whose every server-sent event must be JSON, end with `data: [DONE]`, carry one finish
  reason per choice and a usage chunk.

Each failure is one line naming the check, the request and what came back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Real prose, repeated to the depth asked: a needle must be found in text, not in noise that makes it stand out.
FILLER = (
    "The harbour town wakes early. Fishing boats leave before dawn and return at noon with the day's catch. "
    "Market stalls open along the quay, selling bread, cheese and fresh fruit to the people who live there. "
)
NEEDLE = "The secret number of the harbour master is {number}. "
NEEDLE_QUESTION = "What is the secret number of the harbour master? Answer with the number only."
# How long a shown answer may be in a failure message.
SHOWN_CHARS = 200
# The needles' depth is at most this share of the model's max_model_len: "well inside" the context it serves, so
# that the gate proves recall without the gate itself filling the KV cache (a 128K prefill can take a Spark down).
NEEDLE_CONTEXT_SHARE = 4
# The tool canary: one function, one required argument, a question only the tool can answer.
TOOL_NAME = "get_weather"
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True)
class Needle:
    """One needle request: the fact's number, where it sits and the prompt that hides it."""

    depth_tokens: int
    fraction: float
    number: str
    prompt: str


def shown(text: object) -> str:
    """An answer as a failure message shows it: repr, cut to SHOWN_CHARS."""
    text = repr(text)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...'"


def needle_number(depth_tokens: int, fraction: float) -> str:
    """A five-digit number of its own for each needle, so that one needle's answer never passes another."""
    return str(10000 + (depth_tokens * 7919 + round(fraction * 1000) * 104729) % 90000)


def recipe_traits(recipe: dict) -> dict:
    """What the checks need from a resolved recipe: whether reasoning is split out (a reasoning parser), whether
    tool calls are parsed (a tool parser with automatic tool choice, as vLLM needs both), and the context."""
    flags = recipe.get("serve_flags") or {}
    return {
        "reasoning_parser": bool(flags.get("reasoning-parser")),
        "tool_parser": bool(flags.get("tool-call-parser")) and bool(flags.get("enable-auto-tool-choice")),
        "max_model_len": int(recipe.get("max_model_len") or 0),
    }


def needle_depth(asked: int, max_model_len: int) -> int:
    """The depth of the needle prompts: what was asked, at most 1/NEEDLE_CONTEXT_SHARE of max_model_len (0: no
    limit known). 0 skips the needles."""
    if max_model_len > 0:
        return max(0, min(asked, max_model_len // NEEDLE_CONTEXT_SHARE))
    return max(0, asked)


def needle(depth_tokens: int, fraction: float, filler_tokens: int) -> Needle:
    """The needle request for DEPTH_TOKENS of prompt (FILLER_TOKENS: what FILLER counts in the model's
    tokenizer) with the fact after FRACTION of it."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"a needle's fraction is between 0 and 1, got {fraction}")
    repeats = max(1, depth_tokens // max(1, filler_tokens))
    before = round(repeats * fraction)
    number = needle_number(depth_tokens, fraction)
    text = FILLER * before + NEEDLE.format(number=number) + FILLER * (repeats - before)
    return Needle(depth_tokens, fraction, number, f"{text}\n\n{NEEDLE_QUESTION}")


def message_of(answer: dict) -> dict:
    """The first choice's message of a chat completion (an empty mapping when there is none)."""
    choices = answer.get("choices") or [{}]
    return choices[0].get("message") or {}


def shape_problem(answer: dict, reasoning_parser: bool) -> str | None:
    """What is wrong with a chat completion's shape, or None: no text at all, or a reasoning block left in
    `content` (a model with a reasoning parser must have it split out into `reasoning`)."""
    message = message_of(answer)
    content = message.get("content") or ""
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    if not (content.strip() or reasoning.strip()):
        return f"no text in content or reasoning: {shown(message)}"
    if reasoning_parser and ("<think>" in content or "</think>" in content):
        return f"a <think> block in content (the reasoning parser did not split it out): {shown(content)}"
    return None


def answer_text(answer: dict) -> str:
    """What a canary's answer is compared by: its content, stripped; the reasoning when a thinking model spent
    its whole budget before answering (content null)."""
    message = message_of(answer)
    content = (message.get("content") or "").strip()
    return content or (message.get("reasoning") or message.get("reasoning_content") or "").strip()


def canary_problem(answer: dict, expected: str | None, reasoning_parser: bool) -> str | None:
    """What is wrong with a canary's answer, or None. EXPECTED None: only the shape is checked (the answer is
    being recorded)."""
    problem = shape_problem(answer, reasoning_parser)
    if problem:
        return problem
    text = answer_text(answer)
    if expected is not None and text != expected.strip():
        return f"expected {shown(expected.strip())}, got {shown(text)}"
    return None


def needle_problem(answer: dict, item: Needle) -> str | None:
    """None when the needle's number is in the answer (its content, or the reasoning of a thinking model that
    spent its budget before answering)."""
    message = message_of(answer)
    said = (message.get("content") or "") + (message.get("reasoning") or message.get("reasoning_content") or "")
    if item.number in said:
        return None
    return f"the number {item.number} is not in the answer: {shown(answer_text(answer))}"


def stream_problem(body: str) -> str | None:
    """What is wrong with a streamed chat completion's body (server-sent events), or None: every event is
    `data: JSON` or the final `data: [DONE]`, each choice ends with a finish reason, a usage chunk counts the
    generated tokens, and some text came."""
    events = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    if not events:
        return f"no server-sent event in the body: {shown(body)}"
    if events[-1] != "[DONE]":
        return f"the stream ends without data: [DONE] (cut short?); its last event: {shown(events[-1])}"
    finished: dict[int, str] = {}
    usage = None
    text = ""
    for event in events[:-1]:
        try:
            chunk = json.loads(event)
        except ValueError:
            return f"an event that is not JSON: {shown(event)}"
        if not isinstance(chunk, dict) or chunk.get("error"):
            return f"an error in the stream: {shown(chunk)}"
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text += (delta.get("content") or "") + (delta.get("reasoning") or "")
            if choice.get("finish_reason"):
                finished[choice.get("index", 0)] = choice["finish_reason"]
        usage = chunk.get("usage") or usage
    if not finished:
        return "no choice ended with a finish reason"
    if not usage or not usage.get("completion_tokens"):
        return f"no usage chunk counting the generated tokens (stream_options.include_usage): {shown(usage)}"
    if not text.strip():
        return "the stream carried no text"
    return None


def tool_call_problem(answer: dict) -> str | None:
    """What is wrong with the answer to the tool canary, or None: it must call TOOL_NAME, with arguments that are
    a JSON object (the tool parser turned the model's text into a call; a missing or wrong parser leaves the call
    as text in content)."""
    message = message_of(answer)
    calls = message.get("tool_calls") or []
    if not calls:
        return (
            f"no tool call (tool_calls is empty; the tool parser found none): content {shown(message.get('content'))}"
        )
    function = calls[0].get("function") or {}
    if function.get("name") != TOOL_NAME:
        return f"the tool call names {shown(function.get('name'))}, not {TOOL_NAME!r}"
    try:
        arguments = json.loads(function.get("arguments") or "")
    except ValueError:
        return f"the tool call's arguments are not JSON: {shown(function.get('arguments'))}"
    if not isinstance(arguments, dict):
        return f"the tool call's arguments are not a JSON object: {shown(arguments)}"
    return None


@dataclass(frozen=True)
class CanaryRecord:
    """The canaries' answers recorded at a model's first good start, kept beside its last good configuration.
    They hold only for the same model (repository and revision) asked the same way (max_tokens): a new revision
    records them again."""

    model: dict
    answers: dict

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "answers": self.answers}, indent=2, sort_keys=True) + "\n"


def held_answers(recorded_text: str | None, model: dict) -> dict[str, str]:
    """The recorded answers that hold for MODEL (its identity: repository, revision, max_tokens), by prompt; none
    when nothing was recorded, the record is unreadable, or it was recorded for another model."""
    if not recorded_text:
        return {}
    try:
        recorded = json.loads(recorded_text)
    except ValueError:
        return {}
    if not isinstance(recorded, dict) or recorded.get("model") != model:
        return {}
    answers = recorded.get("answers")
    return {str(k): str(v) for k, v in answers.items()} if isinstance(answers, dict) else {}
