"""Request validation and response bodies in the shapes vLLM's OpenAI-compatible server uses.

Field names, object names, id prefixes ("cmpl-", "chatcmpl-") and error bodies follow vLLM's protocol models
(vllm/entrypoints/openai/protocol.py and engine/serving.py), so a client written against real vLLM parses
these unchanged. Fields the stand-in has no data for (logprobs, tool calls, reasoning) are present and null.
"""

from __future__ import annotations

import time
import uuid
import zlib
from dataclasses import dataclass
from http import HTTPStatus

from .config import ServeConfig

# The pretend tokenizer's vocabulary (a Llama-sized 32000) and its one special token the stand-in uses.
VOCAB_SIZE = 32000
BOS_ID = 1
FIRST_WORD_ID = 3  # 0-2 are <unk>, <s>, </s> in Llama-style vocabularies; words never get them


class ApiError(Exception):
    """An error vLLM answers with a JSON ErrorResponse and an HTTP status."""

    def __init__(self, status: HTTPStatus, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, object]:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: HTTPStatus, message: str, err_type: str, param: str | None = None) -> dict[str, object]:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": int(status)}}


def random_id(prefix: str) -> str:
    """vLLM's ids: a prefix and uuid4().hex ("cmpl-3f2a...", "chatcmpl-...")."""
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ParsedRequest:
    """A validated completion or chat request, reduced to what the engine and the response builders need."""

    model: str
    prompt_words: tuple[str, ...]
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool


def _resolve_model(body: dict[str, object], config: ServeConfig) -> str:
    """The served name a request addresses; unknown names get vLLM's 404 NotFoundError."""
    requested = body.get("model")
    if requested is None:
        return config.served_model_names[0]
    if requested not in config.served_model_names:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{requested}` does not exist.", "NotFoundError", "model")
    return str(requested)


def _max_tokens(value: object, prompt_tokens: int, config: ServeConfig) -> int:
    """max_tokens as vLLM resolves it: default is what is left of the context; too much is a 400."""
    if prompt_tokens > config.max_model_len:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"This model's maximum context length is {config.max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
        )
    room = config.max_model_len - prompt_tokens
    if value is None:
        return max(room, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"max_tokens must be at least 1, got {value}.", param="max_tokens")
    if value > room:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"'max_tokens' or 'max_completion_tokens' is too large: {value}. This model's maximum context length "
            f"is {config.max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({value} > {config.max_model_len} - {prompt_tokens}).",
            param="max_tokens",
        )
    return value


def _common(body: dict[str, object], config: ServeConfig, words: tuple[str, ...], max_tokens: object) -> ParsedRequest:
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(HTTPStatus.BAD_REQUEST, "The vLLM stand-in supports only n=1.", param="n")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(HTTPStatus.BAD_REQUEST, "stream_options must be an object.", param="stream_options")
    stream = bool(body.get("stream", False))
    if options and not stream:
        raise ApiError(HTTPStatus.BAD_REQUEST, "Stream options can only be defined when `stream=True`.")
    prompt_tokens = max(len(words), 1)
    model = _resolve_model(body, config)
    return ParsedRequest(
        model=model,
        prompt_words=words,
        prompt_tokens=prompt_tokens,
        max_tokens=_max_tokens(max_tokens, prompt_tokens, config),
        stream=stream,
        include_usage=(bool(options.get("include_usage")) and not config.ignore_stream_options)
        or config.force_include_usage,
        continuous_usage=bool(options.get("continuous_usage_stats")) and not config.ignore_stream_options,
        ignore_eos=bool(body.get("ignore_eos", False)),
    )


def parse_completion(body: dict[str, object], config: ServeConfig) -> ParsedRequest:
    """POST /v1/completions: prompt is a string, a one-element list of strings, or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        words = tuple(prompt.split())
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        words = tuple(str(t) for t in prompt)  # token ids count one each
    else:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            "prompt must be a string or a list of token ids (the stand-in serves one prompt per request).",
            param="prompt",
        )
    return _common(body, config, words, body.get("max_tokens", 16))


def _message_words(messages: object) -> list[str]:
    """The words of all messages (string content or text parts), the stand-in's rendering of a chat template."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list.", param="messages")
    words: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(HTTPStatus.BAD_REQUEST, "each message needs a role.", param="messages")
        content = message.get("content")
        if isinstance(content, str):
            words += content.split()
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    words += str(part.get("text", "")).split()
    return words


def parse_chat(body: dict[str, object], config: ServeConfig) -> ParsedRequest:
    """POST /v1/chat/completions: the prompt is the text of all messages (string or text parts)."""
    words = _message_words(body.get("messages"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return _common(body, config, tuple(words), max_tokens)


def token_id(word: str) -> int:
    """A word's pretend token id: stable across runs and processes (crc32, not hash()), never a special id."""
    return FIRST_WORD_ID + zlib.crc32(word.encode("utf-8")) % (VOCAB_SIZE - FIRST_WORD_ID)


def tokenize(body: dict[str, object], config: ServeConfig) -> dict[str, object]:
    """POST /tokenize (vLLM's TokenizeCompletionRequest or TokenizeChatRequest) -> TokenizeResponse.

    One id per whitespace word, so ``count`` equals the prompt_tokens a completion of the same text reports;
    an empty text is one BOS token, as a completion counts it. add_special_tokens changes nothing else.
    """
    _resolve_model(body, config)  # an unknown name gets the same 404 as on /v1/*
    if "messages" in body:
        words = _message_words(body.get("messages"))
    elif isinstance(body.get("prompt"), str):
        words = str(body["prompt"]).split()
    else:
        raise ApiError(HTTPStatus.BAD_REQUEST, "prompt must be a string (or give messages).", param="prompt")
    tokens = [token_id(word) for word in words] or [BOS_ID]
    return {"count": len(tokens), "max_model_len": config.max_model_len, "tokens": tokens, "token_strs": None}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def completion_response(
    request_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, object]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens),
        "kv_transfer_params": None,
    }


def completion_chunk(
    request_id: str, created: int, model: str, text: str, finish_reason: str | None
) -> dict[str, object]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}],
    }


def chat_response(
    request_id: str,
    model: str,
    text: str,
    reasoning: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, object]:
    """A chat answer; with a reasoning parser, the thinking is in message.reasoning and content may be null (a
    max_tokens that ends while the model still reasons), as vLLM's ChatMessage has it since PR 33402. No
    tool_calls: ChatMessage's serializer drops an empty list."""
    message = {
        "role": "assistant",
        "content": text or None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": reasoning or None,
    }
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def chat_chunk(
    request_id: str, created: int, model: str, delta: dict[str, str], finish_reason: str | None
) -> dict[str, object]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(request_id: str, created: int, model: str, obj: str, prompt: int, completion: int) -> dict[str, object]:
    """The last chunk of a stream with stream_options.include_usage: no choices, only usage."""
    body = {"id": request_id, "object": obj, "created": created, "model": model, "choices": []}
    body["usage"] = usage(prompt, completion)
    return body


def models_list(config: ServeConfig, created: int) -> dict[str, object]:
    """GET /v1/models: one card per served name, with vLLM's extra fields root and max_model_len."""
    cards = []
    for name in config.served_model_names:
        permission = {
            "id": random_id("modelperm"),
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        cards.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": config.model,
                "parent": None,
                "max_model_len": config.max_model_len,
                "permission": [permission],
            }
        )
    return {"object": "list", "data": cards}
