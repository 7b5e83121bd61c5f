"""The HTTP side: vLLM's OpenAI-compatible routes on a standard-library ThreadingHTTPServer.

One thread per connection lets concurrent requests overlap (the engine decides who runs and who waits).
Responses use HTTP/1.1: plain bodies carry Content-Length, streams use chunked transfer encoding as uvicorn
does, so keep-alive clients (the OpenAI SDK, `vllm bench serve`'s aiohttp) behave as they do against vLLM.

Routes: GET /health, /ping, /version, /metrics, /v1/models; POST /v1/completions, /v1/chat/completions, /v1/messages,
/v1/messages/count_tokens, /v1/responses (agents.py), /tokenize, /detokenize; a pooling server (--runner pooling,
pooling.py) serves /v1/embeddings or /rerank, /v1/rerank and /v2/rerank instead of the two generation routes. With
--api-key (or $VLLM_API_KEY) every /v1/* request needs ``Authorization: Bearer KEY``, as in vLLM's authentication
middleware; /health, /metrics, /tokenize, /detokenize and /rerank (not under /v1) stay open.
"""

from __future__ import annotations

import dataclasses
import hmac
import importlib
import itertools
import json
import socket
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import agents, pooling, protocol
from .config import ServeConfig
from .engine import Engine, GenerationRequest, TokenEvent
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .recall import recalled_answer

# vLLM 0.33's AuthenticationMiddleware (entrypoints/serve/middleware/authenticate.py): the paths --api-key guards;
# /health, /metrics, /tokenize, /rerank, /score and the rest stay open (tests/contracts/vllm/auth.json).
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


class StandinServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that carries the engine and config for its handlers."""

    daemon_threads = True  # a hung client must not keep the process alive at shutdown
    allow_reuse_address = True  # as uvicorn: restart on the same port without waiting for TIME_WAIT
    request_queue_size = 128

    def __init__(self, config: ServeConfig, engine: Engine) -> None:
        # IPv6 literals (e.g. --host ::) need an AF_INET6 socket.
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.config = config
        self.engine = engine
        self.started = int(time.time())
        # Generation requests since the start, for the faults of VLLM_STANDIN_FAULT_* (config.Faults).
        self._generations = itertools.count(1)
        self.guards = [load_guard(path) for path in config.middleware]
        # bind_and_activate=False: cli.py binds early and listens only after the pretend weight loading.
        super().__init__((config.host, config.port), Handler, bind_and_activate=False)


def load_guard(import_path: str) -> object:
    """A --middleware class, imported as vLLM imports it (importlib, from the process's sys.path: PYTHONPATH), and
    made with no app. This server is not ASGI, so it runs a middleware through its public decision,
    `authorized(method, path, authorization) -> bool` (sparkfleet's key guard has it); it refuses any other."""
    module_path, _, name = import_path.rpartition(".")
    guard = getattr(importlib.import_module(module_path), name)(None)
    if not callable(getattr(guard, "authorized", None)):
        raise ValueError(f"--middleware {import_path}: the stand-in runs only middleware with authorized()")
    return guard


def _reversed_text(tokens: Iterator[TokenEvent]) -> Iterator[TokenEvent]:
    """The fault VLLM_STANDIN_FAULT_WRONG_AFTER: each token's text reversed; closing this closes the engine's."""
    try:
        for event in tokens:
            yield dataclasses.replace(event, text=event.text[::-1])
    finally:
        tokens.close()


def _json_bytes(body: object) -> bytes:
    """Compact JSON, as pydantic's model_dump_json writes it."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Handler(BaseHTTPRequestHandler):
    server: StandinServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn sets it: headers and body go out as two writes, and with Nagle's algorithm a
    # kept-alive connection's next answer waited ~40 ms for the client's delayed ACK (clients that time a request
    # to subtract it, as llama-benchy does, then measured the stand-in's stall).
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "uvicorn"  # the Server header vLLM's uvicorn sends

    # --- plumbing -----------------------------------------------------------------------------------------

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # uvicorn-style access log on stdout, where vLLM logs go.
        status = int(code) if str(code).isdigit() else code
        print(f'INFO:     {self.client_address[0]} - "{self.requestline}" {status}', flush=True)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str | None = "application/json") -> None:
        self.send_response(status)
        if content_type:  # vLLM's /health answers an empty body with no content type
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: HTTPStatus, body: object) -> None:
        self._send(status, _json_bytes(body))

    def _read_body(self) -> bytes:
        """The whole request body, Content-Length or chunked, read before any answer (as uvicorn does).

        A body left unread on a keep-alive connection would be parsed as the next request line: proxies
        (vllm-router, LiteLLM) reuse connections, so even a 401 or 404 must consume it first.
        """
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_json(self) -> dict[str, object]:
        raw = self._body
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError as error:
            # vLLM's request validation error: type "Bad Request", param the body's location
            message = f"Request body is not valid JSON: {error}"
            raise protocol.ApiError(HTTPStatus.BAD_REQUEST, message, "Bad Request", "body") from None
        if not isinstance(body, dict):
            raise protocol.ApiError(HTTPStatus.BAD_REQUEST, "Request body must be a JSON object.")
        return body

    def _authorized(self) -> bool:
        """vLLM's AuthenticationMiddleware: only paths under GUARDED_PREFIX are protected; any configured key is
        accepted."""
        path = self.path.partition("?")[0]
        header = self.headers.get("authorization")
        if not all(guard.authorized(self.command, path, header) for guard in self.server.guards):
            return False
        keys = self.server.config.api_keys
        if not keys or not self.path.startswith(GUARDED_PREFIX):
            return True
        header = self.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return any(hmac.compare_digest(token.encode(), key.encode()) for key in keys)

    # --- routing ------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        routes = {
            ("GET", "/health"): self._health,
            ("GET", "/ping"): self._health,
            ("POST", "/ping"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            **self._task_routes(),
        }
        self._body = self._read_body()
        path = self.path.split("?", 1)[0]
        handler = routes.get((method, path))
        if handler is None:
            known = any(p == path for _, p in routes)
            status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
            # FastAPI's bodies for unknown routes and methods.
            self._send_json(status, {"detail": "Method Not Allowed" if known else "Not Found"})
            return
        if not self._authorized():
            self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
            return
        try:
            handler()
        except protocol.ApiError as error:
            self._send_json(error.status, error.body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _task_routes(self) -> dict:
        """The generation routes, or a pooling server's own (vLLM registers routes by the model's tasks)."""
        task = self.server.config.pooling
        # vLLM scores with an embedding model too (the cosine of the two embeddings), and with a classifier.
        rerank = {("POST", path): self._rerank for path in ("/rerank", "/v1/rerank", "/v2/rerank")}
        if task == pooling.EMBED:
            return {("POST", "/v1/embeddings"): self._embeddings, **rerank}
        if task == pooling.CLASSIFY:
            return rerank
        return {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            # The coding agents' APIs (agents.py): Anthropic's Messages and OpenAI's Responses.
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", "/v1/responses"): self._responses,
        }

    # --- endpoints ----------------------------------------------------------------------------------------

    def _embeddings(self) -> None:
        self._send_json(HTTPStatus.OK, pooling.embeddings_response(self._read_json(), self.server.config))

    def _rerank(self) -> None:
        self._send_json(HTTPStatus.OK, pooling.rerank_response(self._read_json(), self.server.config))

    def _health(self) -> None:
        self._send(HTTPStatus.OK, b"", None)

    def _version(self) -> None:
        self._send_json(HTTPStatus.OK, {"version": self.server.config.version})

    def _metrics(self) -> None:
        self._send(HTTPStatus.OK, self.server.engine.metrics.render().encode(), METRICS_CONTENT_TYPE)

    def _models(self) -> None:
        self._send_json(HTTPStatus.OK, protocol.models_list(self.server.config, self.server.started))

    def _tokenize(self) -> None:
        self._send_json(HTTPStatus.OK, protocol.tokenize(self._read_json(), self.server.config))

    def _detokenize(self) -> None:
        self._send_json(HTTPStatus.OK, protocol.detokenize(self._read_json(), self.server.config))

    def _completions(self) -> None:
        arrival = time.monotonic()
        parsed = protocol.parse_completion(self._read_json(), self.server.config)
        self._generate(parsed, arrival, chat=False)

    def _chat(self) -> None:
        arrival = time.monotonic()
        parsed = protocol.parse_chat(self._read_json(), self.server.config)
        self._generate(parsed, arrival, chat=True)

    def _messages(self) -> None:
        arrival = time.monotonic()
        try:
            parsed = agents.parse_messages(self._read_json(), self.server.config)
        except protocol.ApiError as error:  # Anthropic's error shape on its own route
            self._send_json(error.status, agents.anthropic_error(error))
            return
        request_id = protocol.random_id("chatcmpl")
        tokens = self._tokens(parsed, arrival, chat=True)
        try:
            if parsed.stream:
                self._send_events(agents.messages_events(request_id, parsed, tokens))
            else:
                events = list(tokens)
                text = "".join(event.text for event in events if not event.reasoning)
                reasoning = "".join(event.text for event in events if event.reasoning)
                finish = events[-1].finish_reason if events else None
                body = agents.messages_response(
                    request_id, parsed.model, text, reasoning, finish, parsed.prompt_tokens, len(events)
                )
                self._send_json(HTTPStatus.OK, body)
        finally:
            tokens.close()

    def _count_tokens(self) -> None:
        try:
            self._send_json(HTTPStatus.OK, agents.count_tokens(self._read_json(), self.server.config))
        except protocol.ApiError as error:
            self._send_json(error.status, agents.anthropic_error(error))

    def _responses(self) -> None:
        arrival = time.monotonic()
        request = agents.parse_responses(self._read_json(), self.server.config)
        tokens = self._tokens(request.parsed, arrival, chat=True)
        try:
            if request.parsed.stream:
                self._send_events(agents.responses_events(request, tokens))
            else:
                self._send_json(HTTPStatus.OK, agents.responses_answer(request, list(tokens)))
        finally:
            tokens.close()

    def _send_events(self, events: Iterator[dict]) -> None:
        """Server-sent events with their type named (`event: TYPE`), as vLLM's Messages and Responses streams."""
        self.send_response(HTTPStatus.OK)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for event in events:
            self._write_chunk(f"event: {event['type']}\n".encode() + b"data: " + _json_bytes(event) + b"\n\n")
        self._write_chunk(b"")

    def _tokens(
        self, parsed: protocol.ParsedRequest, arrival: float, chat: bool, request_id: str | None = None
    ) -> Iterator[TokenEvent]:
        """The engine's tokens for one request. vLLM's reasoning parser splits chat answers only (a chat's thinking
        comes first); /v1/completions returns the raw text."""
        return self.server.engine.generate(
            GenerationRequest(
                request_id=request_id or protocol.random_id("chatcmpl" if chat else "cmpl"),
                prompt_words=parsed.prompt_words,
                prompt_tokens=parsed.prompt_tokens,
                max_tokens=parsed.max_tokens,
                ignore_eos=parsed.ignore_eos,
                arrival=arrival,
                reasoning_tokens=self.server.config.reasoning_tokens if chat and parsed.thinking else 0,
                answer_words=recalled_answer(parsed.prompt_words, self.server.config.faults.context_words),
            )
        )

    def _generate(self, parsed: protocol.ParsedRequest, arrival: float, chat: bool) -> None:
        request_id = protocol.random_id("chatcmpl" if chat else "cmpl")
        tokens = self._tokens(parsed, arrival, chat, request_id)
        number = next(self.server._generations)
        config = self.server.config
        if config.faults.wrong(number, speculating=config.speculation.tokens > 0):
            tokens = _reversed_text(tokens)
        truncated = self.server.config.faults.truncated(number)
        fingerprint = protocol.system_fingerprint(self.server.config.version)
        try:
            if parsed.stream:
                self._stream(request_id, parsed, tokens, chat, fingerprint, truncated)
            else:
                events = list(tokens)
                text = "".join(event.text for event in events if not event.reasoning)
                reasoning = "".join(event.text for event in events if event.reasoning)
                thought = sum(event.reasoning for event in events)
                finish = events[-1].finish_reason or "length"
                n, generated = parsed.n, len(events) * parsed.n  # n choices: the one answer n times
                if chat:
                    body = protocol.chat_response(
                        request_id,
                        parsed.model,
                        [(text, reasoning)] * n,
                        finish,
                        parsed.prompt_tokens,
                        generated,
                        thought * n,
                        fingerprint,
                    )
                else:
                    body = protocol.completion_response(
                        request_id, parsed.model, [text] * n, finish, parsed.prompt_tokens, generated, fingerprint
                    )
                self._send_json(HTTPStatus.OK, body)
        finally:
            tokens.close()  # a client that went away mid-stream aborts the request and frees its slot

    def _stream(
        self,
        request_id: str,
        parsed: protocol.ParsedRequest,
        tokens: Iterator[TokenEvent],
        chat: bool,
        fingerprint: str,
        truncated: bool = False,
    ) -> None:
        """Server-sent events: ``data: {chunk}`` per token, a usage chunk when asked, then ``data: [DONE]``.
        TRUNCATED (a fault): the body ends after the first token."""
        self.send_response(HTTPStatus.OK)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        generated = thought = 0

        def with_usage(chunk: dict[str, object]) -> dict[str, object]:
            if parsed.continuous_usage:
                chunk["usage"] = protocol.usage(parsed.prompt_tokens, generated, streamed=True)
            return chunk

        ids = parsed.return_token_ids
        if chat:
            # vLLM opens a chat stream with the assistant role and empty content, when the first token is out
            # (serving.py sends it on the engine's first output): until then, the prefill, nothing comes.
            first = next(tokens, None)
            tokens = itertools.chain([] if first is None else [first], tokens)
            opening = {"role": "assistant", "content": ""}
            prompt_ids = [protocol.token_id(word) for word in parsed.prompt_words] if ids else None
            opening_chunk = protocol.chat_chunk(
                request_id, created, parsed.model, opening, None, first=True, token_ids=prompt_ids
            )
            self._event(with_usage(opening_chunk))
        for event in tokens:
            generated += 1
            thought += event.reasoning
            if chat:
                delta = {"reasoning" if event.reasoning else "content": event.text}
                own = [protocol.token_id(event.text.strip())] if ids else None
                chunk = protocol.chat_chunk(
                    request_id, created, parsed.model, delta, event.finish_reason, token_ids=own
                )
            else:
                chunk = protocol.completion_chunk(request_id, created, parsed.model, event.text, event.finish_reason)
            self._event(with_usage(chunk))
            if truncated:
                self._write_chunk(b"")
                return
        if parsed.include_usage:
            reasoning = thought if chat else None
            self._event(
                protocol.usage_chunk(
                    request_id, created, parsed.model, obj, parsed.prompt_tokens, generated, reasoning, fingerprint
                )
            )
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _event(self, chunk: dict[str, object]) -> None:
        self._write_chunk(b"data: " + _json_bytes(chunk) + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        """One piece of a chunked body; empty data writes the terminating zero-length chunk."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
