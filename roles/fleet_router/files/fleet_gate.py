#!/usr/bin/env python3
"""The fleet's key gate: a key per person or team, checked in front of vllm-router (aiohttp, vllm-router's own
dependency, from the router's venv).

- Keys: a JSON file of key names, the SHA-256 of each key, limits and an enabled flag (never a key itself),
  read again within a second of a change: adding, revoking or re-limiting a key needs no restart and cuts no
  stream. A client sends its key as `Authorization: Bearer KEY` or `x-api-key: KEY`.
- The Sparks see only their own key (the environment's FLEET_SPARK_KEY, from the unit's root-only environment
  file), put in place of the client's: vLLM takes only `Authorization: Bearer`.
- The coding agents' paths (/v1/messages, /v1/messages/count_tokens, /v1/responses) go straight to a healthy Spark
  serving the model, from vllm-router's own worker list (its admin API, so a drained or failing Spark gets none):
  vllm-router 0.1.17 drops the client's Authorization on them, and in multi-model mode sends them, in some of its
  starts, to its empty prefill/decode router (503 "No available workers"; both seen on loopback).
- Limits per key: requests per minute and requests at once; beyond them 429 with Retry-After.
- Refusals are each API's own error shape: Anthropic's for /v1/messages, OpenAI's elsewhere.
- Aliases: a request's "model" that is an alias is sent on as the served name it stands for (vllm-router routes
  by the served name alone).
- /v1/models answers in OpenAI's list shape (vllm-router 0.1.17 answers {"models": [...]}), aliases included.
- Usage by key name on its own metrics port: requests by API and status, prompt and completion tokens read from
  the answers (JSON or streamed) of the chat, completion, Responses and Anthropic Messages APIs. A chat or
  completion stream that does not ask for its usage (stream_options.include_usage) is sent on asking for it, and
  that usage event is kept from the client.
- The log names the key, never shows it.

  FLEET_SPARK_KEY=... fleet_gate.py --listen 127.0.0.1:18081 --upstream http://127.0.0.1:18080 \
      --keys /etc/sparkfleet/gate/keys.json --metrics 127.0.0.1:29001
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

log = logging.getLogger("fleet_gate")

# Headers that belong to one connection (RFC 9110 7.6.1), and the client's own key headers: none goes upstream.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
}
CLIENT_KEY_HEADERS = {"authorization", "x-api-key"}
# The paths the gate serves, as HAProxy's front allows them (templates/etc/haproxy/haproxy.cfg.j2; a unit test
# holds the two equal): /v1/ and path segments of letters, digits, "_", "~", "-" and "." (none starting with "."),
# so no "..", no "//", no percent-encoding. Everything else, vllm-router's keyless admin API (/workers, /add_worker,
# ...) first of all, is refused with 403, even on a loopback endpoint where no HAProxy stands in front.
API_PATH = re.compile(r"^/v1(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+$")
# The one path that needs no key: the fleet's health, GET or HEAD, sent on without a body or a key.
HEALTH_PATH = "/health"
# The API a path belongs to, for the usage metrics and the error shape.
APIS = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
    ("/v1/responses", "responses"),
    ("/v1/messages", "messages"),
    ("/v1/embeddings", "embeddings"),
    ("/v1/models", "models"),
)
RELOAD_EVERY_S = 1.0
# Paths the gate sends to a Spark itself (see the docstring), and how long it keeps vllm-router's worker list.
DIRECT_PREFIXES = ("/v1/messages", "/v1/responses")
WORKERS_EVERY_S = 1.0
# The environment variable that holds the key the Sparks check.
SPARK_KEY_VARIABLE = "FLEET_SPARK_KEY"
WINDOW_S = 60.0


def api_of(path: str) -> str:
    for prefix, name in APIS:
        if path == prefix or path.startswith(prefix + "/"):
            return name
    return "other"


def is_model_list(request: web.Request) -> bool:
    """GET /v1/models itself (not /v1/models/{id}, which goes to the router as it is)."""
    return request.method == "GET" and request.path == "/v1/models"


def error_body(api: str, status: int, message: str) -> dict:
    """An error in the shape the client's API uses (OpenAI's, or Anthropic's for /v1/messages)."""
    if api == "messages":
        kind = {401: "authentication_error", 429: "rate_limit_error", 400: "invalid_request_error"}.get(
            status, "api_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    kind = {401: "invalid_request_error", 429: "rate_limit_error"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def refuse(api: str, status: int, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response(error_body(api, status, message), status=status, headers=headers)


# --- keys --------------------------------------------------------------------------------------------------------


@dataclass
class Key:
    name: str
    requests_per_minute: int  # 0: no limit
    concurrent: int  # 0: no limit


@dataclass
class KeyState:
    """What the gate counts for one key name; kept across reloads of the keys file."""

    started: collections.deque = field(default_factory=collections.deque)  # monotonic times in the last minute
    in_flight: int = 0


@dataclass
class Config:
    keys_by_hash: dict[str, Key]
    aliases: dict[str, str]


def parse_config(text: str) -> Config:
    """The keys file: {"keys": [{name, sha256, enabled, requests_per_minute, concurrent}], "aliases": {alias: name}}.
    A malformed file raises ValueError; the gate then keeps the last good one."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("keys", []), list):
        raise ValueError('expected {"keys": [...], "aliases": {...}}')
    if not isinstance(data.get("aliases") or {}, dict):
        raise ValueError('"aliases" is not a mapping')
    keys: dict[str, Key] = {}
    for entry in data.get("keys", []):
        if not isinstance(entry, dict):
            raise ValueError(f"a key entry is not a mapping: {type(entry).__name__}")
        digest = str(entry["sha256"]).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"key {entry.get('name')!r}: sha256 is not 64 hex digits")
        if entry.get("enabled", True):
            limits = (int(entry.get("requests_per_minute", 0)), int(entry.get("concurrent", 0)))
            keys[digest] = Key(str(entry["name"]), *limits)
    aliases = {str(alias): str(name) for alias, name in (data.get("aliases") or {}).items()}
    return Config(keys, aliases)


class KeysFile:
    """The keys file, read again when its modification time or size changes (checked at most once a second)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: tuple[int, int, int] | None = None
        self.checked = 0.0
        self.config = Config({}, {})
        self.reload(force=True)

    def reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.checked < RELOAD_EVERY_S:
            return
        self.checked = now
        try:
            handle = open(self.path, encoding="utf-8")  # noqa: SIM115 -- closed below, after fstat and read
        except OSError as error:
            log.error("keys file %s: %s; every key is refused until it is back", self.path, error)
            self.config, self.seen = Config({}, {}), None
            return
        with handle:
            # The file as opened (the role replaces it by a rename): its inode, modification time and size.
            stat = os.fstat(handle.fileno())
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen == self.seen:
                return
            try:
                self.config = parse_config(handle.read())
            except Exception as error:  # any damage: the last good keys stay, and the log says why
                log.error("keys file %s: %s; the last good keys stay", self.path, error)
                return
        self.seen = seen
        names = sorted(key.name for key in self.config.keys_by_hash.values())
        log.info(
            "keys file %s: %d keys enabled (%s), %d aliases",
            self.path,
            len(names),
            ", ".join(names),
            len(self.config.aliases),
        )


def client_key(request: web.Request) -> str | None:
    """The key a client sent: Authorization: Bearer KEY, else x-api-key: KEY."""
    bearer = request.headers.get("authorization", "")
    scheme, _, value = bearer.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


def digest_of(secret: str) -> str:
    """SHA-256 of a key as the keys file holds it; a key that is not UTF-8 text matches none."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


# --- usage -------------------------------------------------------------------------------------------------------


def usage_of(message: dict) -> tuple[int, int]:
    """(prompt, completion) tokens in one JSON answer or stream event of the four APIs (0 where there are none)."""
    if not isinstance(message, dict):
        return 0, 0
    kind = message.get("type")
    if kind == "message_start":  # Anthropic stream: the input at the start
        usage = (message.get("message") or {}).get("usage") or {}
        return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    if kind == "message_delta":  # Anthropic stream: the output so far, cumulative, in the last delta
        return 0, 0
    if kind == "response.completed":  # Responses stream
        message = message.get("response") or {}
    usage = message.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    if "prompt_tokens" in usage:  # OpenAI's chat and completions
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    # The Responses API's, and Anthropic's, whose input_tokens leave out the tokens read from or written to a cache.
    cached = sum(int(usage.get(k) or 0) for k in ("cache_read_input_tokens", "cache_creation_input_tokens"))
    return int(usage.get("input_tokens") or 0) + cached, int(usage.get("output_tokens") or 0)


# Chat and completion streams report their usage only when asked (stream_options.include_usage). The gate asks
# where the client did not, counts it, and keeps that one usage event (no choices) from the client, who did not ask.
USAGE_ASKED_APIS = ("chat", "completions")


def asking_for_usage(api: str, body: bytes) -> tuple[bytes, bool]:
    """The body of a chat or completion stream that does not ask for its usage, now asking for it, and whether the
    gate asked (its usage event is then the gate's); any other body unchanged."""
    if api not in USAGE_ASKED_APIS or not body.lstrip().startswith(b"{"):
        return body, False
    try:
        data = json.loads(body)
    except ValueError:
        return body, False
    if not isinstance(data, dict) or data.get("stream") is not True:
        return body, False
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or options.get("include_usage"):
        return body, False
    data["stream_options"] = {**options, "include_usage": True}
    return json.dumps(data).encode(), True


class HiddenUsage:
    """Passes a stream on event by event, without the usage-only event (`"choices": []` and a usage) that the gate
    asked for on the client's behalf."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        self.buffer += chunk
        *events, self.buffer = self.buffer.split(b"\n\n")
        return b"".join(event + b"\n\n" for event in events if not self.usage_only(event))

    def end(self) -> bytes:
        rest, self.buffer = self.buffer, b""
        return b"" if self.usage_only(rest) else rest

    @staticmethod
    def usage_only(event: bytes) -> bool:
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return False
        try:
            data = json.loads(payload[5:].strip())
        except ValueError:
            return False
        return isinstance(data, dict) and data.get("choices") == [] and isinstance(data.get("usage"), dict)


class StreamUsage:
    """Counts tokens in a server-sent event stream as it passes, without changing a byte of it. Each usage an
    OpenAI-style stream reports is the total so far (one at the end with stream_options.include_usage, one per
    chunk with continuous_usage_stats), so the last one counts; Anthropic's stream gives the input in
    message_start and the output so far in each message_delta."""

    def __init__(self) -> None:
        self.buffer = b""
        self.prompt = 0
        self.completion = 0
        self.anthropic_output = 0

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.line(line.rstrip(b"\r"))

    def line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload.startswith(b"{"):
            return
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if isinstance(event, dict) and event.get("type") == "message_delta":
            output = int((event.get("usage") or {}).get("output_tokens") or 0)
            self.anthropic_output = max(self.anthropic_output, output)
            return
        prompt, completion = usage_of(event)
        if isinstance(event, dict) and event.get("type") == "message_start":
            self.prompt, self.anthropic_output = prompt, max(self.anthropic_output, completion)
        elif prompt or completion:
            self.prompt, self.completion = prompt, completion

    def totals(self) -> tuple[int, int]:
        if self.buffer:
            self.line(self.buffer.rstrip(b"\r"))
            self.buffer = b""
        return self.prompt, max(self.completion, self.anthropic_output)


# --- metrics -----------------------------------------------------------------------------------------------------


# The label values of sparkfleet_gate_limited_total: a key's limits.
LIMITS = ("concurrent", "requests_per_minute")


class Metrics:
    """Counters by key name, in Prometheus' text format. They live as long as the process: a keys reload keeps them."""

    def __init__(self) -> None:
        self.requests: collections.Counter = collections.Counter()  # (key, api, status)
        self.tokens: collections.Counter = collections.Counter()  # (key, api, kind)
        self.limited: collections.Counter = collections.Counter()  # (key, limit)

    def render(self, keys: KeysFile, states: dict[str, KeyState]) -> str:
        out = []

        def family(name: str, kind: str, help_text: str, rows: list[tuple[dict, float]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in rows:
                text = ",".join(f'{label}="{escape(str(v))}"' for label, v in labels.items())
                out.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

        family(
            "sparkfleet_gate_requests_total",
            "counter",
            "Requests through the gate by key name, API and status.",
            [({"key": k, "api": a, "status": s}, v) for (k, a, s), v in sorted(self.requests.items())],
        )
        family(
            "sparkfleet_gate_prompt_tokens_total",
            "counter",
            "Prompt (input) tokens by key name and API.",
            [({"key": k, "api": a}, v) for (k, a, t), v in sorted(self.tokens.items()) if t == "prompt"],
        )
        family(
            "sparkfleet_gate_completion_tokens_total",
            "counter",
            "Completion (output) tokens by key name and API.",
            [({"key": k, "api": a}, v) for (k, a, t), v in sorted(self.tokens.items()) if t == "completion"],
        )
        enabled = {key.name: key for key in keys.config.keys_by_hash.values()}
        # Every enabled key's refusals from 0, so that Prometheus sees its first 429 as an increase (a series that
        # begins at 1 has none) and the alert for a key at its limit fires on the first burst.
        limited = {(name, limit): 0 for name in enabled for limit in LIMITS} | dict(self.limited)
        family(
            "sparkfleet_gate_limited_total",
            "counter",
            "Requests refused with 429 by key name and limit.",
            [({"key": k, "limit": lim}, v) for (k, lim), v in sorted(limited.items())],
        )
        family(
            "sparkfleet_gate_in_flight",
            "gauge",
            "Requests being served, by key name.",
            [({"key": name}, states[name].in_flight if name in states else 0) for name in sorted(enabled)],
        )
        family(
            "sparkfleet_gate_limit_concurrent",
            "gauge",
            "Each enabled key's limit on requests at once (0: none).",
            [({"key": name}, enabled[name].concurrent) for name in sorted(enabled)],
        )
        family(
            "sparkfleet_gate_limit_requests_per_minute",
            "gauge",
            "Each enabled key's limit on requests per minute (0: none).",
            [({"key": name}, enabled[name].requests_per_minute) for name in sorted(enabled)],
        )
        family("sparkfleet_gate_keys_enabled", "gauge", "Keys the gate accepts now.", [({}, len(enabled))])
        return "\n".join(out) + "\n"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# --- the gate ----------------------------------------------------------------------------------------------------


class Gate:
    def __init__(self, upstream: str, keys: KeysFile, upstream_key: str | None, timeout_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.keys = keys
        self.upstream_key = upstream_key
        self.timeout = ClientTimeout(total=timeout_s, sock_connect=10)
        self.states: dict[str, KeyState] = collections.defaultdict(KeyState)
        self.metrics = Metrics()
        self.session: ClientSession | None = None
        self.workers: list[dict] = []
        self.workers_read = 0.0
        self.worker_load: collections.Counter = collections.Counter()  # requests the gate sent each worker URL

    async def start(self, _app: web.Application) -> None:
        # No cap on connections to the router and the Sparks (aiohttp's default is 100): the keys' limits are the caps.
        connector = TCPConnector(limit=0)
        self.session = ClientSession(connector=connector, timeout=self.timeout, auto_decompress=False)

    async def stop(self, _app: web.Application) -> None:
        if self.session:
            await self.session.close()

    def admit(self, key: Key, api: str) -> web.Response | None:
        """None when the key may send one more request now, else the 429."""
        state = self.states[key.name]
        now = time.monotonic()
        while state.started and now - state.started[0] >= WINDOW_S:
            state.started.popleft()
        if key.concurrent and state.in_flight >= key.concurrent:
            self.metrics.limited[(key.name, "concurrent")] += 1
            return refuse(api, 429, f"key {key.name}: {key.concurrent} requests at once at most", retry_after=1)
        if key.requests_per_minute and len(state.started) >= key.requests_per_minute:
            self.metrics.limited[(key.name, "requests_per_minute")] += 1
            wait = max(1, int(WINDOW_S - (now - state.started[0])) + 1)
            return refuse(api, 429, f"key {key.name}: {key.requests_per_minute} requests a minute at most", wait)
        state.started.append(now)
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        api = api_of(request.path)
        if request.raw_path.split("?", 1)[0] == HEALTH_PATH and request.method in ("GET", "HEAD"):
            return await self.health(request)
        if not API_PATH.match(request.raw_path.split("?", 1)[0]):
            return refuse(api, 403, "Only the OpenAI and Anthropic APIs (/v1/...) and /health are served here.")
        self.keys.reload()
        secret = client_key(request)
        key = self.keys.config.keys_by_hash.get(digest_of(secret)) if secret else None
        if key is None:
            self.metrics.requests[("-", api, "401")] += 1
            log.warning("%s %s 401 key=- (%s)", request.method, request.path, "unknown key" if secret else "no key")
            return refuse(api, 401, "A valid API key is required (Authorization: Bearer KEY or x-api-key: KEY).")
        refused = self.admit(key, api)
        if refused is not None:
            self.metrics.requests[(key.name, api, "429")] += 1
            log.warning("%s %s 429 key=%s", request.method, request.path, key.name)
            return refused
        state = self.states[key.name]
        state.in_flight += 1
        try:
            body, hide_usage = asking_for_usage(api, self.with_served_name(await request.read()))
            if is_model_list(request):
                return await self.models(request, key)
            return await self.forward(request, api, key, body, hide_usage)
        finally:
            state.in_flight -= 1

    def with_served_name(self, body: bytes) -> bytes:
        """The body with an aliased "model" replaced by the served name it stands for; any other body unchanged."""
        aliases = self.keys.config.aliases
        if not aliases or not body.lstrip().startswith(b"{"):
            return body
        try:
            data = json.loads(body)
        except ValueError:
            return body
        if isinstance(data, dict) and isinstance(data.get("model"), str) and data["model"] in aliases:
            data["model"] = aliases[data["model"]]
            return json.dumps(data).encode()
        return body

    def upstream_headers(self, request: web.Request) -> dict[str, str]:
        listed = {name.strip().lower() for name in request.headers.get("connection", "").split(",")}
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in HOP_BY_HOP | CLIENT_KEY_HEADERS | listed
        }
        if self.upstream_key:
            headers["Authorization"] = f"Bearer {self.upstream_key}"
        return headers

    async def health(self, request: web.Request) -> web.Response:
        """vllm-router's /health, asked without a body or a key."""
        try:
            async with self.session.get(self.upstream + HEALTH_PATH, timeout=ClientTimeout(total=10)) as answer:
                return web.Response(status=answer.status, text=await answer.text())
        except (TimeoutError, OSError, ClientError):
            return web.Response(status=503, text="the fleet's router does not answer")

    async def worker_for(self, model: str) -> str | None:
        """The healthy worker of vllm-router's list serving `model` that the gate has the fewest requests on."""
        if time.monotonic() - self.workers_read > WORKERS_EVERY_S:
            async with self.session.get(self.upstream + "/workers", timeout=ClientTimeout(total=10)) as answer:
                listed = await answer.json() if answer.status == 200 else {}
            workers = listed.get("workers") if isinstance(listed, dict) else None
            self.workers = [w for w in workers or [] if isinstance(w, dict) and isinstance(w.get("url"), str)]
            self.workers_read = time.monotonic()
        urls = [w["url"] for w in self.workers if w.get("model_id") == model and w.get("is_healthy")]
        return min(urls, key=lambda url: self.worker_load[url]) if urls else None

    async def target(self, request: web.Request, api: str, body: bytes) -> tuple[str, web.Response | None]:
        """The base URL a request goes to (vllm-router, or a Spark for the agents' paths), or the refusal."""
        if not request.path.startswith(DIRECT_PREFIXES) or request.method != "POST":
            return self.upstream, None
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            model = None
        if not isinstance(model, str):
            return "", refuse(api, 400, 'The request names no "model".')
        worker = await self.worker_for(model)
        if worker is None:
            return "", refuse(api, 503, f"No Spark serves {model} now.")
        return worker.rstrip("/"), None

    async def forward(
        self, request: web.Request, api: str, key: Key | None, body: bytes, hide_usage: bool = False
    ) -> web.StreamResponse:
        name = key.name if key else ""
        try:
            base, refused = await self.target(request, api, body)
        except (TimeoutError, OSError, ValueError, ClientError) as error:
            base, refused = "", self.unanswered(request, api, name, error)
        if refused is not None:
            self.metrics.requests[(name, api, str(refused.status))] += 1
            return refused
        self.worker_load[base] += 1
        try:
            return await self.relay(request, api, name, base, body, hide_usage)
        finally:
            self.worker_load[base] -= 1

    def unanswered(self, request: web.Request, api: str, name: str, error: Exception) -> web.Response:
        log.error("%s %s 502 key=%s (%s)", request.method, request.path, name or "-", error)
        return refuse(api, 502, "The fleet's router or Spark did not answer.")

    async def relay(
        self, request: web.Request, api: str, name: str, base: str, body: bytes, hide_usage: bool = False
    ) -> web.StreamResponse:
        """The request sent to `base`, its answer streamed back as it comes, its usage counted (HIDE_USAGE: the usage
        event the gate asked for kept from the client). A failure before the answer starts is a 502; one after it
        cuts the stream, as the Spark's own failure would."""
        try:
            upstream = await self.session.request(
                request.method,
                base + request.rel_url.raw_path_qs,
                headers=self.upstream_headers(request),
                data=body or None,
                allow_redirects=False,
            )
        except (TimeoutError, OSError, ClientError) as error:
            self.metrics.requests[(name, api, "502")] += 1
            return self.unanswered(request, api, name, error)
        async with upstream:
            response = web.StreamResponse(status=upstream.status)
            for header, value in upstream.headers.items():
                if header.lower() not in HOP_BY_HOP:
                    response.headers.add(header, value)
            await response.prepare(request)
            counter = StreamUsage() if "text/event-stream" in upstream.headers.get("content-type", "") else None
            hidden = HiddenUsage() if hide_usage and counter is not None else None
            whole = bytearray()
            try:
                async for chunk in upstream.content.iter_any():
                    if counter is not None:
                        counter.feed(chunk)
                    elif len(whole) < 16 * 1024 * 1024:
                        whole += chunk
                    passed = hidden.feed(chunk) if hidden is not None else chunk
                    if passed:
                        await response.write(passed)
                if hidden is not None and (rest := hidden.end()):
                    await response.write(rest)
                await response.write_eof()
            except ConnectionResetError:  # the client went away: nothing more to send it
                log.info("%s %s: the client closed the connection key=%s", request.method, request.path, name or "-")
                return response
            finally:
                self.count(name, api, upstream.status, counter, bytes(whole))
            if name:
                log.info("%s %s %d key=%s", request.method, request.path, upstream.status, name)
            return response

    def count(self, name: str, api: str, status: int, counter: StreamUsage | None, whole: bytes) -> None:
        if not name:  # an open path (/health): no key to count it for
            return
        self.metrics.requests[(name, api, str(status))] += 1
        if counter is not None:
            prompt, completion = counter.totals()
        else:
            try:
                prompt, completion = usage_of(json.loads(whole)) if whole[:1] == b"{" else (0, 0)
            except ValueError:
                prompt, completion = 0, 0
        if prompt or completion:
            self.metrics.tokens[(name, api, "prompt")] += prompt
            self.metrics.tokens[(name, api, "completion")] += completion

    async def models(self, request: web.Request, key: Key) -> web.Response:
        """The router's model list in OpenAI's shape, with the aliases as models of their own."""
        try:
            async with self.session.get(self.upstream + "/v1/models", headers=self.upstream_headers(request)) as answer:
                status, text = answer.status, await answer.text()
        except (TimeoutError, OSError, ClientError) as error:
            self.metrics.requests[(key.name, "models", "502")] += 1
            return self.unanswered(request, "models", key.name, error)
        self.metrics.requests[(key.name, "models", str(status))] += 1
        if status != 200:
            return web.Response(status=status, text=text, content_type="application/json")
        try:
            served = served_names(json.loads(text))
        except ValueError:
            served = []
        aliases = {alias: name for alias, name in self.keys.config.aliases.items() if name in served}
        now = int(time.time())
        data = [{"id": name, "object": "model", "created": now, "owned_by": "sparkfleet"} for name in served]
        data += [
            {"id": alias, "object": "model", "created": now, "owned_by": "sparkfleet", "root": name}
            for alias, name in sorted(aliases.items())
        ]
        return web.json_response({"object": "list", "data": data})

    async def metrics_page(self, _request: web.Request) -> web.Response:
        self.keys.reload()
        return web.Response(text=self.metrics.render(self.keys, self.states), content_type="text/plain")


def served_names(answer: object) -> list[str]:
    """Model names in a model list: OpenAI's {"data": [{"id"}]} or vllm-router's {"models": [...]}."""
    if not isinstance(answer, dict):
        return []
    rows = answer.get("data") if isinstance(answer.get("data"), list) else answer.get("models") or []
    names = []
    for row in rows:
        name = (row.get("id") or row.get("model_id") or row.get("name")) if isinstance(row, dict) else row
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, type=address, help="HOST:PORT the gate serves the API on")
    parser.add_argument("--upstream", required=True, help="base URL of vllm-router, e.g. http://127.0.0.1:18080")
    parser.add_argument("--keys", required=True, help="the keys file (names, SHA-256 of each key, limits)")
    parser.add_argument("--metrics", type=address, help="HOST:PORT of the usage metrics (/metrics)")
    parser.add_argument("--timeout-s", type=float, default=1800, help="longest a request may take")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    gate = Gate(args.upstream, KeysFile(args.keys), os.environ.get(SPARK_KEY_VARIABLE) or None, args.timeout_s)
    asyncio.run(serve(gate, args.listen, args.metrics))


async def serve(gate: Gate, listen: tuple[str, int], metrics: tuple[str, int] | None) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(gate.start)
    app.on_cleanup.append(gate.stop)
    app.router.add_route("*", "/{tail:.*}", gate.handle)
    # A client that goes away cancels its handler: its slot is freed and the Spark's request is closed with it.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, *listen).start()
    if metrics:
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", gate.metrics_page)
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, *metrics).start()
    log.info("serving on %s:%d in front of %s", *listen, gate.upstream)
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
