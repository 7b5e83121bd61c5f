"""The few Hugging Face Hub calls hf_model_figures makes, with urllib (standard library only): a revision resolved
to a commit, the top of a repository's tree listed, a small file read, and byte ranges of a large one. The token is
sent only to the endpoint's own origin, never to the storage host the Hub redirects weight files to. Every failure
is a HubError whose message says what failed and what to do.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.input_rules import hf_commit

NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
USER_AGENT = "sparkfleet-hf_model_figures/1 (python urllib)"
MAX_JSON_BYTES = 64 * 1024 * 1024


class HubError(Exception):
    """A Hub answer that stops the run; the message says what failed and what to do."""


def origin(url: str) -> tuple[str, str]:
    """(scheme, host:port) of a URL, with the default port made explicit: the token goes only to this origin."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), f"{(parts.hostname or '').lower()}:{port}"


class TokenOnlyToEndpoint(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does (the Range header goes along; the Authorization header, added as an
    unredirected header, does not), and adds the token again only when the redirect stays on the endpoint."""

    def __init__(self, endpoint_origin: tuple[str, str], token: str | None):
        super().__init__()
        self.endpoint_origin = endpoint_origin
        self.token = token

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.token and origin(newurl) == self.endpoint_origin:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


class Hub:
    """The few Hub calls this module makes, with urllib (standard library only)."""

    def __init__(self, endpoint: str, repo_id: str, revision: str, token: str | None, timeout_s: float):
        self.endpoint = endpoint.rstrip("/")
        self.repo_id = repo_id
        self.revision = revision
        self.token = token or None
        self.timeout_s = timeout_s
        self.endpoint_origin = origin(self.endpoint)
        self.opener = urllib.request.build_opener(TokenOnlyToEndpoint(self.endpoint_origin, self.token))
        self.bytes_read = 0
        self.lock = threading.Lock()

    # --- plumbing

    def _request(self, url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
        if self.token and origin(url) == self.endpoint_origin:
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def _open(self, url: str, what: str, headers: dict[str, str] | None = None):
        try:
            return self.opener.open(self._request(url, headers), timeout=self.timeout_s)
        except urllib.error.HTTPError as error:
            raise self._hub_error(error, what) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise HubError(
                f"{what}: {self.endpoint} did not answer ({reason}); check endpoint and the network"
            ) from None

    def _hub_error(self, error: urllib.error.HTTPError, what: str) -> HubError:
        """The Hub's answer as something a person can act on (the Hub's X-Error-Code / X-Error-Message)."""
        code = error.headers.get("X-Error-Code") if error.headers else None
        message = (error.headers.get("X-Error-Message") if error.headers else None) or error.reason
        where = f"{self.repo_id}@{self.revision} on {self.endpoint}"
        if code == "RepoNotFound":
            if self.token:
                return HubError(
                    f"{self.repo_id} was not found on {self.endpoint}, or the token given has no access to it; "
                    "check repo_id and the token's permissions"
                )
            return HubError(
                f"{self.repo_id} was not found on {self.endpoint} (or it is private or gated and no token was "
                "given); check repo_id, or give a token"
            )
        if code == "RevisionNotFound":
            return HubError(f"revision {self.revision!r} does not exist in {self.repo_id}; check the revision")
        if code == "GatedRepo" or error.code == 403:
            return HubError(f"{where} is gated: accept its licence on the Hub with the token's account, then rerun")
        if error.code == 401:
            if self.token:
                return HubError(
                    f"{where} refused the token (HTTP 401: {message}): it is invalid or expired; give a valid "
                    "Hugging Face token"
                )
            return HubError(f"{where} asks for a token (HTTP 401: {message}); give one")
        if code == "EntryNotFound":
            return HubError(f"{what}: the file is not in {self.repo_id} at that commit (HTTP 404)")
        return HubError(f"{what} failed: HTTP {error.code} {message}")

    def _count(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_read += nbytes

    # --- calls

    def api_json(self, path: str, what: str) -> tuple[object, dict[str, str]]:
        """A JSON answer of the API, with its headers."""
        with self._open(path if "://" in path else f"{self.endpoint}{path}", what) as answer:
            body = answer.read(MAX_JSON_BYTES + 1)
            headers = dict(answer.headers.items())
        if len(body) > MAX_JSON_BYTES:
            raise HubError(f"{what}: an answer of more than {MAX_JSON_BYTES:,} bytes")
        try:
            return json.loads(body.decode("utf-8")), headers
        except (UnicodeDecodeError, ValueError) as error:
            raise HubError(f"{what}: the answer is not JSON ({error})") from None

    def commit(self) -> str:
        """The commit the revision names (GET /api/models/REPO/revision/REV, as huggingface_hub's model_info)."""
        revision = urllib.parse.quote(self.revision, safe="")
        info, _ = self.api_json(f"/api/models/{self.repo_id}/revision/{revision}", f"resolving {self.revision!r}")
        sha = info.get("sha") if isinstance(info, dict) else None
        if hf_commit(sha) is not None:
            raise HubError(f"resolving {self.revision!r}: the Hub's answer has no commit sha")
        return sha

    def top_files(self, commit: str) -> list[dict]:
        """The entries at the top of the repo at COMMIT (GET /api/models/REPO/tree/COMMIT), following pages."""
        url: str | None = f"{self.endpoint}/api/models/{self.repo_id}/tree/{commit}"
        entries: list[dict] = []
        while url:
            page, headers = self.api_json(url, f"listing {self.repo_id} at {commit}")
            if not isinstance(page, list):
                raise HubError(f"listing {self.repo_id} at {commit}: the answer is not a list")
            entries += [entry for entry in page if isinstance(entry, dict) and isinstance(entry.get("path"), str)]
            link = next((value for name, value in headers.items() if name.lower() == "link"), "")
            match = NEXT_LINK.search(link)
            url = urllib.parse.urljoin(url, match.group(1)) if match else None
        return entries

    def file(self, commit: str, path: str) -> bytes:
        """A small file of the repo at COMMIT."""
        url = f"{self.endpoint}/{self.repo_id}/resolve/{commit}/{urllib.parse.quote(path)}"
        with self._open(url, f"reading {path}") as answer:
            body = answer.read(MAX_JSON_BYTES + 1)
        if len(body) > MAX_JSON_BYTES:
            raise HubError(f"reading {path}: more than {MAX_JSON_BYTES:,} bytes, not a config file")
        return body

    def byte_range(self, commit: str, path: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of a file: a Range request, redirects followed with the Range resent.
        A server that ignores Range is read only as far as needed."""
        url = f"{self.endpoint}/{self.repo_id}/resolve/{commit}/{urllib.parse.quote(path)}"
        what = f"reading bytes {start}-{start + length - 1} of {path}"
        with self._open(url, what, {"Range": f"bytes={start}-{start + length - 1}"}) as answer:
            if answer.status == 206:
                content_range = answer.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise HubError(f"{what}: the server answered another range ({content_range!r})")
                data = answer.read(length)
            else:
                data = answer.read(start + length)[start:]
        self._count(len(data))
        if len(data) != length:
            raise HubError(
                f"{what}: the answer ended after {len(data)} bytes; the file is shorter than its header says"
            )
        return data
