"""What the verify steps need to know about the stand-in Hub each simulated Spark runs on its loopback: a fixture
model's files and hashes (as the controller built them), the Hub's byte counters, and where huggingface_hub's
cache puts a snapshot on the host.

    MODEL = recipe_repo("smollm2-135m-instruct")   # the recipe the scenario serves
    MODEL.snapshot, MODEL.marker, MODEL.files_sha256(), MODEL.snapshot_sha256(host)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
CACHE = "/var/lib/sparkfleet/huggingface/hub"
HUB = "http://127.0.0.1:8480"


@dataclass(frozen=True)
class FixtureRepo:
    """One fixture repo of the stand-in Hub at one commit, and where its snapshot lands on a host."""

    repo: str
    revision: str

    @property
    def repo_folder(self) -> str:
        return f"{CACHE}/models--{self.repo.replace('/', '--')}"

    @property
    def snapshot(self) -> str:
        return f"{self.repo_folder}/snapshots/{self.revision}"

    @property
    def marker(self) -> str:
        return f"{self.repo_folder}/.sparkfleet/verified-{self.revision}.json"

    @property
    def _fixture_folder(self) -> Path:
        return PROJECT / ".cache" / "fixtures" / "hf" / self.repo / self.revision

    def files_sha256(self) -> dict[str, str]:
        """{path: sha256} of every file of the fixture model, from the folder the stand-in Hub serves."""
        folder = self._fixture_folder
        return {
            str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }

    def files_bytes(self) -> int:
        return sum(path.stat().st_size for path in self._fixture_folder.rglob("*") if path.is_file())

    def snapshot_sha256(self, host) -> dict[str, str]:
        """{path: sha256} of the snapshot on the host, read through its symlinks, as vLLM reads it."""
        listing = host.check_output(f"cd {self.snapshot} && find -L . -type f -exec sha256sum {{}} +")
        return {line.split(maxsplit=1)[1].removeprefix("./"): line.split()[0] for line in sorted(listing.splitlines())}


def recipe_repo(recipe: str) -> FixtureRepo:
    """The fixture repo of one recipe, at the commit the recipe pins."""
    settings = yaml.safe_load((PROJECT / "recipes" / f"{recipe}.yml").read_text(encoding="utf-8"))
    return FixtureRepo(settings["hf_repo"], settings["hf_revision"])


def hub_stats(host) -> dict:
    """The stand-in Hub's counters on that host (bytes of file bodies served since it started)."""
    return json.loads(host.check_output(f"curl -fsS {HUB}/_standin/stats"))
