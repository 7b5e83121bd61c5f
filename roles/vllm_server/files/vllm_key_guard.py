"""sparkfleet's key guard for `vllm serve`: the API key on every path but a few that only report the server's state.

vLLM 0.33's own `--api-key` (AuthenticationMiddleware, vllm/entrypoints/serve/middleware/authenticate.py) guards
paths under /v1, /v2, /inference and /cohere only. A server listening beyond loopback then answers /pooling,
/classify, /score, /rerank, /tokenize and /detokenize to anyone (a pooling model's whole API is on those paths).
This middleware, loaded with `--middleware vllm_key_guard.KeyOnEveryPath` (vLLM imports it and calls
`app.add_middleware(KeyOnEveryPath)`), refuses every request without the key except those to OPEN_PATHS.

The key is vLLM's own: the environment's VLLM_API_KEY, which sparkfleet's unit sets from its root-only secrets file.
With no key set it refuses every guarded request (it fails closed). Requests are checked as vLLM's middleware checks
them: `Authorization: Bearer KEY`, the key compared by its SHA-256 in constant time; OPTIONS passes; a refusal is
vLLM's own 401 answer, {"error": "Unauthorized"}.

Standalone on purpose: the file is mounted read-only into the vLLM container and imported there, by the image's
Python, so it uses the standard library and ASGI alone. Installed and mounted by the vllm_server role
(module_utils/key_guard.py says where)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets

# Paths that answer without the key: liveness, the version and Prometheus' scrape. None of them runs the model.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})

UNAUTHORIZED_BODY = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode()  # as Starlette writes it


def key_hashes(environ: dict[str, str] | None = None) -> list[bytes]:
    """The SHA-256 of each key the server takes: vLLM's VLLM_API_KEY (one key), none when it is unset or empty."""
    key = (os.environ if environ is None else environ).get("VLLM_API_KEY", "")
    return [hashlib.sha256(key.encode()).digest()] if key else []


class KeyOnEveryPath:
    """ASGI middleware: a request to any path but OPEN_PATHS needs `Authorization: Bearer KEY`."""

    def __init__(self, app, environ: dict[str, str] | None = None) -> None:
        self.app = app
        self.hashes = key_hashes(environ)

    def authorized(self, method: str, path: str, authorization: str | None) -> bool:
        """Whether a request passes: OPTIONS and OPEN_PATHS always, any other with a Bearer token that is a key."""
        if method == "OPTIONS" or path in OPEN_PATHS:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        matched = False
        for known in self.hashes:
            matched |= secrets.compare_digest(digest, known)
        return matched

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if self.authorized(scope.get("method", "GET"), path, _header(scope, b"authorization")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Refused before the handshake is accepted: the client sees a 403, as Starlette answers one.
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(UNAUTHORIZED_BODY)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})


def _header(scope, name: bytes) -> str | None:
    """The first value of header NAME (lower case) in an ASGI scope, decoded as Latin-1 as HTTP headers are."""
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
