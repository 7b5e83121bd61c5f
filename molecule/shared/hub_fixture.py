"""What the verify steps need to know about the stand-in Hub each simulated Spark runs on its loopback: the
fixture model's files and hashes (as the controller built them), the Hub's byte counters, and where
huggingface_hub's cache puts a snapshot on the host."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import yaml

PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
RECIPE = yaml.safe_load((PROJECT / "recipes" / "qwen3-0.6b.yml").read_text(encoding="utf-8"))
REPO = RECIPE["hf_repo"]
REVISION = RECIPE["hf_revision"]
CACHE = "/var/lib/sparkfleet/huggingface/hub"
REPO_FOLDER = f"{CACHE}/models--{REPO.replace('/', '--')}"
SNAPSHOT = f"{REPO_FOLDER}/snapshots/{REVISION}"
MARKER = f"{REPO_FOLDER}/.sparkfleet/verified-{REVISION}.json"
HUB = "http://127.0.0.1:8480"


def fixture_sha256() -> dict[str, str]:
    """{path: sha256} of every file of the fixture model, from the folder the stand-in Hub serves."""
    folder = PROJECT / ".cache" / "fixtures" / "hf" / REPO / REVISION
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def fixture_bytes() -> int:
    folder = PROJECT / ".cache" / "fixtures" / "hf" / REPO / REVISION
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def hub_stats(host) -> dict:
    """The stand-in Hub's counters on that host (bytes of file bodies served since it started)."""
    return json.loads(host.check_output(f"curl -fsS {HUB}/_standin/stats"))


def snapshot_sha256(host) -> dict[str, str]:
    """{path: sha256} of the snapshot on the host, read through its symlinks, as vLLM reads it."""
    listing = host.check_output(f"cd {SNAPSHOT} && find -L . -type f -exec sha256sum {{}} +")
    return {line.split(maxsplit=1)[1].removeprefix("./"): line.split()[0] for line in sorted(listing.splitlines())}
