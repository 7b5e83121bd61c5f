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
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hf_snapshot import repo_folder
from ansible.module_utils.hf_snapshot_fetch import HUB, Prefetch, input_problem, prepare_environment, repo_lock


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


if __name__ == "__main__":
    main()
