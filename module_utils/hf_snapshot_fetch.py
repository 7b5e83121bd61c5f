"""One hf_prefetch run: a Hugging Face snapshot resolved, downloaded with huggingface_hub into its cache and
verified (hf_snapshot.py's checks), with progress in a status file for job_watch.

Prefetch ends the run through the module it is given, an AnsibleModule or anything with the same `params`,
`check_mode`, `fail_json` and `exit_json`: those two never return. huggingface_hub is imported only where it is
used, after prepare_environment has set the HF_* variables it reads when first imported.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING

from ansible.module_utils.hf_snapshot import (
    LOCK_FILE,
    ByteCounter,
    bytes_to_fetch,
    disk_problem,
    file_problems,
    header_problems,
    incomplete_bytes,
    index_problems,
    is_commit,
    manifest_from_tree,
    manifest_problem,
    marker_holds,
    marker_path,
    missing_files,
    orphan_files,
    progress_record,
    read_marker,
    remove_damaged_blobs,
    remove_files,
    remove_orphans,
    run_with_progress,
    same_patterns,
    snapshot_folder,
    strip,
    with_patterns,
    write_marker,
    write_status_file,
)
from ansible.module_utils.input_rules import hf_repo

if TYPE_CHECKING:
    from ansible.module_utils.basic import AnsibleModule

HUB = "https://huggingface.co"


class Prefetch:
    """One run of the module: the Hub client, the status file, and the failure path that keeps both honest."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.repo_id = module.params["repo_id"]
        self.cache_dir = module.params["cache_dir"]
        self.started = time.time()
        self.commit: str | None = None
        self.result: dict = {
            "changed": False,
            "bytes_total": 0,
            "bytes_downloaded": 0,
            "downloaded": [],
            "refetched": [],
            "orphans_removed": [],
            "fetch_needed": False,
        }

    # --- reporting ---------------------------------------------------------------------------------------------

    def status(self, state: str, **figures) -> None:
        if self.module.check_mode:
            return
        record = progress_record(state, self.repo_id, self.started, commit=self.commit, **figures)
        write_status_file(self.params["status_file"], record)

    def fail(self, msg: str) -> None:
        msg = self.hide_token(msg)
        self.status("failed", error=msg)
        self.module.fail_json(msg=msg, **dict(self.result, commit=self.commit))

    def hide_token(self, text: str) -> str:
        token = self.params.get("token")
        return text.replace(token, "********") if token else text

    # --- the Hub -----------------------------------------------------------------------------------------------

    def hub_error(self, error: Exception, doing: str) -> None:
        """Fail with what a person can act on: which repository, revision or file, and what to change."""
        from huggingface_hub import errors

        where = f"{self.repo_id}@{self.params['revision']} on {self.params['endpoint']}"
        status = getattr(getattr(error, "response", None), "status_code", None)
        if isinstance(error, errors.GatedRepoError):
            self.fail(f"{where} is gated: accept its licence on the Hub with the account of the token, then rerun")
        if isinstance(error, errors.RevisionNotFoundError):
            self.fail(f"revision {self.params['revision']!r} does not exist in {self.repo_id}; check hf_revision")
        # The Hub answers "not found" for a private repository the request may not see, token or not.
        if isinstance(error, errors.RepositoryNotFoundError):
            if self.params.get("token"):
                self.fail(
                    f"{self.repo_id} was not found on {self.params['endpoint']}, or the token given has no access "
                    "to it; check hf_repo, and the token's permissions"
                )
            self.fail(
                f"{self.repo_id} was not found on {self.params['endpoint']} (or is private or gated and no token "
                "was given); check hf_repo, or set a token (model_weights_hf_token / vllm_server_hf_token)"
            )
        if status == 401:
            self.fail(
                f"{where} refused the token (HTTP 401): the token is invalid or expired; set a valid Hugging Face "
                "token (model_weights_hf_token / vllm_server_hf_token)"
            )
        self.fail(f"{doing} {where} failed: {type(error).__name__}: {error}")

    def resolve_manifest(self) -> dict:
        from huggingface_hub import HfApi

        self.status("resolving")
        api = HfApi(endpoint=self.params["endpoint"], token=self.params.get("token") or False)
        try:
            self.commit = api.model_info(self.repo_id, revision=self.params["revision"]).sha
            entries = [
                {
                    "type": "file",
                    "path": entry.path,
                    "size": entry.size,
                    "oid": entry.blob_id,
                    "lfs": {"oid": entry.lfs.sha256, "size": entry.lfs.size} if entry.lfs else None,
                }
                for entry in api.list_repo_tree(self.repo_id, revision=self.commit, recursive=True)
                if hasattr(entry, "blob_id")
            ]
        except Exception as error:
            self.hub_error(error, "listing")
        manifest = manifest_from_tree(
            self.repo_id, self.commit, entries, self.params["allow_patterns"], self.params["ignore_patterns"]
        )
        if not any(item["path"].endswith(".safetensors") for item in manifest["files"]):
            self.fail(
                f"no .safetensors file of {self.repo_id}@{self.commit} matches allow_patterns="
                f"{self.params['allow_patterns']} and ignore_patterns={self.params['ignore_patterns']}: vLLM would "
                "find no weights; widen the patterns (model_weights_allow_patterns / model_weights_ignore_patterns)"
            )
        if not manifest["files"]:
            self.fail(
                f"no file of {self.repo_id}@{self.commit} matches allow_patterns={self.params['allow_patterns']} "
                f"and ignore_patterns={self.params['ignore_patterns']}; widen the patterns"
            )
        return with_patterns(manifest, self.params)

    def download(self, manifest: dict, files: list[dict]) -> None:
        """Fetch `files` with huggingface_hub, several at once, reporting bytes as they arrive."""
        from concurrent.futures import ThreadPoolExecutor

        from huggingface_hub import hf_hub_download

        total = bytes_to_fetch(self.cache_dir, manifest, files)
        done_files: list[dict] = []

        def fetch(item: dict) -> None:
            hf_hub_download(
                self.repo_id,
                item["path"],
                revision=manifest["commit"],
                cache_dir=self.cache_dir,
                token=self.params.get("token") or False,
                endpoint=self.params["endpoint"],
            )
            done_files.append(item)

        def report() -> None:
            arrived = sum(i["size"] for i in done_files) + incomplete_bytes(self.cache_dir, self.repo_id)
            self.status(
                "downloading",
                bytes_total=total,
                bytes_done=arrived,
                files_total=len(files),
                files_done=len(done_files),
            )

        def work() -> None:
            with ThreadPoolExecutor(max_workers=max(1, self.params["max_workers"])) as pool:
                for future in [pool.submit(fetch, item) for item in files]:
                    future.result()

        try:
            run_with_progress(work, report)
        except Exception as error:
            self.hub_error(error, "downloading from")
        self.result["bytes_downloaded"] += total
        self.result["downloaded"] += [item["path"] for item in files]

    # --- verification ------------------------------------------------------------------------------------------

    def problems(self, manifest: dict, files: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
        """({path: what is wrong with its bytes}, {path: what is wrong with its content}) at the requested level,
        with progress in the status file. Bytes: size and hash against the Hub's listing; a refetch can mend
        them. Content, looked at only once every file's bytes match the Hub's: safetensors headers and the
        shard index; a refetch would bring the same bytes back, so these are the repository's (or the parser's)."""
        level = self.params["verify"]
        snapshot = snapshot_folder(self.cache_dir, self.repo_id, manifest["commit"])
        counter = ByteCounter()
        total = sum(item["size"] for item in files) if level == "full" else 0

        def report() -> None:
            self.status("verifying", bytes_total=total, bytes_done=counter.value, files_total=len(files))

        damaged = run_with_progress(lambda: file_problems(snapshot, files, level, self.hash_workers(), counter), report)
        if level != "full" or damaged:
            return damaged, {}
        content, tensors = header_problems(snapshot, manifest["files"])
        if not content:
            content = index_problems(snapshot, manifest["files"], tensors)
        return damaged, content

    def hash_workers(self) -> int:
        return self.params["hash_workers"] or min(os.cpu_count() or 1, 8)

    def verify_or_refetch(self, manifest: dict) -> None:
        handed_over = self.params.get("manifest") is not None
        damaged, content = self.problems(manifest, manifest["files"])
        if damaged and not handed_over:
            # One more fetch: a byte flipped on the way or a shard cut short by a crash usually comes right.
            remove_files(self.cache_dir, manifest, damaged)
            self.result["refetched"] = sorted(damaged)
            self.download(manifest, [item for item in manifest["files"] if item["path"] in damaged])
            damaged, content = self.problems(manifest, manifest["files"])
        if damaged:
            if handed_over:
                # Gone, so that the next copy from the origin sends them again (rsync skips a file whose size
                # and time match, even when its bytes do not).
                remove_files(self.cache_dir, manifest, damaged)
            where = "after one refetch " if self.result["refetched"] else ""
            lines = "; ".join(f"{path}: {problem}" for path, problem in sorted(damaged.items()))
            advice = (
                "the origin host delivered these files; they were removed, copy them again"
                if handed_over
                else "the source serves these bytes; check the mirror, or report the repository to its owner"
            )
            self.fail(f"{self.repo_id}@{manifest['commit']} failed verification {where}({lines}); {advice}")
        if content:
            lines = "; ".join(f"{path}: {problem}" for path, problem in sorted(content.items()))
            self.fail(
                f"{self.repo_id}@{manifest['commit']} is inconsistent ({lines}). Every file matches the Hub's "
                "hashes: if allow_patterns or ignore_patterns left files out, widen them; otherwise the repository "
                "itself is broken at this commit (pin another revision), or fastsafetensors cannot read a dtype it uses"
            )

    # --- the whole run -----------------------------------------------------------------------------------------

    def run(self) -> None:
        handed_over = self.params.get("manifest")
        if handed_over is not None:
            manifest = with_patterns(dict(handed_over, repo_id=self.repo_id), self.params)
            self.commit = manifest["commit"]
        elif is_commit(self.params["revision"]) and self.already_verified(self.params["revision"], None):
            return
        elif self.params["marker_only"]:
            self.module.exit_json(changed=False, fetch_needed=True)
        else:
            manifest = self.resolve_manifest()
        self.result.update(commit=manifest["commit"], bytes_total=manifest["bytes"], manifest=strip(manifest))
        if self.already_verified(manifest["commit"], manifest):
            return

        missing = missing_files(self.cache_dir, manifest)
        if handed_over is not None and missing and not self.module.check_mode:
            self.fail(
                f"{len(missing)} file(s) of {self.repo_id}@{self.commit} did not arrive from the origin host: "
                + ", ".join(item["path"] for item in missing[:10])
                + "; rerun to send them again"
            )
        orphans = orphan_files(self.cache_dir, self.repo_id)
        reserve = int(self.params["disk_reserve_gib"] * 2**30)
        if self.module.check_mode:
            # Orphans and damaged blobs would be removed first: their bytes count as free.
            freed = sum(os.path.getsize(path) for path in orphans if os.path.exists(path))
            self.finish(
                manifest,
                changed=True,
                verified=None,
                would_download=[item["path"] for item in missing],
                bytes_to_download=bytes_to_fetch(self.cache_dir, manifest, missing),
                orphans_found=orphans,
                disk_problem=disk_problem(
                    self.cache_dir, bytes_to_fetch(self.cache_dir, manifest, missing), reserve - freed
                ),
            )
        # Space first: a killed run's partial files and blobs of the wrong size take room the download needs.
        self.result["orphans_removed"] = orphans
        remove_orphans(orphans)
        remove_damaged_blobs(self.cache_dir, manifest, missing)
        problem = disk_problem(self.cache_dir, bytes_to_fetch(self.cache_dir, manifest, missing), reserve)
        if problem:
            self.fail(f"not downloading {self.repo_id}@{self.commit}: {problem}")
        if missing:
            self.download(manifest, missing)
        self.verify_or_refetch(manifest)
        self.result["marker"] = write_marker(self.cache_dir, strip(manifest), self.params["verify"])
        self.finish(manifest, changed=True, verified=self.params["verify"])

    def already_verified(self, commit: str, manifest: dict | None) -> bool:
        """True (and the module has exited) when a marker shows this snapshot verified and the sizes still hold."""
        if self.params["recheck"]:
            return False
        marker = read_marker(self.cache_dir, self.repo_id, commit)
        if marker is None or not same_patterns(marker, self.params):
            return False
        if not marker_holds(marker, manifest["files"] if manifest else None, self.params["verify"], self.cache_dir):
            return False
        self.commit = commit
        self.result.update(commit=commit, bytes_total=marker["bytes"], manifest=strip(marker))
        self.result["marker"] = marker_path(self.cache_dir, self.repo_id, commit)
        self.finish(marker, changed=False, verified="marker")
        return True

    def finish(self, manifest: dict, changed: bool, verified: str | None, **extra) -> None:
        self.status("done", bytes_total=manifest["bytes"], bytes_done=manifest["bytes"],
                    files_total=len(manifest["files"]), files_done=len(manifest["files"]))  # fmt: skip
        self.result.update(extra)
        self.result["changed"] = changed or bool(self.result["orphans_removed"])
        self.module.exit_json(
            snapshot_path=snapshot_folder(self.cache_dir, self.repo_id, manifest["commit"]),
            verified=verified,
            **self.result,
        )


def prepare_environment(params: dict) -> None:
    """huggingface_hub reads these when it is imported, so they are set before the first import."""
    os.environ["HF_ENDPOINT"] = params["endpoint"]
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # progress goes to the status file, not to stderr
    os.environ.pop("HF_HUB_OFFLINE", None)
    # Files stay inside the repo's own folder (no cache-wide store of Xet chunks linked from it), so that a peer
    # copying models--org--name/ gets every byte, and removing a damaged file removes its bytes.
    os.environ["HF_HUB_DISABLE_SHARED_BLOBS"] = "1"
    xet = params["xet"] == "true" or (params["xet"] == "auto" and params["endpoint"].rstrip("/") == HUB)
    if not xet:
        os.environ["HF_HUB_DISABLE_XET"] = "1"


def input_problem(params: dict) -> str | None:
    repo_problem = hf_repo(params["repo_id"])
    if repo_problem:
        return f"repo_id={params['repo_id']!r} {repo_problem}"
    if not os.path.isabs(params["cache_dir"]):
        return f"cache_dir={params['cache_dir']!r} must be an absolute path"
    if not re.match(r"^https?://[^/\s]+", params["endpoint"]):
        return f"endpoint={params['endpoint']!r} is not an http(s) URL such as {HUB}"
    if "@" in params["endpoint"].split("/")[2]:
        return "endpoint carries credentials (user:password@); give the mirror's token in token instead"
    if params["manifest"] is not None:
        return manifest_problem(params["manifest"])
    if not params["revision"]:
        return "revision is empty; give a branch, a tag or a 40-hex commit id"
    return None


class repo_lock:
    """An exclusive lock on the repo's cache folder: two prefetches of one model would delete each other's partial
    files. The kernel drops it when a killed run's process ends, so it never goes stale."""

    def __init__(self, module: AnsibleModule, folder: str) -> None:
        self.module = module
        self.path = os.path.join(folder, LOCK_FILE)

    def __enter__(self) -> repo_lock:
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        self.handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.module.fail_json(msg=f"another hf_prefetch is running on {os.path.dirname(self.path)}; wait for it")
        return self

    def __exit__(self, *_exc) -> None:
        self.handle.close()
