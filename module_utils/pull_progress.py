"""Plain functions behind docker_pull and job_watch (kind=pull): image references, the pull stream folded into a
progress record, that record as a status file, and the sentence a person reads while a 10+ GB image arrives.

The Docker Engine's pull stream (POST /images/create, non-TTY) is one JSON object per line:
  {"status": "Pulling from vllm/vllm-openai", "id": "cu130-nightly"}
  {"status": "Pulling fs layer", "progressDetail": {}, "id": "3e34c75f231b"}
  {"status": "Downloading", "progressDetail": {"current": 36445, "total": 3001131}, "id": "3e34c75f231b"}
  {"status": "Verifying Checksum" | "Download complete" | "Extracting" | "Pull complete", "id": ...}
  {"status": "Already exists", "progressDetail": {}, "id": "c6e677264aa1"}
  {"status": "Digest: sha256:..."}
  {"status": "Status: Downloaded newer image for ..."}  or  "Status: Image is up to date for ..."
  {"errorDetail": {"message": "unknown blob"}, "error": "unknown blob"}

Nothing here needs Ansible but our own module_utils/atomic_file.py, so pytest calls these functions directly on
a recorded real stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from ansible.module_utils.atomic_file import write_json_atomically

STATES = ("pulling", "done", "failed")
DEFAULT_STATUS_FILE = "/run/sparkfleet/docker-pull.json"

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# A registry host[:port] and a repository path of lower-case components (Docker's reference grammar).
_HOST = re.compile(r"^(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?$")
_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_DOCKER_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")

# Layer statuses of the pull stream; anything else with an "id" (the "Pulling from" line) is not a layer.
_LAYER_STATUSES = {
    "Pulling fs layer",
    "Waiting",
    "Downloading",
    "Verifying Checksum",
    "Download complete",
    "Extracting",
    "Pull complete",
    "Already exists",
}
_DOWNLOADED_STATUSES = {"Verifying Checksum", "Download complete", "Extracting", "Pull complete"}

# Below this many seconds, or before any byte arrived, a rate says nothing yet.
ESTIMATE_AFTER_SECONDS = 10


# --- image references -----------------------------------------------------------------------------------------


def is_digest(reference: str) -> bool:
    """True for 'sha256:' and 64 hex digits, the only digest a registry hands out today."""
    return bool(_DIGEST.match(reference))


def reference_problem(reference: str) -> str | None:
    """Why `reference` is neither a tag nor a sha256 digest, or None when it is one."""
    if is_digest(reference):
        return None
    if reference.startswith("sha256:"):
        return f"reference={reference!r} starts like a digest but is not 'sha256:' and 64 lower-case hex digits"
    if not _TAG.match(reference):
        return (
            f"reference={reference!r} is not a tag (letters, digits, '_', '.', '-', at most 128, not starting "
            "with '.' or '-') nor a digest ('sha256:' and 64 hex digits)"
        )
    return None


def name_problem(name: str) -> str | None:
    """Why `name` is not a repository such as 'vllm/vllm-openai' or 'registry.example:5000/vllm/vllm-openai'."""
    last = name.rsplit("/", 1)[-1]
    if "@" in name or ":" in last:
        return (
            f"name={name!r} carries a tag or digest; give the repository alone in name (e.g. 'vllm/vllm-openai') "
            "and the tag or digest in reference"
        )
    host, path = _split_registry(name)
    if not _PATH.match(path) or (host is not None and not _HOST.match(host)):
        return (
            f"name={name!r} is not a repository name; expected lower-case path components such as "
            "'vllm/vllm-openai', optionally after a registry host such as 'registry.example:5000/'"
        )
    return None


def _split_registry(name: str) -> tuple[str | None, str]:
    """'registry.example:5000/a/b' -> ('registry.example:5000', 'a/b'); 'vllm/vllm-openai' -> (None, ...).

    As in Docker, a first component is a registry only when it has a '.' or a ':' or is 'localhost'.
    """
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, name


def image_reference(name: str, reference: str) -> str:
    """'vllm/vllm-openai', 'cu130-nightly' -> 'vllm/vllm-openai:cu130-nightly'; a digest joins with '@'."""
    return f"{name}@{reference}" if is_digest(reference) else f"{name}:{reference}"


def normalize_repository(name: str) -> str:
    """The fully qualified form Docker resolves a repository to.

    'vllm/vllm-openai' -> 'docker.io/vllm/vllm-openai'; 'ubuntu' and 'docker.io/ubuntu' ->
    'docker.io/library/ubuntu'; 'registry.example:5000/a/b' stays as it is.
    """
    domain, path = _split_registry(name)
    domain = domain or "docker.io"
    if domain in _DOCKER_HUB_NAMES:
        domain = "docker.io"
        if "/" not in path:
            path = "library/" + path
    return f"{domain}/{path}"


def repo_digest_for(name: str, repo_digests: Iterable[str]) -> str | None:
    """The 'sha256:...' of the RepoDigests entry that belongs to repository `name`, or None.

    Docker writes Docker Hub entries short ('vllm/vllm-openai@sha256:...', 'ubuntu@sha256:...'), other
    registries in full; both sides are normalised before they are compared.
    """
    wanted = normalize_repository(name)
    for entry in repo_digests or ():
        repository, _, digest = entry.rpartition("@")
        if repository and normalize_repository(repository) == wanted and is_digest(digest):
            return digest
    return None


# --- the pull stream, folded ----------------------------------------------------------------------------------


def new_tracker() -> dict:
    """The empty state apply_event folds a pull stream into."""
    return {"layers": {}, "digest": None, "outcome": None, "error": None}


def _layer(tracker: dict, layer_id: str) -> dict:
    return tracker["layers"].setdefault(
        layer_id,
        {"status": None, "current": 0, "total": None, "downloaded": False, "done": False, "present": False},
    )


def apply_event(tracker: dict, event: dict) -> None:
    """Fold one message of the pull stream into tracker (in place)."""
    if event.get("error") or event.get("errorDetail"):
        detail = event.get("errorDetail") or {}
        tracker["error"] = str(detail.get("message") or event.get("error"))
        return
    status = str(event.get("status") or "")
    if status.startswith("Digest: "):
        tracker["digest"] = status.split(": ", 1)[1].strip()
        return
    if status.startswith("Status: "):
        tracker["outcome"] = status.split(": ", 1)[1].strip()
        return
    layer_id = event.get("id")
    if not layer_id or not (status in _LAYER_STATUSES or status.startswith("Retrying in")):
        return
    layer = _layer(tracker, str(layer_id))
    layer["status"] = status
    detail = event.get("progressDetail") or {}
    total = detail.get("total")
    current = detail.get("current")
    if status == "Downloading":
        if isinstance(total, int) and total > 0:
            layer["total"] = total
        if isinstance(current, int):
            layer["current"] = current
    elif status == "Extracting" and layer["total"] is None and isinstance(total, int) and total > 0:
        # Extraction reads the compressed blob, so its total is the layer's download size.
        layer["total"] = total
    if status in _DOWNLOADED_STATUSES:
        layer["downloaded"] = True
    if status == "Pull complete":
        layer["done"] = True
    if status == "Already exists":
        layer.update(present=True, done=True, downloaded=True)


def fold_events(events: Iterable[dict], tracker: dict | None = None) -> dict:
    """Fold a whole stream (or the next part of one, into an existing tracker)."""
    tracker = tracker if tracker is not None else new_tracker()
    for event in events:
        apply_event(tracker, event)
    return tracker


def _layer_bytes_done(layer: dict) -> int:
    if layer["downloaded"] and layer["total"] is not None:
        return layer["total"]
    return layer["current"]


def progress_record(tracker: dict, image: str, state: str, started: float, updated: float) -> dict:
    """The status-file record of a pull: what docker_pull writes and job_watch reads.

    Layers already present count as done and need no bytes; bytes are compressed download sizes, as a
    registry serves them. bytes_total_known sums the sizes of the layers_size_known layers whose size the
    stream has told so far (Docker starts 3 downloads at a time and sends a layer's size with its first
    progress).
    """
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    layers = tracker["layers"].values()
    fetched = [layer for layer in layers if not layer["present"]]
    sized = [layer for layer in fetched if layer["total"] is not None]
    return {
        "state": state,
        "image": image,
        "started": round(started, 3),
        "updated": round(updated, 3),
        "layers_total": len(tracker["layers"]),
        "layers_done": sum(1 for layer in layers if layer["done"]),
        "layers_present": sum(1 for layer in layers if layer["present"]),
        "layers_downloaded": sum(1 for layer in fetched if layer["downloaded"]),
        "layers_size_known": len(sized),
        "bytes_done": sum(_layer_bytes_done(layer) for layer in fetched),
        "bytes_total_known": sum(layer["total"] for layer in sized),
        "digest": tracker["digest"],
        "outcome": tracker["outcome"],
        "error": tracker["error"],
    }


def estimate_total_bytes(record: dict) -> int | None:
    """About how many bytes the pull downloads in all: the known layer sizes, plus the average known size for
    each layer still to download whose size is not known yet. None while no size is known."""
    known = record.get("layers_size_known") or 0
    if known == 0:
        return None
    to_fetch = (record.get("layers_total") or 0) - (record.get("layers_present") or 0)
    unknown = max(to_fetch - known, 0)
    total_known = record.get("bytes_total_known") or 0
    return max(round(total_known + unknown * total_known / known), record.get("bytes_done") or 0)


# --- words ----------------------------------------------------------------------------------------------------

_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def _unit_for(size: float) -> tuple[float, str]:
    for scale, unit in _UNITS:
        if size >= scale:
            return scale, unit
    return 1, "B"


def format_size(size: float) -> str:
    """Decimal units, as Docker prints them: 10400000000 -> '10.4 GB', 999 -> '999 B'."""
    scale, unit = _unit_for(size)
    return f"{size:.0f} B" if scale == 1 else f"{size / scale:.1f} {unit}"


def format_part_of_total(done: float, total: float) -> str:
    """Both in the total's unit: (3.1e9, 10.4e9) -> '3.1 of about 10.4 GB'."""
    scale, unit = _unit_for(total)
    if scale == 1:
        return f"{done:.0f} of about {total:.0f} B"
    return f"{done / scale:.1f} of about {total / scale:.1f} {unit}"


def format_duration(seconds: float) -> str:
    """Elapsed time: 42 -> '42s', 250 -> '4m10s', 3900 -> '1h05m'."""
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_time_left(seconds: float) -> str:
    """A rounded estimate: 'less than a minute', 'about 9m', 'about 1h05m'."""
    if seconds < 60:
        return "less than a minute left"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes}m left"
    return f"about {minutes // 60}h{minutes % 60:02d}m left"


def short_image(image: str) -> str:
    """'vllm/vllm-openai@sha256:abcdef0123456789...' -> 'vllm/vllm-openai@sha256:abcdef012345…'."""
    name, at, digest = image.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}…" if at and len(digest) > 12 else image


def _layers(record: dict) -> str:
    return f"{record.get('layers_done', 0)} of {record.get('layers_total', 0)} layers"


def progress_message(record: dict | None, now: float) -> str:
    """One line for a person watching the pull, from a status-file record (None: no file yet).

    'vllm/vllm-openai@sha256:abc…: 3.1 of about 10.4 GB (12 of 31 layers) after 4m10s, 12.5 MB/s, about 9m left'
    """
    if record is None:
        return "waiting for the pull to start"
    image = short_image(str(record.get("image") or "the image"))
    state = record.get("state")
    started = float(record.get("started") or now)
    updated = float(record.get("updated") or started)
    bytes_done = record.get("bytes_done") or 0
    if state == "failed":
        return f"{image}: the pull failed after {format_duration(updated - started)}: {record.get('error')}"
    if state == "done":
        took = format_duration(updated - started)
        if bytes_done == 0:
            return f"{image}: done, nothing to download ({record.get('outcome') or 'already present'})"
        rate = bytes_done / max(updated - started, 0.001)
        present = record.get("layers_present") or 0
        also = f", {present} already present" if present else ""
        return (
            f"{image}: done, {format_size(bytes_done)} downloaded in {took} ({format_size(rate)}/s; "
            f"{record.get('layers_total', 0)} layers{also})"
        )
    elapsed = format_duration(now - started)
    if not record.get("layers_total"):
        return f"{image}: asking the registry for the image's layers, after {elapsed}"
    estimate = estimate_total_bytes(record)
    if estimate is None:
        return f"{image}: {format_size(bytes_done)} so far ({_layers(record)}) after {elapsed}, estimating the size"
    to_fetch = record["layers_total"] - (record.get("layers_present") or 0)
    if record.get("layers_downloaded", 0) >= to_fetch:
        return f"{image}: all {format_size(bytes_done)} downloaded, unpacking ({_layers(record)}) after {elapsed}"
    measured = updated - started
    if measured < ESTIMATE_AFTER_SECONDS or bytes_done == 0:
        return (
            f"{image}: {format_part_of_total(bytes_done, estimate)} ({_layers(record)}) after {elapsed}, "
            "estimating the time left"
        )
    rate = bytes_done / measured
    left = (estimate - bytes_done) / rate
    return (
        f"{image}: {format_part_of_total(bytes_done, estimate)} ({_layers(record)}) after {elapsed}, "
        f"{format_size(rate)}/s, {format_time_left(left)}"
    )


def registry_of(name: str) -> str:
    """Where a repository lives, in words: 'Docker Hub (docker.io)' or 'registry.example:5000'."""
    domain = normalize_repository(name).split("/", 1)[0]
    return "Docker Hub (docker.io)" if domain == "docker.io" else domain


def explain_pull_error(name: str, reference: str, words: str) -> str:
    """The failure message of a pull: the image, the registry's (or Docker's) words, and what to check."""
    image = image_reference(name, reference)
    registry = registry_of(name)
    lower = words.lower()
    if "manifest unknown" in lower or "not found" in lower:
        hint = (
            f"check that the tag or digest exists in {registry} for this repository (a digest is per platform "
            "or per manifest list; a tag may have been removed) and that the name is spelled right"
        )
    elif "unauthorized" in lower or "denied" in lower or "authentication required" in lower:
        hint = (
            f"check the repository name and that this host is logged in to {registry} (docker login) with access to it"
        )
    elif any(
        cue in lower
        for cue in (
            "connection refused",
            "no such host",
            "timeout",
            "network is unreachable",
            "dial tcp",
            "https client",
        )
    ):
        hint = (
            f"check that {registry} is reachable from this host (address and port, DNS, firewall, the proxy "
            "settings of dockerd, registry-mirrors and insecure-registries in /etc/docker/daemon.json)"
        )
    elif "no space left" in lower:
        hint = "free disk space under Docker's data root (docker system df; /var/lib/docker by default)"
    elif "blob" in lower or "unexpected eof" in lower or "digest" in lower:
        hint = (
            f"the registry {registry} served a broken or missing layer; retry, and if it persists, check the "
            "registry's storage or mirror"
        )
    else:
        hint = f"check that {registry} is reachable and serves this image, and dockerd's log (journalctl -u docker)"
    return f"Pulling {image} failed: {words.strip().rstrip('.')}. {hint[0].upper()}{hint[1:]}."


# --- the status file ------------------------------------------------------------------------------------------


def write_status_file(path: str, record: dict) -> None:
    """Replace `path` with record as JSON, atomically (a temporary file in the same folder, then rename), mode
    0644; the folders are created (0755) when missing. A reader never sees half a file. Not flushed to disk: it is
    rewritten every second and means nothing after a reboot."""
    write_json_atomically(path, record, fsync=False)


def read_status_file(path: str) -> dict | None:
    """The record in `path`; None when there is no file yet. Raises ValueError naming the file when it is not
    a status record."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{path} is not JSON ({error}); it should be a status file written by docker_pull") from error
    if not isinstance(record, dict) or record.get("state") not in STATES:
        raise ValueError(
            f"{path} is not a docker_pull status file (no 'state' of {', '.join(STATES)}); check status_file"
        )
    return record
