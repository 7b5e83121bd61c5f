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
    n: int = 1  # choices per request (non-streamed only here)
    thinking: bool = True  # chat_template_kwargs.enable_thinking: false answers without reasoning
    # vLLM's return_token_ids extension: a stream's first chunk carries the prompt's ids, each other chunk its own
    return_token_ids: bool = False


def _resolve_model(body: dict[str, object], config: ServeConfig) -> str:
    """The name an answer carries: vLLM 0.33 answers a request for any of its served names (OpenAIServingModels.
    check_model) with the first one (model_name(): base_model_paths[0].name). Unknown names get its 404."""
    requested = body.get("model")
    if requested is not None and requested not in config.served_model_names:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{requested}` does not exist.", "NotFoundError", "model")
    return config.served_model_names[0]


def _max_tokens(value: object, prompt_tokens: int, config: ServeConfig) -> int:
    """max_tokens as vLLM resolves it: default is what is left of the context; too much is a 400."""
    if prompt_tokens > config.max_model_len:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"This model's maximum context length is {config.max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            param="input_tokens",
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
    n = 1 if body.get("n") is None else body.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"n must be at least 1, got {n}.", param="n")
    if n > 1 and body.get("temperature") == 0:
        # vLLM's SamplingParams: greedy sampling has one answer (the message and param as vLLM 0.32 sends them)
        raise ApiError(HTTPStatus.BAD_REQUEST, f"n must be 1 when using greedy sampling, got {n}.")
    if n > 1 and body.get("stream"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "The vLLM stand-in streams only n=1.", param="n")
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)
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
        n=n,
        thinking=thinking,
        return_token_ids=bool(body.get("return_token_ids", False)),
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


def system_fingerprint(version: str) -> str:
    """vLLM's system_fingerprint, "vllm-<version>-<8 hex>" (a string on every answer and on a stream's usage chunk)."""
    return f"vllm-{version}-{zlib.crc32(version.encode()):08x}"


def usage(
    prompt_tokens: int, completion_tokens: int, *, reasoning_tokens: int | None = None, streamed: bool = False
) -> dict[str, object]:
    """vLLM's UsageInfo. A chat answer counts its reasoning tokens (completion_tokens_details); a completion has
    none (null). In a stream the null details are left out, as vLLM's chunks leave them out."""
    body: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None if reasoning_tokens is None else {"reasoning_tokens": reasoning_tokens},
    }
    return {key: value for key, value in body.items() if value is not None} if streamed else body


def completion_response(
    request_id: str,
    model: str,
    texts: list[str],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
) -> dict[str, object]:
    """One choice per text (n); completion_tokens is the sum over the choices."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for index, text in enumerate(texts)
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, completion_tokens),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(
    request_id: str, created: int, model: str, text: str, finish_reason: str | None
) -> dict[str, object]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    return {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_response(
    request_id: str,
    model: str,
    answers: list[tuple[str, str]],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    fingerprint: str,
) -> dict[str, object]:
    """A chat answer, one choice per (text, reasoning) (n); with a reasoning parser, the thinking is in
    message.reasoning and content may be null (a max_tokens that ends while the model still reasons), as vLLM's
    ChatMessage has it since PR 33402. No tool_calls: ChatMessage's serializer drops an empty list."""
    choices = []
    for index, (text, reasoning) in enumerate(answers):
        message = {
            "role": "assistant",
            "content": text or None,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": reasoning or None,
        }
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
        )
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, completion_tokens, reasoning_tokens=reasoning_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    delta: dict[str, str],
    finish_reason: str | None,
    *,
    first: bool = False,
    token_ids: list[int] | None = None,
) -> dict[str, object]:
    """A chat stream chunk: the first (the role) carries the prompt fields, the others token_ids, the last its
    stop_reason, as vLLM's chunks do. The ids are null unless the request asked for return_token_ids; then
    TOKEN_IDS are the prompt's (first chunk) or the chunk's own."""
    choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    if not first:
        choice["token_ids"] = token_ids
    chunk: dict[str, object] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if first:
        chunk.update(prompt_token_ids=token_ids, prompt_text=None)
    return chunk


def usage_chunk(
    request_id: str,
    created: int,
    model: str,
    obj: str,
    prompt: int,
    completion: int,
    reasoning_tokens: int | None,
    fingerprint: str,
) -> dict[str, object]:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage and the fingerprint."""
    body = {"id": request_id, "object": obj, "created": created, "model": model, "choices": []}
    body["usage"] = usage(prompt, completion, reasoning_tokens=reasoning_tokens, streamed=True)
    body["system_fingerprint"] = fingerprint
    return body


def detokenize(body: dict[str, object], config: ServeConfig) -> dict[str, object]:
    """POST /detokenize -> {"prompt": text}. The stand-in's ids are hashes of words, so the text names them."""
    _resolve_model(body, config)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(HTTPStatus.BAD_REQUEST, "tokens must be a list of token ids.", param="tokens")
    return {"prompt": "".join(f"<{token}>" for token in tokens)}


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
