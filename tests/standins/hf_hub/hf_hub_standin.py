#!/usr/bin/env python3
"""Stand-in Hugging Face Hub endpoint for the sparkfleet tests. **This is not huggingface.co.**

Tests point the real `huggingface_hub` client (2.x: `HfApi(endpoint=...)`, `hf_hub_download(..., endpoint=...)`,
`snapshot_download`, or `HF_ENDPOINT`) at it, so downloads can be exercised offline, with fixed fixture repos and
with injected network faults. Python standard library only: it runs with a bare Debian `python3` in test containers.

    python3 hf_hub_standin.py --root DIR [--host 127.0.0.1] [--port N]

The first stdout line is `listening on http://HOST:PORT` (flushed; with `--port 0` it tells the port chosen).
Each request is logged as one line on stderr (method, path, status, body bytes); headers are never logged, so
neither is a token.

What it copies, and from where. The client side was read in huggingface_hub 2.4.0 (`file_download.py`:
`hf_hub_url`, `get_hf_file_metadata`, `_get_metadata_or_catch_error`, `http_get`; `hf_api.py`: `model_info`,
`repo_info`, `list_repo_tree`, `RepoFile`/`RepoFolder`/`ModelInfo`; `utils/_http.py`: `hf_raise_for_status`,
`_format`; `utils/_pagination.py`); the server side follows the Hub API docs
(https://huggingface.co/docs/hub/api) and what huggingface.co answers:

- `GET /api/models/ORG/NAME` and `/api/models/ORG/NAME/revision/REV`: model info `{"_id", "id", "modelId",
  "author", "sha", "private", "disabled", "gated", "lastModified", "createdAt", "tags", "downloads", "likes",
  "siblings": [{"rfilename"}]}`; with `?blobs=true` (`files_metadata=True`) each sibling also has `size`, `blobId`
  and `lfs: {"sha256", "size", "pointerSize"}`. `expand`/`securityStatus` are ignored (everything is returned).
- `GET /api/models/ORG/NAME/tree/REV[/PATH]?recursive=true|false`: a JSON list of
  `{"type": "file", "oid", "size", "path"[, "lfs": {"oid": sha256, "size", "pointerSize"}]}` and
  `{"type": "directory", "oid", "size": 0, "path"}` (recursive listings include the directories too). As on the
  Hub, `oid` is the git object id: for an LFS file the id of its git-lfs *pointer* blob, not of the content;
  a directory's oid is its real git tree id. One page, no `Link` header (the Hub pages at 1000 entries; the
  client follows `Link: <...>; rel="next"` when there is one). A PATH that is missing or not a directory: 404
  EntryNotFound. `expand` is ignored.
- `HEAD` / `GET /ORG/NAME/resolve/REV/PATH`: `X-Repo-Commit`, `ETag: "<etag>"`, `Content-Length`,
  `Accept-Ranges: bytes`, `Content-Disposition`; for LFS files also `X-Linked-Etag` and `X-Linked-Size`.
  etag = the sha256 of the content for LFS files, the git blob id of the content otherwise: the client names its
  cache blobs after it (`blobs/<etag>`), preferring `X-Linked-Etag` over `ETag`, and takes the size from
  `X-Linked-Size` or else `Content-Length`. Unlike the Hub, LFS files are served directly (the Hub answers 302 to
  a CDN) unless ROOT/lfs_redirect.json asks for the Hub's redirect (below); no Xet headers are ever sent, so the
  client never tries Xet. `Range: bytes=A-`, `bytes=A-B` and `bytes=-N` give 206 with `Content-Range`; an
  unsatisfiable range gives 416 with `Content-Range: bytes */SIZE`; a multi-range request is answered 200 with the
  whole file.
- Errors carry `X-Error-Code` and `X-Error-Message` headers (the client reads those, HEAD has no body) and a
  JSON `{"error": MESSAGE}` body:
  unknown repo, or a private repo: 401 `RepoNotFound` without a token, 404 `RepoNotFound` with a valid token
  that does not open it (the Hub does not tell "missing" from "private"; both become `RepositoryNotFoundError`);
  a token that no repo knows: 401 `Invalid credentials in Authorization header` with no error code, on every
  endpoint, as the Hub does for a bad token (the client raises a plain `HfHubHTTPError`, status 401);
  unknown revision: 404 `RevisionNotFound` (`RevisionNotFoundError`);
  unknown file: 404 `EntryNotFound` with `X-Repo-Commit` (`RemoteEntryNotFoundError`; the client caches the
  absence under `.no_exist/<commit>/`).

Root layout (written by tests/fixtures/build_hf_models.py, read again at every request):
`ROOT/ORG/NAME/repo.json` = `{"private": bool, "token": "hf_..." | null, "refs": {"main": SHA}}` (optional
`"lastModified"`/`"createdAt"` ISO strings) and the files of each commit under `ROOT/ORG/NAME/SHA/PATH`.
A revision is a ref name from `refs` or a full 40-hex sha that has a directory. A file is LFS when its name ends
in `.safetensors` or `.bin`, or when it is 1 MiB or more. `ROOT/tokens.json` (optional) lists the tokens of
accounts that exist but own nothing: valid for every public repo, as a real account's token is.

Fault injection, for tests only: `ROOT/faults.json`, read at every request (absent = no faults), is a list of
`{"repo": "ORG/NAME", "path": PATH, "kind": "cut" | "flip" | "truncate", "offset": INT, "times": INT (default 1)}`.
A fault applies to GET /resolve responses of that file (any revision) whose byte range [START, END] holds
`offset` (an absolute position in the file); each such response uses up one of `times` (counted in memory,
zeroed by `POST /_standin/reset`); when several faults apply, the first in the list wins. HEAD, model info and
tree listings always tell the truth.
- cut: status, headers and `Content-Length` as for a good response, then only the bytes before `offset` are sent
  and the connection is closed (the client sees the body end early: httpx `RemoteProtocolError`).
- flip: the whole body is sent, with the byte at `offset` XOR 0xFF; sizes, headers and etags unchanged.
- truncate: a well-formed but short response: the body stops before `offset` and `Content-Length` says so
  (`offset - START`); status, `Content-Range`, `ETag`, `X-Linked-Size` and the tree stay truthful.
- stall: like cut, but the server first holds the connection silent for `seconds` (default 30): a download that
  hangs, so that a test can kill the client in the middle of a file.

LFS redirect, for tests only: `ROOT/lfs_redirect.json` = `{"base": "http://localhost:PORT"}`, read at every request
(absent = LFS files are served directly). With it, `GET`/`HEAD /ORG/NAME/resolve/REV/PATH` of an LFS file answers as
the Hub does: `302 Found` with `Location: BASE/_standin/cdn/ORG/NAME/SHA/PATH` (BASE is another host name for this
same server, as the Hub's CDN is another host) and the Hub's `X-Repo-Commit`, `ETag`, `X-Linked-Etag`,
`X-Linked-Size`, no body. `GET`/`HEAD /_standin/cdn/ORG/NAME/SHA/PATH` serves the file like /resolve (ranges, faults,
byte counts) without any access check, as a pre-signed CDN URL does, and counts the requests that arrived with an
`Authorization` header: a client must not send the Hub token to the CDN.

Test controls: `GET /_standin/stats` = `{"bytes_served_total": N, "bytes_served": {"ORG/NAME/PATH": N},
"get_requests": N, "head_requests": N, "range_requests": N, "faults_applied": N, "redirects": N, "cdn_requests": N,
"cdn_requests_with_authorization": N}` (body bytes of /resolve and /_standin/cdn GETs actually written to the
socket; `get_requests`/`head_requests` count the file requests answered 200 or 206, errors and redirects are not
counted; `range_requests` counts the 206 answers; `redirects` the 302 answers of the LFS redirect);
`POST /_standin/reset` zeroes the stats and the fault counters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")
LFS_MIN_SIZE = 1024 * 1024
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
BODY_CHUNK = 1024 * 1024
DEFAULT_DATE = "2025-04-28T00:00:00.000Z"
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
FAULT_KINDS = ("cut", "flip", "truncate", "stall")


class HubError(Exception):
    """An error answered the way the Hub does: status, X-Error-Code (may be None) and X-Error-Message."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


# --- files, hashes and git ids -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileInfo:
    """What the Hub knows of one file at one commit: sizes, git ids and, for LFS files, the sha256."""

    path: str
    disk: Path
    size: int
    git_oid: str  # git blob id of the content (the etag of a non-LFS file)
    sha256: str
    lfs: bool
    pointer_oid: str  # git blob id of the LFS pointer (what git and the Hub's tree list for an LFS file)
    pointer_size: int

    @property
    def tree_oid(self) -> str:
        """The blob id git stores for this path: the pointer's for an LFS file, the content's otherwise."""
        return self.pointer_oid if self.lfs else self.git_oid

    @property
    def etag(self) -> str:
        """The Hub's etag: sha256 for LFS files (X-Linked-Etag), git blob id otherwise."""
        return self.sha256 if self.lfs else self.git_oid


def git_blob_oid(content: bytes) -> str:
    """git's object id of a blob: sha1 over `blob <size>\\0<content>`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file (spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int) -> bool:
    """The stand-in's LFS rule (the fixtures' .gitattributes, in effect): weights and anything of 1 MiB or more."""
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


_HASH_CACHE: dict[tuple[str, int, int], tuple[str, str]] = {}
_HASH_LOCK = threading.Lock()


def file_hashes(disk: Path) -> tuple[str, str]:
    """(git blob id, sha256) of a file, cached on path, size and mtime: shards are hashed once, not per request."""
    stat = disk.stat()
    key = (str(disk), stat.st_size, stat.st_mtime_ns)
    with _HASH_LOCK:
        cached = _HASH_CACHE.get(key)
    if cached is not None:
        return cached
    sha1 = hashlib.sha1(b"blob %d\0" % stat.st_size)
    sha256 = hashlib.sha256()
    with disk.open("rb") as handle:
        while chunk := handle.read(BODY_CHUNK):
            sha1.update(chunk)
            sha256.update(chunk)
    result = (sha1.hexdigest(), sha256.hexdigest())
    with _HASH_LOCK:
        _HASH_CACHE[key] = result
    return result


def file_info(snapshot: Path, path: str) -> FileInfo:
    """FileInfo of PATH (repo-relative, '/'-separated) in a snapshot directory."""
    disk = snapshot.joinpath(*path.split("/"))
    git_oid, sha256 = file_hashes(disk)
    size = disk.stat().st_size
    pointer = lfs_pointer(sha256, size)
    return FileInfo(
        path=path,
        disk=disk,
        size=size,
        git_oid=git_oid,
        sha256=sha256,
        lfs=is_lfs(path, size),
        pointer_oid=git_blob_oid(pointer),
        pointer_size=len(pointer),
    )


def git_tree_oid(files: list[FileInfo], directory: str) -> str:
    """git's tree id of DIRECTORY ('' = root), built from the files below it as git would store them."""
    prefix = f"{directory}/" if directory else ""
    children: dict[str, tuple[str, str]] = {}  # name -> (mode, oid)
    for info in files:
        if not info.path.startswith(prefix):
            continue
        name, _, rest = info.path[len(prefix) :].partition("/")
        if rest:
            children[name] = ("40000", "")
        else:
            children[name] = ("100644", info.tree_oid)
    entries = []
    # git orders tree entries by name, comparing a subtree's name as if it ended in '/'.
    for name in sorted(children, key=lambda n: n + "/" if children[n][0] == "40000" else n):
        mode, oid = children[name]
        if mode == "40000":
            oid = git_tree_oid(files, prefix + name)
        entries.append(b"%s %s\0" % (mode.encode(), name.encode()) + bytes.fromhex(oid))
    body = b"".join(entries)
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


# --- the store: repos, revisions, tokens ---------------------------------------------------------------------


@dataclass
class Repo:
    """One repo of the root, as repo.json describes it."""

    repo_id: str
    directory: Path
    private: bool
    token: str | None
    refs: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)

    def resolve(self, revision: str) -> str:
        """Commit sha of a ref name or of a full sha the repo has; else 404 RevisionNotFound as the Hub."""
        if revision in self.refs:
            return self.refs[revision]
        if COMMIT_SHA.fullmatch(revision) and (self.directory / revision).is_dir():
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def files(self, sha: str) -> list[FileInfo]:
        """Every file of a commit, sorted by path."""
        snapshot = self.directory / sha
        paths = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        return [file_info(snapshot, path) for path in paths]

    def file(self, sha: str, path: str) -> FileInfo:
        """One file of a commit; 404 EntryNotFound (with X-Repo-Commit, as the Hub) when there is none."""
        snapshot = self.directory / sha
        parts = path.split("/")
        disk = snapshot.joinpath(*parts)
        if not path or any(part in ("", ".", "..") for part in parts) or not disk.is_file():
            raise HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        return file_info(snapshot, path)


class Store:
    """The root directory. Read again at every request, so tests may add repos or faults while it runs."""

    def __init__(self, root: Path):
        self.root = root

    def _load(self, directory: Path, repo_id: str) -> Repo:
        data = json.loads((directory / "repo.json").read_text())
        return Repo(
            repo_id=repo_id,
            directory=directory,
            private=bool(data.get("private", False)),
            token=data.get("token"),
            refs=dict(data.get("refs", {})),
            meta=data,
        )

    def find(self, org: str, name: str) -> Repo | None:
        """The repo ORG/NAME, or None (also for names that could escape the root)."""
        if not (NAME_PART.fullmatch(org) and NAME_PART.fullmatch(name)):
            return None
        directory = self.root / org / name
        if not (directory / "repo.json").is_file():
            return None
        return self._load(directory, f"{org}/{name}")

    def known_tokens(self) -> set[str]:
        """Every token some repo accepts, and the accounts' tokens of ROOT/tokens.json (a list: valid tokens
        that open every public repo and no private one): any other token is 'invalid credentials' to the Hub."""
        tokens = set()
        accounts = self.root / "tokens.json"
        if accounts.is_file():
            tokens.update(json.loads(accounts.read_text()))
        for repo_json in self.root.glob("*/*/repo.json"):
            token = json.loads(repo_json.read_text()).get("token")
            if token:
                tokens.add(token)
        return tokens

    def lfs_redirect(self) -> str | None:
        """The base URL LFS files are redirected to (ROOT/lfs_redirect.json), or None to serve them directly."""
        path = self.root / "lfs_redirect.json"
        if not path.is_file():
            return None
        try:
            base = json.loads(path.read_text()).get("base")
        except (ValueError, AttributeError) as error:
            raise HubError(500, None, f"lfs_redirect.json: {error}") from error
        if not isinstance(base, str) or not base.startswith(("http://", "https://")):
            raise HubError(500, None, 'lfs_redirect.json: expected {"base": "http://HOST:PORT"}')
        return base.rstrip("/")

    def faults(self) -> list[dict[str, Any]]:
        """The faults of ROOT/faults.json, checked; [] when there is no such file."""
        path = self.root / "faults.json"
        if not path.is_file():
            return []
        try:
            faults = json.loads(path.read_text())
        except ValueError as error:
            raise HubError(500, None, f"faults.json: {error}") from error
        if not isinstance(faults, list):
            raise HubError(500, None, "faults.json: expected a list")
        for fault in faults:
            if fault.get("kind") not in FAULT_KINDS or not isinstance(fault.get("offset"), int):
                raise HubError(500, None, f"faults.json: bad fault {fault!r}")
        return faults


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer hf_...` header (the only scheme the client sends)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def open_repo(store: Store, org: str, name: str, token: str | None) -> Repo:
    """The repo, after the Hub's access checks (see the module docstring for the statuses)."""
    if token is not None and token not in store.known_tokens():
        raise HubError(401, None, INVALID_CREDENTIALS)
    repo = store.find(org, name)
    if repo is None or (repo.private and token != repo.token):
        status = 401 if token is None else 404
        raise HubError(status, "RepoNotFound", "Repository not found")
    return repo


# --- stats and faults ----------------------------------------------------------------------------------------


class Counters:
    """Request statistics and fault use counts, shared by the handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.bytes_served: dict[str, int] = {}
            self.get_requests = 0
            self.head_requests = 0
            self.range_requests = 0
            self.faults_applied = 0
            self.redirects = 0
            self.cdn_requests = 0
            self.cdn_requests_with_authorization = 0
            self.fault_uses: dict[str, int] = {}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "bytes_served_total": sum(self.bytes_served.values()),
                "bytes_served": dict(self.bytes_served),
                "get_requests": self.get_requests,
                "head_requests": self.head_requests,
                "range_requests": self.range_requests,
                "faults_applied": self.faults_applied,
                "redirects": self.redirects,
                "cdn_requests": self.cdn_requests,
                "cdn_requests_with_authorization": self.cdn_requests_with_authorization,
            }

    def count_request(self, method: str, partial: bool) -> None:
        with self.lock:
            if method == "HEAD":
                self.head_requests += 1
            else:
                self.get_requests += 1
                self.range_requests += int(partial)

    def count_redirect(self) -> None:
        with self.lock:
            self.redirects += 1

    def count_cdn(self, authorization: bool) -> None:
        with self.lock:
            self.cdn_requests += 1
            self.cdn_requests_with_authorization += int(authorization)

    def add_bytes(self, key: str, count: int) -> None:
        with self.lock:
            self.bytes_served[key] = self.bytes_served.get(key, 0) + count

    def take_fault(self, faults: list[dict[str, Any]], repo_id: str, path: str, start: int, end: int) -> dict | None:
        """The first fault for this file whose offset lies in [start, end] and has uses left; uses one up."""
        with self.lock:
            for fault in faults:
                if fault.get("repo") != repo_id or fault.get("path") != path:
                    continue
                if not start <= fault["offset"] <= end:
                    continue
                key = json.dumps(fault, sort_keys=True)
                if self.fault_uses.get(key, 0) >= int(fault.get("times", 1)):
                    continue
                self.fault_uses[key] = self.fault_uses.get(key, 0) + 1
                self.faults_applied += 1
                return fault
        return None


# --- responses -----------------------------------------------------------------------------------------------


def model_info(repo: Repo, sha: str, blobs: bool) -> dict[str, Any]:
    """The Hub's model info for a commit (the fields `huggingface_hub.ModelInfo` reads)."""
    siblings = []
    for info in repo.files(sha):
        sibling: dict[str, Any] = {"rfilename": info.path}
        if blobs:
            sibling.update(size=info.size, blobId=info.tree_oid)
            if info.lfs:
                sibling["lfs"] = {"sha256": info.sha256, "size": info.size, "pointerSize": info.pointer_size}
        siblings.append(sibling)
    org = repo.repo_id.split("/")[0]
    return {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": org,
        "sha": sha,
        "lastModified": repo.meta.get("lastModified", DEFAULT_DATE),
        "createdAt": repo.meta.get("createdAt", DEFAULT_DATE),
        "private": repo.private,
        "disabled": False,
        "gated": False,
        "tags": [],
        "downloads": 0,
        "likes": 0,
        "siblings": siblings,
    }


def tree_entry(info: FileInfo) -> dict[str, Any]:
    """One file of a tree listing, as the Hub's /tree endpoint gives it."""
    entry: dict[str, Any] = {"type": "file", "oid": info.tree_oid, "size": info.size, "path": info.path}
    if info.lfs:
        entry["lfs"] = {"oid": info.sha256, "size": info.size, "pointerSize": info.pointer_size}
    return entry


def tree_listing(repo: Repo, sha: str, directory: str, recursive: bool) -> list[dict[str, Any]]:
    """The /tree listing of DIRECTORY ('' = root): its children, or everything below it when recursive."""
    files = repo.files(sha)
    prefix = f"{directory}/" if directory else ""
    if directory and not any(info.path.startswith(prefix) for info in files):
        raise HubError(404, "EntryNotFound", f"{directory}: no such directory at {sha}", {"X-Repo-Commit": sha})
    directories: set[str] = set()
    listed: list[dict[str, Any]] = []
    for info in files:
        if not info.path.startswith(prefix):
            continue
        rest = info.path[len(prefix) :].split("/")
        depth = len(rest) if recursive else 1
        for level in range(1, min(depth, len(rest) - 1) + 1):
            directories.add(prefix + "/".join(rest[:level]))
        if recursive or len(rest) == 1:
            listed.append(tree_entry(info))
    for path in directories:
        listed.append({"type": "directory", "oid": git_tree_oid(files, path), "size": 0, "path": path})
    return sorted(listed, key=lambda entry: entry["path"])


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end) inclusive for a single `bytes=` range; None to serve the whole file (no or odd Range).

    Raises HubError 416 for a range past the end, as the Hub's CDN does."""
    if not header:
        return None
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header, re.IGNORECASE)
    if match is None or (not match.group(1) and not match.group(2)):
        return None  # multi-range or malformed: answered with the whole file (allowed by RFC 9110)
    first, last = match.groups()
    if not first:
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if size == 0 or start >= size or start > end:
        raise HubError(416, None, "Requested Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
    return start, end


def content_type(path: str) -> str:
    if path.endswith(".json"):
        return "application/json; charset=utf-8"
    if path.endswith((".txt", ".md", ".py", ".jinja")):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


# --- HTTP ---------------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """Routes the Hub's endpoints; keep-alive HTTP/1.1 as the Hub (the client reuses connections)."""

    protocol_version = "HTTP/1.1"
    server_version = "hf-hub-standin/1"
    sys_version = ""
    timeout = 120  # idle keep-alive connections end after this
    server: StandinServer

    # -- plumbing

    def version_string(self) -> str:
        return self.server_version

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silenced: each request is logged once by `_log`, with the body size."""

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"hf-standin: {format % args}\n")

    def _log(self, status: int, nbytes: int) -> None:
        path = urlsplit(self.path).path
        sys.stderr.write(f"hf-standin: {self.command} {path} {status} {nbytes}\n")
        sys.stderr.flush()

    def _send_head(self, status: int, headers: dict[str, str]) -> None:
        self.headers_sent = True
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        all_headers = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(body))}
        all_headers.update(headers or {})
        self._send_head(status, all_headers)
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log(status, 0 if self.command == "HEAD" else len(body))

    def _send_error(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message, **error.headers}
        if error.code:
            headers["X-Error-Code"] = error.code
        self._send_json(error.status, {"error": error.message}, headers)

    def _token(self) -> str | None:
        return bearer_token(self.headers.get("Authorization"))

    # -- methods

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if urlsplit(self.path).path == "/_standin/reset":
            self.server.counters.reset()
            self._send_json(200, {"reset": True})
        else:
            self._send_error(HubError(404, None, "Sorry, we can't find the page you are looking for."))

    def _dispatch(self) -> None:
        """Route one request; Hub errors become Hub-shaped answers, a stand-in bug a 500 (or a closed connection
        when the headers are already out)."""
        self.headers_sent = False
        try:
            self._route()
        except HubError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:
            traceback.print_exc()
            self.close_connection = True
            if not self.headers_sent:
                self._send_error(HubError(500, None, f"stand-in error: {error!r}"))

    def _route(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        raw = url.path.split("/")[1:]  # percent-decoded per segment: the client quotes '/' in revisions
        parts = [unquote(part) for part in raw]
        if parts == ["_standin", "stats"]:
            self._send_json(200, self.server.counters.snapshot())
        elif len(parts) >= 4 and parts[:2] == ["api", "models"]:
            self._api_models(parts[2], parts[3], parts[4:], query)
        elif len(parts) >= 6 and parts[:2] == ["_standin", "cdn"]:
            self._cdn(parts[2], parts[3], parts[4], "/".join(parts[5:]))
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(parts[0], parts[1], parts[3], "/".join(parts[4:]))
        else:
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _api_models(self, org: str, name: str, rest: list[str], query: dict[str, list[str]]) -> None:
        repo = open_repo(self.server.store, org, name, self._token())
        if not rest:
            self._send_json(200, model_info(repo, repo.resolve("main"), flag(query, "blobs")))
        elif rest[0] == "revision" and len(rest) >= 2:
            sha = repo.resolve("/".join(rest[1:]))
            self._send_json(200, model_info(repo, sha, flag(query, "blobs")))
        elif rest[0] == "tree" and len(rest) >= 2:
            sha = repo.resolve(rest[1])
            directory = "/".join(part for part in rest[2:] if part).strip("/")
            self._send_json(200, tree_listing(repo, sha, directory, flag(query, "recursive")))
        else:
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _resolve(self, org: str, name: str, revision: str, path: str) -> None:
        repo = open_repo(self.server.store, org, name, self._token())
        sha = repo.resolve(revision)
        info = repo.file(sha, path)
        base = self.server.store.lfs_redirect() if info.lfs else None
        if base is not None:
            # The Hub's answer for an LFS file: a redirect to its CDN, with the file's identity in the headers.
            self.server.counters.count_redirect()
            location = f"{base}/_standin/cdn/{quote(org)}/{quote(name)}/{sha}/{quote(path)}"
            headers = {
                "Location": location,
                "Content-Length": "0",
                "X-Repo-Commit": sha,
                "ETag": f'"{info.etag}"',
                "X-Linked-Etag": f'"{info.sha256}"',
                "X-Linked-Size": str(info.size),
            }
            self._send_head(302, headers)
            self._log(302, 0)
            return
        self._serve_file(repo, sha, info, path)

    def _cdn(self, org: str, name: str, sha: str, path: str) -> None:
        """The CDN side of the LFS redirect: no access check (the URL is the permission), Authorization counted."""
        self.server.counters.count_cdn(self.headers.get("Authorization") is not None)
        repo = self.server.store.find(org, name)
        if repo is None or not COMMIT_SHA.fullmatch(sha) or not (repo.directory / sha).is_dir():
            raise HubError(404, None, "Not Found")
        self._serve_file(repo, sha, repo.file(sha, path), path)

    def _serve_file(self, repo: Repo, sha: str, info: FileInfo, path: str) -> None:
        """Answer GET/HEAD of one file: headers, single byte ranges, faults, byte counts."""
        faults = self.server.store.faults() if self.command == "GET" else []
        span = parse_range(self.headers.get("Range"), info.size) if self.command == "GET" else None
        start, end = span if span is not None else (0, info.size - 1)
        headers = {
            "Content-Type": content_type(path),
            "Content-Length": str(end - start + 1),
            "Accept-Ranges": "bytes",
            "ETag": f'"{info.etag}"',
            "X-Repo-Commit": sha,
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if info.lfs:
            headers.update({"X-Linked-Etag": f'"{info.sha256}"', "X-Linked-Size": str(info.size)})
        if span is not None:
            headers["Content-Range"] = f"bytes {start}-{end}/{info.size}"
        self.server.counters.count_request(self.command, span is not None)
        fault = self.server.counters.take_fault(faults, repo.repo_id, path, start, end) if faults else None
        if fault is not None and fault["kind"] == "truncate":
            headers["Content-Length"] = str(fault["offset"] - start)
        status = 206 if span is not None else 200
        self._send_head(status, headers)
        if self.command == "HEAD":
            self._log(status, 0)
            return
        sent = self._send_body(info, start, end, fault, f"{repo.repo_id}/{path}")
        self._log(status, sent)

    def _send_body(self, info: FileInfo, start: int, end: int, fault: dict | None, key: str) -> int:
        """Write bytes [start, end] of the file, damaged as FAULT says; returns the bytes written."""
        stop = end + 1
        if fault is not None and fault["kind"] in ("cut", "truncate", "stall"):
            stop = fault["offset"]
        sent = 0
        try:
            with info.disk.open("rb") as handle:
                handle.seek(start)
                position = start
                while position < stop:
                    chunk = flipped(handle.read(min(BODY_CHUNK, stop - position)), position, fault)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    position += len(chunk)
        finally:
            self.server.counters.add_bytes(key, sent)
        if fault is not None and fault["kind"] == "stall":
            self.wfile.flush()
            time.sleep(float(fault.get("seconds", 30)))
        if fault is not None and fault["kind"] in ("cut", "stall"):
            self._cut_connection()
        return sent

    def _cut_connection(self) -> None:
        """Close the socket in the middle of a body, as a dropped connection does (FIN after the partial body)."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def flipped(chunk: bytes, position: int, fault: dict | None) -> bytes:
    """CHUNK (the file's bytes from POSITION on) with a flip fault's byte inverted, when it falls inside."""
    if fault is None or fault["kind"] != "flip" or not position <= fault["offset"] < position + len(chunk):
        return chunk
    damaged = bytearray(chunk)
    damaged[fault["offset"] - position] ^= 0xFF
    return bytes(damaged)


def flag(query: dict[str, list[str]], name: str) -> bool:
    """A boolean query parameter as the client sends it (`True`/`False`, or `1`, `true`)."""
    values = query.get(name)
    return bool(values) and values[-1].lower() in ("1", "true", "yes")


class StandinServer(ThreadingHTTPServer):
    """The HTTP server, with the store and the counters every handler thread shares."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], root: Path):
        super().__init__(address, Handler)
        self.store = Store(root)
        self.counters = Counters()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Stand-in Hugging Face Hub endpoint for tests (not huggingface.co)")
    parser.add_argument("--root", required=True, type=Path, help="fixture root: ORG/NAME/repo.json and ORG/NAME/SHA/")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (printed on stdout)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"--root {args.root}: not a directory")
    server = StandinServer((args.host, args.port), args.root.resolve())
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
