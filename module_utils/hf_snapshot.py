"""Plain functions behind hf_prefetch: a Hugging Face snapshot in the local cache, checked byte for byte.

huggingface_hub stores what it downloads without hashing it: a flipped byte or a shard cut short by a full disk
lands in the cache silently, and vLLM finds out (or does not) ten minutes into loading. So every file is checked
against the Hub's own tree listing: size and sha256 (the LFS object id) for weight files, size and git blob id
for the small files, every safetensors header parsed by fastsafetensors (the loader vLLM uses with
--load-format fastsafetensors), and model.safetensors.index.json compared with the tensors the shards hold.

The cache layout is huggingface_hub's own, so vLLM's HF_HUB_OFFLINE=1 load finds the files where it looks:
  <cache_dir>/models--<org>--<name>/blobs/<etag>                  the bytes (etag = sha256 or git blob id)
  <cache_dir>/models--<org>--<name>/snapshots/<commit>/<path>     symlink to ../../blobs/<etag>
  <cache_dir>/models--<org>--<name>/refs/<revision>               the commit a branch or tag pointed at
  <cache_dir>/models--<org>--<name>/.sparkfleet/verified-<commit>.json   ours: what was verified, and how

Nothing here needs Ansible (atomic_file.py and input_rules.py come from module_utils/ either way) or huggingface_hub
(fastsafetensors only where headers are read), so pytest calls these functions directly.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

try:
    from ansible.module_utils.atomic_file import write_json_atomically
    from ansible.module_utils.input_rules import hf_commit
except ImportError:  # imported as a plain module with module_utils/ on sys.path (bench/verify-throughput.py)
    from atomic_file import write_json_atomically
    from input_rules import hf_commit

MARKER_FOLDER = ".sparkfleet"
LOCK_FILE = ".sparkfleet-prefetch.lock"
# Reads this large keep the disk streaming and let hashlib drop the GIL, so shards hash in parallel.
READ_CHUNK = 8 * 1024 * 1024
VERIFY_LEVELS = ("size", "full")
STATES = ("resolving", "downloading", "verifying", "done", "failed")


# --- where things are ------------------------------------------------------------------------------------------


def repo_folder(cache_dir: str, repo_id: str) -> str:
    """'Qwen/Qwen3-0.6B' -> '<cache_dir>/models--Qwen--Qwen3-0.6B', huggingface_hub's folder for a model repo."""
    return os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))


def snapshot_folder(cache_dir: str, repo_id: str, commit: str) -> str:
    """The folder vLLM reads the model from, offline, at one commit."""
    return os.path.join(repo_folder(cache_dir, repo_id), "snapshots", commit)


def marker_path(cache_dir: str, repo_id: str, commit: str) -> str:
    """Where the record of a verified snapshot lives (beside, not inside, the snapshot vLLM reads)."""
    return os.path.join(repo_folder(cache_dir, repo_id), MARKER_FOLDER, f"verified-{commit}.json")


def is_commit(revision: str) -> bool:
    """True for a full 40-hex commit id (input_rules' hf_commit): it names one snapshot forever, so a rerun needs no
    network."""
    return hf_commit(revision) is None


# --- the manifest: what the Hub says the snapshot holds --------------------------------------------------------


def selected(path: str, allow_patterns: Iterable[str] | None, ignore_patterns: Iterable[str] | None) -> bool:
    """huggingface_hub's rule (filter_repo_objects): fnmatch on the whole path, allow first, then ignore."""
    allow = list(allow_patterns or [])
    ignore = list(ignore_patterns or [])
    if allow and not any(fnmatch.fnmatch(path, pattern) for pattern in allow):
        return False
    return not any(fnmatch.fnmatch(path, pattern) for pattern in ignore)


def manifest_from_tree(
    repo_id: str,
    commit: str,
    entries: Iterable[dict],
    allow_patterns: Iterable[str] | None = None,
    ignore_patterns: Iterable[str] | None = None,
) -> dict:
    """The files to fetch and how to check each, from the Hub's tree listing (GET /api/models/{repo}/tree/{sha}).

    An entry with 'lfs' is checked by sha256 (its LFS oid); any other file by its git blob id ('oid'). Both
    come from the Hub, never from the bytes we received.
    """
    files = []
    for entry in entries:
        if entry.get("type", "file") != "file" or not selected(entry["path"], allow_patterns, ignore_patterns):
            continue
        lfs = entry.get("lfs")
        if lfs:
            files.append({"path": entry["path"], "size": int(lfs["size"]), "sha256": lfs["oid"]})
        else:
            files.append({"path": entry["path"], "size": int(entry["size"]), "git_oid": entry["oid"]})
    files.sort(key=lambda item: item["path"])
    return {"repo_id": repo_id, "commit": commit, "files": files, "bytes": sum(item["size"] for item in files)}


def manifest_problem(manifest: object) -> str | None:
    """Why a manifest handed over from another host cannot be used, or None when it can."""
    if not isinstance(manifest, dict):
        return "manifest must be the 'manifest' a previous hf_prefetch returned (a mapping)"
    if not is_commit(str(manifest.get("commit", ""))):
        return f"manifest.commit={manifest.get('commit')!r} is not a 40-hex commit id"
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return "manifest.files must be a non-empty list of {path, size, sha256 | git_oid}"
    for item in files:
        if not isinstance(item, dict) or "path" not in item or "size" not in item:
            return f"manifest.files entry {item!r} lacks path or size"
        if not item.get("sha256") and not item.get("git_oid"):
            return f"manifest.files entry {item['path']!r} has neither sha256 nor git_oid"
    return None


def etag_of(item: dict) -> str:
    """The name huggingface_hub gives a file's blob: the sha256 for LFS files, the git blob id otherwise."""
    return item.get("sha256") or item["git_oid"]


def blob_path(cache_dir: str, repo_id: str, item: dict) -> str:
    return os.path.join(repo_folder(cache_dir, repo_id), "blobs", etag_of(item))


def missing_files(cache_dir: str, manifest: dict) -> list[dict]:
    """Files whose snapshot link is missing or leads to a file of the wrong size. The link is what vLLM reads;
    where it leads (the blob's name) can differ with a mirror that names its ETags its own way."""
    snapshot = snapshot_folder(cache_dir, manifest["repo_id"], manifest["commit"])
    return [item for item in manifest["files"] if _size_of(os.path.join(snapshot, item["path"])) != item["size"]]


def bytes_to_fetch(cache_dir: str, manifest: dict, files: Iterable[dict]) -> int:
    """Bytes a download of `files` will write: a blob already in place (shared with another snapshot) costs none."""
    return sum(
        item["size"] for item in files if _size_of(blob_path(cache_dir, manifest["repo_id"], item)) != item["size"]
    )


def _size_of(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


# --- disk space ------------------------------------------------------------------------------------------------


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem that holds `path`, or will once it is created."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return shutil.disk_usage(probe).free


def disk_problem(cache_dir: str, needed: int, reserve: int) -> str | None:
    """Why `needed` bytes should not be written under `cache_dir`, or None. Checked before the first byte moves,
    because a full disk on a Spark also starves the Docker root and the journal."""
    free = free_bytes(cache_dir)
    if needed + reserve <= free:
        return None
    return (
        f"{cache_dir} has {format_size(free)} free, and the download needs {format_size(needed)} plus the "
        f"{format_size(reserve)} kept free (disk_reserve_gib); free space there, or point cache_dir at a larger disk"
    )


# --- verification ----------------------------------------------------------------------------------------------


class ByteCounter:
    """Bytes read so far, shared by the hashing threads and the progress writer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, count: int) -> None:
        with self._lock:
            self.value += count


def file_digest(path: str, item: dict, counter: ByteCounter | None = None) -> str:
    """sha256 of the file (LFS files), or its git blob id: sha1 of 'blob <size>\\0' and the content."""
    if item.get("sha256"):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % os.stat(path).st_size)
    with open(path, "rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buffer = bytearray(READ_CHUNK)
        view = memoryview(buffer)
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])
            if counter is not None:
                counter.add(count)
    return digest.hexdigest()


def file_problem(path: str, item: dict, level: str, counter: ByteCounter | None = None) -> str | None:
    """What is wrong with one file of the snapshot, or None. `level` is 'size' or 'full'."""
    size = _size_of(path)
    if size is None:
        return "missing"
    if size != item["size"]:
        return f"size {size} bytes, expected {item['size']} (cut short or overwritten)"
    if level == "full":
        expected = etag_of(item)
        actual = file_digest(path, item, counter)
        if actual != expected:
            kind = "sha256" if item.get("sha256") else "git blob id"
            return f"{kind} {actual}, expected {expected} from the Hub's tree listing (the bytes differ)"
    return None


def file_problems(
    snapshot: str, files: list[dict], level: str, workers: int, counter: ByteCounter | None = None
) -> dict[str, str]:
    """{path: problem} for every file of `files` that fails its check; large files are hashed in parallel."""
    ordered = sorted(files, key=lambda item: -item["size"])  # start the big shards first
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(
            lambda item: file_problem(os.path.join(snapshot, item["path"]), item, level, counter), ordered
        )
        return {item["path"]: problem for item, problem in zip(ordered, results, strict=False) if problem}


class _DtypeSizes:
    """The two things fastsafetensors' header parser asks of a framework, answered from fastsafetensors' own
    tables, so that headers can be checked without importing torch (the venv on the Spark does not hold it)."""

    def __init__(self, sizes: dict) -> None:
        self._sizes = sizes

    def get_device_ptr_align(self) -> int:
        return 16  # fastsafetensors' CUDA_PTR_ALIGN; only used to note alignment, never to reject

    def get_dtype_size(self, dtype) -> float:
        return float(self._sizes[dtype])


def safetensors_tensors(path: str) -> list[str]:
    """Tensor names of a safetensors file, after fastsafetensors validated its header: header length, JSON,
    known dtypes, contiguous offsets, shape x dtype = bytes, and data not running past the end of the file.
    Raises ValueError with fastsafetensors' words. (It accepts trailing bytes and flipped bits: the hash
    catches those.)"""
    from fastsafetensors.common import SafeTensorsMetadata
    from fastsafetensors.st_types import DTYPE_SIZES

    try:
        metadata = SafeTensorsMetadata.from_file(path, framework=_DtypeSizes(DTYPE_SIZES))
    except Exception as error:
        raise ValueError(f"fastsafetensors rejects its header: {error}") from error
    return list(metadata.tensors)


def header_problems(snapshot: str, files: list[dict]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """({path: problem}, {path: tensor names}) for every .safetensors file of the snapshot."""
    problems: dict[str, str] = {}
    tensors: dict[str, list[str]] = {}
    for item in files:
        if not item["path"].endswith(".safetensors"):
            continue
        try:
            tensors[item["path"]] = safetensors_tensors(os.path.join(snapshot, item["path"]))
        except (OSError, ValueError) as error:
            problems[item["path"]] = str(error)
    return problems, tensors


def index_problems(snapshot: str, files: list[dict], tensors: dict[str, list[str]]) -> dict[str, str]:
    """{index path: problem} when a *.safetensors.index.json does not cover exactly the tensors its shards hold."""
    problems = {}
    for item in files:
        if not item["path"].endswith(".safetensors.index.json"):
            continue
        problem = _index_problem(os.path.join(snapshot, item["path"]), os.path.dirname(item["path"]), tensors)
        if problem:
            problems[item["path"]] = problem
    return problems


def _index_problem(index_file: str, folder: str, tensors: dict[str, list[str]]) -> str | None:
    try:
        with open(index_file, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"cannot read its weight_map: {error}"
    shards = {os.path.join(folder, shard) if folder else shard for shard in set(weight_map.values())}
    absent = sorted(shard for shard in shards if shard not in tensors)
    if absent:
        return f"names shard(s) {', '.join(absent)} that the snapshot does not hold"
    held = {(name, shard) for shard in shards for name in tensors[shard]}
    named = {(name, os.path.join(folder, shard) if folder else shard) for name, shard in weight_map.items()}
    not_held = sorted(f"{name} (in {shard})" for name, shard in named - held)
    not_named = sorted(f"{name} (in {shard})" for name, shard in held - named)
    words = []
    if not_held:
        words.append(f"names {len(not_held)} tensor(s) its shard does not hold: {', '.join(not_held[:5])}")
    if not_named:
        words.append(f"misses {len(not_named)} tensor(s) the shards hold: {', '.join(not_named[:5])}")
    return "; ".join(words) or None


# --- the marker: a verified snapshot, cheap to recognise on the next run -----------------------------------------


def write_marker(cache_dir: str, manifest: dict, level: str) -> str:
    """Record that this snapshot was verified at `level`; written last, atomically."""
    path = marker_path(cache_dir, manifest["repo_id"], manifest["commit"])
    record = dict(manifest, verify=level, verified_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_json_atomically(path, record, indent=1)
    return path


def read_marker(cache_dir: str, repo_id: str, commit: str) -> dict | None:
    try:
        with open(marker_path(cache_dir, repo_id, commit), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def marker_holds(marker: dict | None, manifest_files: list[dict] | None, level: str, cache_dir: str) -> bool:
    """True when a marker proves the snapshot verified at `level` (or stricter) and every file still has its
    size. `manifest_files`, when given, must equal the marker's files (same patterns, same Hub listing)."""
    if not marker or VERIFY_LEVELS.index(marker.get("verify", "size")) < VERIFY_LEVELS.index(level):
        return False
    if manifest_files is not None and marker.get("files") != manifest_files:
        return False
    return not missing_files(cache_dir, marker)


def with_patterns(manifest: dict, params: dict) -> dict:
    """The manifest with the patterns that chose its files: a marker counts only for the same choice."""
    return dict(
        manifest, allow_patterns=list(params["allow_patterns"]), ignore_patterns=list(params["ignore_patterns"])
    )


def same_patterns(marker: dict, params: dict) -> bool:
    return marker.get("allow_patterns") == list(params["allow_patterns"]) and marker.get("ignore_patterns") == list(
        params["ignore_patterns"]
    )


def strip(manifest: dict) -> dict:
    """The manifest alone, without a marker's bookkeeping."""
    keys = ("repo_id", "commit", "files", "bytes", "allow_patterns", "ignore_patterns")
    return {key: manifest[key] for key in keys if key in manifest}


def remove_files(cache_dir: str, manifest: dict, paths: Iterable[str]) -> None:
    """Drop the snapshot link of each path and the file it leads to (and the blob of the expected name), so the
    next download or copy brings it afresh."""
    by_path = {item["path"]: item for item in manifest["files"]}
    snapshot = snapshot_folder(cache_dir, manifest["repo_id"], manifest["commit"])
    for path in paths:
        link = os.path.join(snapshot, path)
        victims = {os.path.realpath(link), link, blob_path(cache_dir, manifest["repo_id"], by_path[path])}
        for victim in victims:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(victim)


def remove_damaged_blobs(cache_dir: str, manifest: dict, files: Iterable[dict]) -> None:
    """Delete what each file's link leads to, and its blob, when they have the wrong size: huggingface_hub trusts
    any blob already in place. A blob of the right size (perhaps shared with another snapshot) stays, and only its
    link is made again."""
    snapshot = snapshot_folder(cache_dir, manifest["repo_id"], manifest["commit"])
    for item in files:
        link = os.path.join(snapshot, item["path"])
        for path in {os.path.realpath(link), blob_path(cache_dir, manifest["repo_id"], item)}:
            size = _size_of(path)
            if size is not None and size != item["size"] and os.path.isfile(path):
                os.unlink(path)


# --- orphans of killed downloads ---------------------------------------------------------------------------------


def partial_files(cache_dir: str, repo_id: str) -> list[str]:
    """'*.incomplete' files in the repo's blobs folder, being written or left behind. huggingface_hub 2.x
    writes each download to '<etag>.<8 hex>.incomplete', a name unique to the process."""
    blobs = os.path.join(repo_folder(cache_dir, repo_id), "blobs")
    try:
        names = os.listdir(blobs)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(blobs, name) for name in names if name.endswith(".incomplete"))


def orphan_files(cache_dir: str, repo_id: str) -> list[str]:
    """Partial files no process is writing. huggingface_hub deletes its partial file on an exception, but a killed
    process leaves it behind, as large as what had arrived, and no later run reuses it. A download in progress
    holds huggingface_hub's lock '<cache_dir>/.locks/models--org--name/<etag>.lock' (flock); its file is kept."""
    locks = os.path.join(cache_dir, ".locks", os.path.basename(repo_folder(cache_dir, repo_id)))
    return [
        path
        for path in partial_files(cache_dir, repo_id)
        if not _locked(os.path.join(locks, os.path.basename(path).split(".")[0] + ".lock"))
    ]


def _locked(lock_file: str) -> bool:
    """True when another process holds an flock on `lock_file` (huggingface_hub's FileLock is an flock)."""
    import fcntl

    try:
        handle = open(lock_file, "rb")  # noqa: SIM115 - closed below, whatever happens
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        handle.close()
    return False


def remove_orphans(paths: Iterable[str]) -> int:
    """Delete the given partial files; returns the bytes freed. Call only while holding the prefetch lock."""
    freed = 0
    for path in paths:
        size = _size_of(path) or 0
        try:
            os.unlink(path)
            freed += size
        except FileNotFoundError:
            pass
    return freed


def incomplete_bytes(cache_dir: str, repo_id: str) -> int:
    """Bytes in partial downloads right now: what the progress report counts as arriving."""
    return sum(_size_of(path) or 0 for path in partial_files(cache_dir, repo_id))


# --- progress ----------------------------------------------------------------------------------------------------


def write_status_file(path: str, record: dict) -> None:
    """Replace the progress record at `path` (mode 0644, its folders made 0755 when missing); a watcher never reads
    half of it. Not flushed to disk: it is rewritten every second and means nothing after a reboot."""
    write_json_atomically(path, record, indent=1, fsync=False)


def progress_record(
    state: str,
    repo_id: str,
    started: float,
    *,
    commit: str | None = None,
    bytes_total: int = 0,
    bytes_done: int = 0,
    files_total: int = 0,
    files_done: int = 0,
    error: str | None = None,
) -> dict:
    """The status file's content: what a watcher needs to say how far a download or a verification has come."""
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    return {
        "state": state,
        "repo_id": repo_id,
        "commit": commit,
        "started": started,
        "updated": time.time(),
        "bytes_total": bytes_total,
        "bytes_done": min(bytes_done, bytes_total) if bytes_total else bytes_done,
        "files_total": files_total,
        "files_done": files_done,
        "error": error,
    }


def read_status_file(path: str) -> dict | None:
    """The record, or None when the job has not written one yet. Raises ValueError on a malformed file."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    if not isinstance(record, dict) or record.get("state") not in STATES:
        raise ValueError(f"{path} is not a progress record of hf_prefetch")
    return record


def format_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_message(record: dict | None, now: float) -> str:
    """One line for a person: 'Qwen/Qwen3-0.6B@abc1234: downloading 3.1 of 10.4 GB (2 of 5 files) after
    4m10s, 12.5 MB/s, about 9m45s left'."""
    if record is None:
        return "waiting for the prefetch to start"
    name = record["repo_id"] + (f"@{record['commit'][:7]}" if record.get("commit") else "")
    state = record["state"]
    if state == "failed":
        return f"{name}: failed: {record.get('error')}"
    if state == "resolving":
        return f"{name}: asking the Hub which files the revision holds"
    elapsed = max(now - record["started"], 0.0)
    done, total = record["bytes_done"], record["bytes_total"]
    line = (
        f"{name}: {state} {format_size(done)} of {format_size(total)} "
        f"({record['files_done']} of {record['files_total']} files) after {_duration(elapsed)}"
    )
    if state in ("downloading", "verifying") and elapsed >= 5 and done > 0:
        rate = done / elapsed
        line += f", {format_size(rate)}/s, about {_duration((total - done) / rate)} left"
    return line


def run_with_progress(work: Callable[[], object], report: Callable[[], None], interval: float = 1.0) -> object:
    """Run `work()` while a thread calls `report()` every `interval` seconds; returns what `work` returns."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            report()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        return work()
    finally:
        stop.set()
        thread.join()
        report()
