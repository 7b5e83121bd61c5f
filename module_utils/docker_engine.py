"""A tiny client for the Docker Engine API over its unix socket, standard library only.

The docker_pull module needs three calls (inspect an image, pull it with a streamed answer, read an error), so
this is http.client on an AF_UNIX socket rather than a dependency on the Docker SDK for Python on every Spark.
Paths are pinned to API v1.41 (Docker 20.10, the oldest engine DGX OS ships); newer engines still answer it.

Nothing here imports Ansible, so pytest calls these functions directly.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterable, Iterator
from urllib.parse import quote, urlencode

API_PREFIX = "/v1.41"
DEFAULT_SOCKET = "/var/run/docker.sock"
# Seconds to connect and to get a short answer such as an image inspect.
REQUEST_TIMEOUT = 60
# Seconds the pull stream may stay silent before we give up. A pull reports progress several times a second
# while bytes move; only a registry or a daemon that has stopped answering is silent this long.
STREAM_IDLE_TIMEOUT = 1800


class DockerEngineError(Exception):
    """The Docker Engine could not be reached, or answered with an error.

    status is the HTTP status (None when there was no answer at all); message is the engine's own words.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _UnixHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, connected to a unix socket instead of a TCP port."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def api_path(path: str, query: dict[str, str] | None = None) -> str:
    """'/images/create', {'fromImage': 'x'} -> '/v1.41/images/create?fromImage=x'."""
    return API_PREFIX + path + ("?" + urlencode(query) if query else "")


def image_path(reference: str, suffix: str = "/json") -> str:
    """The API path of an image: 'registry:5000/a/b@sha256:...' -> '/v1.41/images/registry:5000/a/b@sha256:.../json'.

    The engine routes /images/{name:.*}/json, so the slashes of a repository stay as they are.
    """
    return api_path("/images/" + quote(reference, safe="/:@") + suffix)


def error_message(body: bytes, status: int) -> str:
    """The engine's words from an error answer ({"message": "..."}), or the raw body when it is not JSON."""
    text = body.decode("utf-8", "replace").strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("message"):
        return str(decoded["message"])
    return text or f"HTTP {status} with an empty answer"


def _open(socket_path: str, method: str, path: str, timeout: float) -> tuple[_UnixHTTPConnection, object]:
    connection = _UnixHTTPConnection(socket_path, timeout)
    try:
        connection.request(method, path, headers={"Content-Type": "application/json"})
        return connection, connection.getresponse()
    except FileNotFoundError as error:
        connection.close()
        raise DockerEngineError(f"the Docker socket {socket_path} does not exist ({error.strerror})") from error
    except PermissionError as error:
        connection.close()
        raise DockerEngineError(f"no permission to use the Docker socket {socket_path} ({error.strerror})") from error
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        raise DockerEngineError(
            f"the Docker Engine at {socket_path} did not answer {method} {path}: {error}"
        ) from error


def request_json(
    method: str, path: str, socket_path: str = DEFAULT_SOCKET, timeout: float = REQUEST_TIMEOUT
) -> tuple[int, object]:
    """One request with a short JSON answer: (HTTP status, decoded body or None).

    Only a failure to talk to the engine raises; an HTTP error status is returned for the caller to judge
    (404 from an image inspect means "not here", not a failure). The body of an error status is
    {"message": ...} as the engine sends it.
    """
    connection, response = _open(socket_path, method, path, timeout)
    try:
        body = response.read()
    except (OSError, http.client.HTTPException) as error:
        raise DockerEngineError(
            f"the Docker Engine at {socket_path} broke off its answer to {path}: {error}"
        ) from error
    finally:
        connection.close()
    if not body.strip():
        return response.status, None
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, {"message": error_message(body, response.status)}


def decode_json_stream(chunks: Iterable[bytes]) -> Iterator[dict]:
    """Decode the engine's progress stream: one JSON object per CRLF-ended line, split across chunks anyhow.

    Objects are yielded as soon as their line is complete; blank lines are skipped; several objects on one
    line are all decoded; a line that is not JSON is yielded as {"error": ...} so a broken stream ends the pull
    with words instead of a traceback.
    """
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield from _decode_line(line)
    yield from _decode_line(pending)


def _decode_line(raw: bytes) -> Iterator[dict]:
    text = raw.decode("utf-8", "replace").strip()
    decoder = json.JSONDecoder()
    while text:
        try:
            event, end = decoder.raw_decode(text)
        except ValueError:
            yield {"error": f"the Docker Engine sent something that is not JSON: {text[:200]!r}"}
            return
        yield event if isinstance(event, dict) else {"status": str(event)}
        text = text[end:].lstrip()


def stream_json(
    method: str, path: str, socket_path: str = DEFAULT_SOCKET, idle_timeout: float = STREAM_IDLE_TIMEOUT
) -> Iterator[dict]:
    """A request whose answer is a stream of JSON messages (a pull): yields each message as a dict.

    Raises DockerEngineError when the engine cannot be reached, answers with an HTTP error (the engine reports
    a failure that happens before any progress, such as "manifest unknown", this way), stays silent for
    idle_timeout seconds, or breaks the connection.
    """
    connection, response = _open(socket_path, method, path, idle_timeout)
    try:
        if response.status >= 400:
            raise DockerEngineError(error_message(response.read(), response.status), response.status)
        yield from decode_json_stream(_chunks(response, socket_path, idle_timeout))
    finally:
        connection.close()


def _chunks(response, socket_path: str, idle_timeout: float) -> Iterator[bytes]:
    while True:
        try:
            chunk = response.read1(65536)
        except TimeoutError as error:
            raise DockerEngineError(
                f"the Docker Engine at {socket_path} sent no progress for {int(idle_timeout)} seconds"
            ) from error
        except (OSError, http.client.HTTPException) as error:
            raise DockerEngineError(f"the Docker Engine at {socket_path} broke off the stream: {error}") from error
        if not chunk:
            return
        yield chunk
