"""The coding agents' APIs as vLLM serves them: Anthropic's Messages API (POST /v1/messages and
/v1/messages/count_tokens, vllm/entrypoints/anthropic) and OpenAI's Responses API (POST /v1/responses,
vllm/entrypoints/openai/responses), non-streamed and streamed.

The shapes are vLLM 0.32.0's, as its engine answered the same requests (tests/standins/test_standin_vs_real_engine.py
holds them to it): a Messages answer's content blocks (thinking with a signature, then text), its stream's events
(message_start, content_block_start/delta/stop, message_delta, message_stop, each `event: TYPE` before its data),
a Responses answer's items (reasoning, then message) and its stream's numbered events (response.created ...
response.completed, which vLLM sends with status "incomplete" too). Errors on /v1/messages come in Anthropic's
shape. Like every /v1 path, both take only `Authorization: Bearer` (vLLM's middleware): `x-api-key` alone is a 401.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus

from .config import ServeConfig
from .engine import TokenEvent
from .protocol import ApiError, ParsedRequest, _common, _message_words


def anthropic_error(error: ApiError) -> dict[str, object]:
    """vLLM's AnthropicErrorResponse: {"type": "error", "error": {"type", "message"}}."""
    return {"type": "error", "error": {"type": error.err_type, "message": error.message}}


def _system_words(system: object) -> list[str]:
    if isinstance(system, str):
        return system.split()
    if isinstance(system, list):
        return [word for part in system if isinstance(part, dict) for word in str(part.get("text", "")).split()]
    return []


def parse_messages(body: dict[str, object], config: ServeConfig) -> ParsedRequest:
    """A Messages request: the prompt is the system text and the messages' text; max_tokens is required."""
    if not isinstance(body.get("messages"), list):
        raise ApiError(HTTPStatus.BAD_REQUEST, "messages: Field required", param="messages")
    if body.get("max_tokens") is None:
        raise ApiError(HTTPStatus.BAD_REQUEST, "max_tokens: Field required", param="max_tokens")
    words = tuple(_system_words(body.get("system")) + _message_words(body.get("messages")))
    plain = {key: value for key, value in body.items() if key not in ("stream_options", "n")}
    return _common(plain, config, words, body.get("max_tokens"))


def count_tokens(body: dict[str, object], config: ServeConfig) -> dict[str, object]:
    """POST /v1/messages/count_tokens -> {"input_tokens", "context_management": {"original_input_tokens"}}."""
    parsed = _common({"model": body.get("model")}, config, tuple(_message_words(body.get("messages"))), 1)
    count = parsed.prompt_tokens
    return {"input_tokens": count, "context_management": {"original_input_tokens": count}}


def _stop_reason(finish: str | None) -> str:
    return "max_tokens" if finish == "length" else "end_turn"


def _signature() -> str:
    return uuid.uuid4().hex


def messages_response(
    request_id: str, model: str, text: str, reasoning: str, finish: str | None, prompt: int, generated: int
) -> dict[str, object]:
    content: list[dict[str, object]] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": _signature()})
    if text:
        content.append({"type": "text", "text": text})
    return {
        "id": request_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": _stop_reason(finish),
        "usage": {"input_tokens": prompt, "output_tokens": generated},
    }


def messages_events(request_id: str, parsed: ParsedRequest, tokens: Iterator[TokenEvent]) -> Iterator[dict]:
    """A Messages stream's events, in order: one content block per kind of text (thinking, then text)."""
    usage = {"input_tokens": parsed.prompt_tokens, "output_tokens": 0}
    message = {"id": request_id, "type": "message", "role": "assistant", "content": [], "model": parsed.model}
    yield {"type": "message_start", "message": message | {"stop_reason": None, "stop_sequence": None, "usage": usage}}
    block, index, generated, finish = None, -1, 0, None
    for event in tokens:
        generated += 1
        finish = event.finish_reason or finish
        kind = "thinking" if event.reasoning else "text"
        if kind != block:
            if block is not None:
                yield from _close_block(block, index)
            block, index = kind, index + 1
            yield {"type": "content_block_start", "content_block": {"type": kind, kind: ""}, "index": index}
        delta = {"type": f"{kind}_delta", kind: event.text}
        yield {"type": "content_block_delta", "delta": delta, "index": index}
    if block is not None:
        yield from _close_block(block, index)
    delta = {"stop_reason": _stop_reason(finish), "stop_sequence": None}
    yield {"type": "message_delta", "delta": delta, "usage": usage | {"output_tokens": generated}}
    yield {"type": "message_stop"}


def _close_block(kind: str, index: int) -> Iterator[dict]:
    if kind == "thinking":  # a thinking block ends with its signature
        yield {
            "type": "content_block_delta",
            "delta": {"type": "signature_delta", "signature": _signature()},
            "index": index,
        }
    yield {"type": "content_block_stop", "index": index}


# --- Responses ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponsesRequest:
    parsed: ParsedRequest
    max_output_tokens: int | None
    temperature: float
    top_p: float


def _input_words(value: object) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        words: list[str] = []
        for item in value:
            if isinstance(item, dict):
                content = item.get("content")
                if isinstance(content, str):
                    words += content.split()
                elif isinstance(content, list):
                    for part in content:
                        if isinstance(part, dict):
                            words += str(part.get("text", "")).split()
        return words
    raise ApiError(HTTPStatus.BAD_REQUEST, "input: Field required", param="input")


def parse_responses(body: dict[str, object], config: ServeConfig) -> ResponsesRequest:
    words = tuple(_system_words(body.get("instructions")) + _input_words(body.get("input")))
    plain = {key: value for key, value in body.items() if key not in ("stream_options", "n")}
    parsed = _common(plain, config, words, body.get("max_output_tokens"))
    given = body.get("max_output_tokens")
    return ResponsesRequest(
        parsed=parsed,
        max_output_tokens=given if isinstance(given, int) else None,
        temperature=float(body.get("temperature") or 1.0),
        top_p=float(body.get("top_p") or 1.0),
    )


def _hex_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def response_body(
    request: ResponsesRequest,
    response_id: str,
    created: int,
    output: list[dict],
    status: str,
    usage: dict | None,
    incomplete: bool = False,
) -> dict[str, object]:
    """vLLM's ResponsesResponse, every field as it sends them."""
    return {
        "id": response_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": None,
        "metadata": None,
        "model": request.parsed.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": request.temperature,
        "tool_choice": "none",
        "tools": [],
        "top_p": request.top_p,
        "background": False,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def responses_usage(prompt: int, generated: int, reasoning: int) -> dict[str, object]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": generated,
        "output_tokens_details": {
            "reasoning_tokens": reasoning,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + generated,
    }


def reasoning_item(item_id: str, text: str | None, status: str | None) -> dict[str, object]:
    content = None if text is None else [{"text": text, "type": "reasoning_text"}]
    return {
        "id": item_id,
        "summary": [],
        "type": "reasoning",
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def message_item(item_id: str, text: str | None, status: str) -> dict[str, object]:
    content = [] if text is None else [_output_text(text, None)]
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": None}


def _output_text(text: str, logprobs: list | None) -> dict[str, object]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def responses_answer(request: ResponsesRequest, events: list[TokenEvent]) -> dict[str, object]:
    """A non-streamed answer: a reasoning item for the thinking, a message item for the text."""
    reasoning = "".join(event.text for event in events if event.reasoning)
    text = "".join(event.text for event in events if not event.reasoning)
    output = []
    if reasoning:
        output.append(reasoning_item(_hex_id("rs"), reasoning, None))
    if text:
        output.append(message_item(_hex_id("msg"), text, "completed"))
    incomplete = bool(events) and events[-1].finish_reason == "length"
    thought = sum(event.reasoning for event in events)
    usage = responses_usage(request.parsed.prompt_tokens, len(events), thought)
    status = "incomplete" if incomplete else "completed"
    return response_body(request, _hex_id("resp"), int(time.time()), output, status, usage, incomplete)


def responses_events(request: ResponsesRequest, tokens: Iterator[TokenEvent]) -> Iterator[dict]:
    """A Responses stream: created, in_progress, each item's added/part/deltas/done events, completed; every event
    numbered (sequence_number) in order."""
    response_id, created = _hex_id("resp"), int(time.time())
    started = response_body(request, response_id, created, [], "in_progress", None)
    number = 0

    def numbered(event: dict) -> dict:
        nonlocal number
        event["sequence_number"] = number
        number += 1
        return event

    yield numbered({"response": started, "type": "response.created"})
    yield numbered({"response": started, "type": "response.in_progress"})
    done_items: list[dict] = []
    item: dict | None = None
    text, generated, thought, finish = "", 0, 0, None

    def close() -> Iterator[dict]:
        index = len(done_items)
        where = {"content_index": 0, "item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            yield numbered(where | {"text": text, "type": "response.reasoning_text.done"})
            part = {"text": text, "type": "reasoning_text"}
            finished = reasoning_item(item["id"], text, "completed")
        else:
            yield numbered(where | {"logprobs": [], "text": text, "type": "response.output_text.done"})
            part = _output_text(text, None)
            finished = message_item(item["id"], text, "completed")
        yield numbered(where | {"part": part, "type": "response.content_part.done"})
        yield numbered({"item": finished, "output_index": index, "type": "response.output_item.done"})
        done_items.append(finished)

    for event in tokens:
        generated += 1
        thought += event.reasoning
        finish = event.finish_reason or finish
        kind = "reasoning" if event.reasoning else "message"
        if item is None or item["type"] != kind:
            if item is not None:
                yield from close()
            index = len(done_items)
            if kind == "reasoning":
                item = reasoning_item(_hex_id("rs"), None, "in_progress")
                part = {"text": "", "type": "reasoning_text"}
            else:
                item = message_item(_hex_id("msg"), None, "in_progress")
                part = _output_text("", [])
            text = ""
            yield numbered({"item": item, "output_index": index, "type": "response.output_item.added"})
            where = {"content_index": 0, "item_id": item["id"], "output_index": index}
            yield numbered(where | {"part": part, "type": "response.content_part.added"})
        text += event.text
        where = {"content_index": 0, "item_id": item["id"], "output_index": len(done_items)}
        if kind == "reasoning":
            yield numbered(where | {"delta": event.text, "type": "response.reasoning_text.delta"})
        else:
            yield numbered(where | {"delta": event.text, "logprobs": [], "type": "response.output_text.delta"})
    if item is not None:
        yield from close()
    incomplete = finish == "length"
    usage = responses_usage(request.parsed.prompt_tokens, generated, thought)
    status = "incomplete" if incomplete else "completed"
    final = response_body(request, response_id, created, done_items, status, usage, incomplete)
    yield numbered({"response": final, "type": "response.completed"})
