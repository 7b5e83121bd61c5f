"""Helpers for tests that need the stand-in Hugging Face Hub (tests/standins/hf_hub): build its fixture repos,
run it on a free local port, drive its faults and read its stats.

Import it as `from helpers import hf_standin` (tests/conftest.py puts tests/ on sys.path).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
STANDIN = TESTS / "standins" / "hf_hub" / "hf_hub_standin.py"
BUILDER = TESTS / "fixtures" / "build_hf_models.py"
# A readiness wait sized for a loaded 2-core machine: a slow start only waits longer; a dead process fails at once.
START_TIMEOUT_S = 300


@functools.cache
def builder() -> ModuleType:
    """tests/fixtures/build_hf_models.py as a module (its repo ids, token and write_repo); loaded once."""
    spec = importlib.util.spec_from_file_location("build_hf_models", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_hf_models"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@functools.cache
def figure_builder() -> ModuleType:
    """tests/fixtures/build_figure_models.py as a module (the model repos hf_model_figures reads); loaded once."""
    path = TESTS / "fixtures" / "build_figure_models.py"
    spec = importlib.util.spec_from_file_location("build_figure_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_figure_models"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def publish_commit(root: Path, repo_id: str, commit: str) -> None:
    """A one-file repo (its config.json names the commit) whose main branch is `commit`: a rewrite moves the branch,
    as a new commit on the Hub does."""
    builder().write_repo(root, repo_id, commit, {"config.json": json.dumps({"commit": commit}).encode()})


def build_fixture_models(outdir: Path, shard_mib: float = 4) -> Path:
    """Build (or keep, when current) the fixture repos in OUTDIR through the builder's CLI; returns OUTDIR."""
    command = [sys.executable, str(BUILDER), str(outdir), "--shard-mib", str(shard_mib)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    return Path(outdir)


def _read_first_line(process: subprocess.Popen[bytes], log: Path) -> str:
    """The stand-in's `listening on URL` line, or an error with its log when it does not come in time."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline().decode().strip() if ready else ""
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        raise RuntimeError(f"hf_hub stand-in did not start ({line!r}); log:\n{log.read_text()}")
    return line.removeprefix("listening on ")


@contextmanager
def running_standin(root: Path, log: Path | None = None) -> Iterator[str]:
    """Run the stand-in over ROOT on 127.0.0.1 and a free port; yields its base URL (the client's `endpoint`).

    Its stderr (one line per request) goes to LOG, by default ROOT/standin.log (the stand-in ignores files
    at the top of its root). Stopped with SIGTERM on exit."""
    log = log or Path(root) / "standin.log"
    command = [sys.executable, str(STANDIN), "--root", str(root), "--host", "127.0.0.1", "--port", "0"]
    with log.open("ab") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=dict(os.environ))
    try:
        yield _read_first_line(process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def stats(base_url: str) -> dict[str, Any]:
    """GET /_standin/stats."""
    with urllib.request.urlopen(f"{base_url}/_standin/stats", timeout=10) as response:
        return json.load(response)


def reset(base_url: str) -> None:
    """POST /_standin/reset: zero the stats and the fault counters."""
    request = urllib.request.Request(f"{base_url}/_standin/reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


def set_faults(root: Path, faults: list[dict[str, Any]]) -> None:
    """Write ROOT/faults.json (read by the stand-in at every request); [] removes it."""
    path = Path(root) / "faults.json"
    if faults:
        path.write_text(json.dumps(faults))
    else:
        path.unlink(missing_ok=True)


def set_lfs_redirect(root: Path, base_url: str | None) -> None:
    """Make the stand-in answer LFS files with the Hub's 302 to a CDN at BASE_URL (another host name for the same
    stand-in, e.g. http://localhost:PORT when the client uses http://127.0.0.1:PORT); None serves them directly."""
    path = Path(root) / "lfs_redirect.json"
    if base_url:
        path.write_text(json.dumps({"base": base_url}))
    else:
        path.unlink(missing_ok=True)


# --- the fixture repos, as the tests of hf_prefetch read and extend them ----------------------------------------


def fixture_files(root: Path, repo_id: str, commit: str) -> dict[str, bytes]:
    """Every file of a fixture repo at COMMIT, by its path in the repo."""
    folder = root.joinpath(*repo_id.split("/"), commit)
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def add_big_repo(root: Path, repo_id: str, mib: int = 24) -> tuple[str, dict[str, bytes]]:
    """A repo with one shard larger than huggingface_hub's 10 MiB download chunk, so a cut can resume; returns
    (its commit, its files)."""
    build = builder()
    tensors = [(f"layer.{i}.weight", (1024, 1024)) for i in range(mib // 2)]
    files = {"config.json": b'{"model_type": "test"}\n', "model.safetensors": build.safetensors_bytes(tensors, 3)}
    commit = build.commit_sha(repo_id, files)
    build.write_repo(root, repo_id, commit, files)
    return commit, files


def assert_snapshot_equals(cache: Path, files: dict[str, bytes], repo_id: str, commit: str) -> None:
    """The snapshot of REPO_ID@COMMIT in the huggingface_hub cache CACHE holds exactly FILES' bytes."""
    from hf_snapshot import snapshot_folder  # module_utils/, on sys.path through tests/conftest.py

    snapshot = Path(snapshot_folder(str(cache), repo_id, commit))
    for path, content in files.items():
        assert (snapshot / path).read_bytes() == content, path
