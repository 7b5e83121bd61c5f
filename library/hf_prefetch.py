#!/usr/bin/python
"""Ansible module hf_prefetch: a model's Hugging Face snapshot in the host's cache at a pinned commit, verified."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_prefetch
short_description: Download a Hugging Face model snapshot at a pinned revision and verify every byte
description:
  - Resolves O(revision) of O(repo_id) to a commit, lists the files of that commit through the Hub's tree API,
    downloads the missing ones with huggingface_hub into O(cache_dir) (huggingface_hub's own cache layout, the
    folder the vLLM unit mounts, so vLLM loads them offline), then verifies the snapshot.
  - Verification at O(verify=full) checks the size and sha256 of every LFS file and the size and git blob id of
    every other file against the Hub's tree listing (huggingface_hub does not hash what it downloads), parses
    every safetensors header with fastsafetensors, and checks that each C(*.safetensors.index.json) covers
    exactly the tensors its shards hold. Shards are hashed in parallel.
  - A file that fails is removed and fetched once more; if it fails again the module fails naming the file and
    what was wrong.
  - A verified snapshot leaves a marker (commit, files, sizes, hashes) under C(.sparkfleet/) in the repo's cache
    folder. A later run with a commit id as O(revision) finds the marker, checks the sizes and reports no change
    without contacting the Hub.
  - Partial downloads a killed run left behind (C(*.incomplete) blobs, as large as what had arrived) are
    removed before downloading; files that had completed are kept, so a rerun fetches only the rest.
  - The free space under O(cache_dir) is checked against the bytes still to fetch before the first byte moves.
  - With O(manifest) (the C(manifest) another host's run returned) nothing is downloaded. The files, delivered by
    other means (rsync from the host that fetched them), are verified against that manifest, which came from the Hub.
    Files that fail are removed, so that the next copy sends them again.
  - "Run it with C(async) and C(poll: 0) and retry M(job_watch) (O(job_watch#module:kind=fetch)) on O(status_file)
    until it is done, to show bytes, rate and time left while a large model arrives."
  - Needs huggingface_hub and fastsafetensors in the Python that runs it (the model_weights role creates a
    venv holding both and runs this module with it).
version_added: "0.1.0"
author: sparkfleet
options:
  repo_id:
    description: Model repository on the Hub, V(org/name).
    type: str
    required: true
  revision:
    description:
      - Branch, tag or 40-hex commit id. It is resolved to a commit, returned as RV(commit).
      - Pin a commit in production. A commit cannot move, so a rerun needs no network.
    type: str
    default: main
  allow_patterns:
    description: Only files whose path matches one of these fnmatch patterns (huggingface_hub's rule); all when empty.
    type: list
    elements: str
    default: []
  ignore_patterns:
    description: Files whose path matches one of these patterns are skipped, after O(allow_patterns).
    type: list
    elements: str
    default: []
  cache_dir:
    description:
      - huggingface_hub cache folder (the one holding C(models--org--name/)). On a Spark this is the folder the
        vLLM unit mounts as C(/root/.cache/huggingface/hub).
    type: path
    required: true
  token:
    description:
      - Hugging Face token for gated or private repositories. Never logged, and never in a message or the status
        file. Run with C(async), Ansible keeps a module's arguments in a file on the host while the job runs, so
        give O(token_file) instead.
    type: str
  token_file:
    description:
      - A root-only file holding the token (one line), read once when the module starts; what to use with
        C(async), so the token is not among the job's arguments on the host's disk. The model_weights role
        writes it to C(/run) (memory) for the fetch and removes it afterwards. Mutually exclusive with O(token).
    type: path
  endpoint:
    description: The Hub, or a mirror of it (the value huggingface_hub reads from C(HF_ENDPOINT)).
    type: str
    default: https://huggingface.co
  xet:
    description:
      - Whether huggingface_hub may use Xet storage. V(auto) allows it only for C(https://huggingface.co);
        mirrors usually do not speak Xet, and C(HF_HUB_DISABLE_XET) is then set.
    type: str
    choices: [auto, "true", "false"]
    default: auto
  verify:
    description:
      - V(full) checks sizes, sha256 / git blob ids, safetensors headers and the index.
      - V(size) checks sizes only. It is fast, but a flipped byte passes.
    type: str
    choices: [size, full]
    default: full
  recheck:
    description: Verify again even when a marker says the snapshot was verified (for a periodic audit).
    type: bool
    default: false
  marker_only:
    description:
      - Only look for the marker of a snapshot verified before, without asking the Hub. When O(revision) is a
        commit and its marker holds, report it as usual (RV(verified) is V(marker)); otherwise report
        RV(fetch_needed) and change nothing. A quick synchronous check before starting a fetch in the background.
    type: bool
    default: false
  manifest:
    description:
      - The RV(manifest) of a run on another host. With it the module never downloads. It only verifies the
        files already under O(cache_dir) against it, and fails naming each file that is missing or differs.
    type: dict
  status_file:
    description: JSON progress record for M(job_watch), rewritten about once a second.
    type: path
    default: /run/sparkfleet/hf-prefetch.json
  max_workers:
    description: Files downloaded at once.
    type: int
    default: 8
  hash_workers:
    description: Files hashed at once; V(0) means one per CPU, at most 8.
    type: int
    default: 0
  disk_reserve_gib:
    description: GiB that must stay free under O(cache_dir) after the download; checked before it starts.
    type: float
    default: 2.0
attributes:
  check_mode:
    support: full
    details: Resolves the revision and lists the files (read-only calls to the Hub), then reports what would be
      downloaded (RV(would_download), RV(bytes_to_download)) without writing anything.
  diff_mode:
    support: none
notes:
  - huggingface_hub 2.x resumes a download whose connection breaks within one run, but not across a killed
    process. This module keeps every completed file of a killed run and refetches only the rest.
"""

EXAMPLES = r"""
- name: Start fetching Qwen3-0.6B at its pinned commit
  hf_prefetch:
    repo_id: Qwen/Qwen3-0.6B
    revision: c1899de289a04d12100db370d81485cdf75e47ca
    cache_dir: /var/lib/sparkfleet/huggingface/hub
    token: "{{ hf_token | default(omit) }}"
  async: 86400
  poll: 0
  register: prefetch_job

- name: Verify on a second Spark what rsync delivered from the first
  hf_prefetch:
    repo_id: Qwen/Qwen3-0.6B
    cache_dir: /var/lib/sparkfleet/huggingface/hub
    manifest: "{{ hostvars[origin].prefetch.manifest }}"
"""

RETURN = r"""
commit:
  description: The commit O(revision) resolved to.
  returned: success
  type: str
  sample: c1899de289a04d12100db370d81485cdf75e47ca
snapshot_path:
  description: The folder vLLM loads the model from.
  returned: success
  type: str
  sample: /var/lib/sparkfleet/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/c1899de289a04d12
bytes_total:
  description: Size of the selected files.
  returned: always
  type: int
bytes_downloaded:
  description: Bytes fetched in this run (refetches included).
  returned: always
  type: int
downloaded:
  description: Paths fetched in this run.
  returned: always
  type: list
  elements: str
would_download:
  description: In check mode, the paths a real run would fetch.
  returned: check mode
  type: list
  elements: str
bytes_to_download:
  description: In check mode, the bytes a real run would fetch.
  returned: check mode
  type: int
refetched:
  description: Paths that failed verification once and were fetched again.
  returned: always
  type: list
  elements: str
orphans_removed:
  description: Partial downloads of a killed run that were deleted.
  returned: always
  type: list
  elements: str
verified:
  description: How this run checked the snapshot. V(marker) means a marker and the file sizes.
  returned: success
  type: str
  sample: full
manifest:
  description: Commit and files with sizes and hashes from the Hub, for O(manifest) on other hosts.
  returned: success
  type: dict
marker:
  description: Path of the marker that records the verified snapshot.
  returned: success
  type: str
fetch_needed:
  description: True when O(marker_only) found no marker that holds, so a full run must fetch or verify.
  returned: always
  type: bool
"""

import os
import re
import sys
import time

from ansible.module_utils.basic import AnsibleModule
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
    repo_folder,
    run_with_progress,
    snapshot_folder,
    write_marker,
    write_status_file,
)
from ansible.module_utils.input_rules import hf_repo

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


def read_token_file(module: AnsibleModule) -> None:
    """Take the token from token_file, and keep it out of every message from here on (no_log_values)."""
    path = module.params["token_file"]
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as error:
        module.fail_json(msg=f"token_file {path} cannot be read: {error.strerror}")
    if token:  # an empty no_log value would mask every string of the output
        module.no_log_values.add(token)
    module.params["token"] = token or None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "allow_patterns": {"type": "list", "elements": "str", "default": []},
            "ignore_patterns": {"type": "list", "elements": "str", "default": []},
            "cache_dir": {"type": "path", "required": True},
            "token": {"type": "str", "no_log": True},
            "token_file": {"type": "path"},
            "endpoint": {"type": "str", "default": HUB},
            "xet": {"type": "str", "choices": ["auto", "true", "false"], "default": "auto"},
            "verify": {"type": "str", "choices": ["size", "full"], "default": "full"},
            "recheck": {"type": "bool", "default": False},
            "marker_only": {"type": "bool", "default": False},
            "manifest": {"type": "dict"},
            "status_file": {"type": "path", "default": "/run/sparkfleet/hf-prefetch.json"},
            "max_workers": {"type": "int", "default": 8},
            "hash_workers": {"type": "int", "default": 0},
            "disk_reserve_gib": {"type": "float", "default": 2.0},
        },
        supports_check_mode=True,
        mutually_exclusive=[("token", "token_file")],
    )
    if module.params["token_file"]:
        read_token_file(module)
    problem = input_problem(module.params)
    if problem:
        module.fail_json(msg=problem + ".")
    prepare_environment(module.params)
    # World-readable files and folders whatever the login's umask: the origin's share reads them as nobody.
    os.umask(0o022)
    try:
        import fastsafetensors  # noqa: F401 - imported here only to fail early with a clear message
        import huggingface_hub  # noqa: F401
    except ImportError as error:
        module.fail_json(
            msg=f"{error.name} cannot be imported by {sys.executable}; run hf_prefetch with the venv the "
            "model_weights role creates (ansible_python_interpreter), or install huggingface_hub and fastsafetensors"
        )
    prefetch = Prefetch(module)
    if module.check_mode:
        prefetch.run()
        return
    with repo_lock(module, repo_folder(module.params["cache_dir"], module.params["repo_id"])):
        prefetch.run()


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


if __name__ == "__main__":
    main()
