"""hf_prefetch in-process (tests/unit/conftest.py's run_module) against the stand-in Hugging Face Hub
(tests/standins/hf_hub) on loopback: a clean download, a rerun that changes nothing, a cut connection, bytes
damaged on the way, a truncated shard, a broken index, a wrong token, a missing revision, a full disk, check mode
and the peer verification of the fleet fan-out. A run killed mid-download, and the -vvv output that must not
show a token, need Ansible's own processes: tests/integration/test_hf_prefetch_ansible.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import hf_snapshot as snap
import pytest
from helpers import ROOT, hf_standin
from helpers.hf_standin import add_big_repo, assert_snapshot_equals

build = hf_standin.builder()
QWEN = build.QWEN
COMMIT = build.pinned_revision()
SHARD = build.SHARDS[0]
# An endpoint nobody serves: a rerun that the marker settles must not need the Hub at all.
DEAD_ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in Hub over fresh fixture repos: (base URL, its root folder)."""
    root = hf_standin.build_fixture_models(tmp_path_factory.mktemp("hub"))
    with hf_standin.running_standin(root) as url:
        yield url, root


@pytest.fixture(scope="module", autouse=True)
def huggingface_hub_as_hf_prefetch_imports_it(hub):
    """huggingface_hub reads its HF_* settings once, when it is imported, and hf_prefetch sets them just before its
    first import of it, in a process of its own. In this process another test file may have imported it already,
    under other settings: these tests get a huggingface_hub imported afresh under hf_prefetch's settings (its own
    prepare_environment), and the one from before is put back afterwards."""

    def ours() -> list[str]:
        return [name for name in sys.modules if name.split(".")[0] == "huggingface_hub"]

    before = {name: sys.modules.pop(name) for name in ours()}
    spec = importlib.util.spec_from_file_location("hf_prefetch_settings", ROOT / "library" / "hf_prefetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    environ = dict(os.environ)
    os.environ.pop("HF_TOKEN", None)  # as the prefetch fixture does for every run
    try:
        module.prepare_environment({"endpoint": hub[0], "xet": "auto"})
        import huggingface_hub  # noqa: F401 -- it reads its settings now
    finally:
        os.environ.clear()
        os.environ.update(environ)
    yield
    for name in ours():
        del sys.modules[name]
    sys.modules.update(before)


@pytest.fixture(autouse=True)
def clean_hub(hub):
    url, root = hub
    hf_standin.set_faults(root, [])
    hf_standin.reset(url)
    yield
    hf_standin.set_faults(root, [])


@pytest.fixture
def prefetch(run_module, monkeypatch):
    """prefetch(cache, endpoint, check=False, **options): hf_prefetch's result for QWEN@COMMIT by default, with
    no token from this machine's environment."""
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def run(cache: Path, endpoint: str, check: bool = False, **options) -> dict:
        args = {"repo_id": QWEN, "revision": COMMIT, "cache_dir": str(cache), "endpoint": endpoint}
        args.update({"status_file": str(cache.parent / "status.json"), "disk_reserve_gib": 0, **options})
        return run_module("hf_prefetch", args, check_mode=check)

    return run


def fixture_files(root: Path, repo_id: str = QWEN, commit: str = COMMIT) -> dict[str, bytes]:
    return hf_standin.fixture_files(root, repo_id, commit)


def assert_snapshot_is(cache: Path, files: dict[str, bytes], repo_id: str = QWEN, commit: str = COMMIT) -> None:
    assert_snapshot_equals(cache, files, repo_id, commit)


def test_a_clean_download_lands_in_the_hf_cache_verified_and_a_rerun_changes_nothing(prefetch, hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    first = prefetch(cache, url)
    files = fixture_files(root)
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True and first["verified"] == "full"
    assert first["commit"] == COMMIT
    assert sorted(first["downloaded"]) == sorted(files)
    assert first["bytes_downloaded"] == first["bytes_total"] == sum(len(c) for c in files.values())
    assert_snapshot_is(cache, files)
    shard_sha = hashlib.sha256(files[SHARD]).hexdigest()
    assert {"path": SHARD, "size": len(files[SHARD]), "sha256": shard_sha} in first["manifest"]["files"]
    marker = json.loads(Path(first["marker"]).read_text())
    assert marker["commit"] == COMMIT and marker["verify"] == "full"
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "done" and status["bytes_done"] == first["bytes_total"]

    # The commit is pinned and the marker holds: the rerun does not even need the Hub.
    again = prefetch(cache, DEAD_ENDPOINT)
    assert again.get("failed") is not True, again.get("msg")
    assert again["changed"] is False and again["verified"] == "marker" and again["downloaded"] == []
    assert hf_standin.stats(url)["get_requests"] == len(files)


def test_marker_only_recognises_a_verified_snapshot_and_otherwise_asks_for_a_fetch(prefetch, hub, tmp_path):
    # The quick synchronous look model_weights takes before it starts a fetch in the background: never the Hub.
    url, _ = hub
    cache = tmp_path / "hub"
    before = prefetch(cache, DEAD_ENDPOINT, marker_only=True)
    assert before.get("failed") is not True, before.get("msg")
    assert before["changed"] is False and before["fetch_needed"] is True
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))

    fetched = prefetch(cache, url)
    assert fetched["changed"] is True and fetched["fetch_needed"] is False
    after = prefetch(cache, DEAD_ENDPOINT, marker_only=True)
    assert after["changed"] is False and after["fetch_needed"] is False and after["verified"] == "marker"
    assert after["snapshot_path"] == fetched["snapshot_path"]

    # A shard gone from the snapshot: the marker no longer holds, so a full run must look again.
    next(Path(fetched["snapshot_path"]).glob("*.safetensors")).unlink()
    gone = prefetch(cache, DEAD_ENDPOINT, marker_only=True)
    assert gone["fetch_needed"] is True and gone["changed"] is False
    # A branch cannot be settled without the Hub: marker_only asks for a full run rather than asking the Hub.
    branch = prefetch(cache, DEAD_ENDPOINT, marker_only=True, revision="main")
    assert branch["fetch_needed"] is True and branch.get("failed") is not True


def test_check_mode_reports_what_would_be_downloaded_and_writes_nothing(prefetch, hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    result = prefetch(cache, url, check=True)
    files = fixture_files(root)
    assert result["changed"] is True
    assert sorted(result["would_download"]) == sorted(files)
    assert result["bytes_to_download"] == sum(len(c) for c in files.values())
    assert not cache.exists() and not (tmp_path / "status.json").exists()
    assert hf_standin.stats(url)["get_requests"] == 0


def test_a_branch_is_resolved_to_its_commit(prefetch, hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, revision="main")
    assert result["commit"] == COMMIT and result["changed"] is True


def test_a_connection_cut_mid_file_is_resumed_with_a_range_request(prefetch, hub, tmp_path):
    url, root = hub
    commit, files = add_big_repo(root, "sparkfleet-test/big-shard")
    cut_at = 15 * 2**20  # past the first whole 10 MiB chunk, which the client keeps
    hf_standin.set_faults(
        root, [{"repo": "sparkfleet-test/big-shard", "path": "model.safetensors", "kind": "cut", "offset": cut_at}]
    )
    result = prefetch(tmp_path / "hub", url, repo_id="sparkfleet-test/big-shard", revision=commit)
    assert result.get("failed") is not True, result.get("msg")
    assert result["refetched"] == []
    assert_snapshot_is(tmp_path / "hub", files, "sparkfleet-test/big-shard", commit)
    stats = hf_standin.stats(url)
    assert stats["faults_applied"] == 1 and stats["range_requests"] == 1
    # Resumed, not restarted: less than the file plus the bytes before the cut crossed the wire.
    assert (
        stats["bytes_served"]["sparkfleet-test/big-shard/model.safetensors"] < len(files["model.safetensors"]) + cut_at
    )


def test_a_byte_flipped_on_the_way_is_detected_refetched_once_and_then_passes(prefetch, hub, tmp_path):
    url, root = hub
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD, "kind": "flip", "offset": 1_000_000}])
    result = prefetch(tmp_path / "hub", url)
    assert result.get("failed") is not True, result.get("msg")
    assert result["refetched"] == [SHARD]
    assert_snapshot_is(tmp_path / "hub", fixture_files(root))


def test_a_source_that_keeps_serving_a_flipped_byte_fails_naming_the_file_and_the_hash(prefetch, hub, tmp_path):
    url, root = hub
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD, "kind": "flip", "offset": 1_000_000, "times": 2}])
    result = prefetch(tmp_path / "hub", url)
    assert result["failed"] is True
    assert f"{SHARD}: sha256 " in result["msg"] and "after one refetch" in result["msg"]
    assert "expected " + hashlib.sha256(fixture_files(root)[SHARD]).hexdigest() in result["msg"]
    assert not Path(snap.marker_path(str(tmp_path / "hub"), QWEN, COMMIT)).exists()


def test_a_shard_truncated_on_disk_after_verification_is_found_and_refetched(prefetch, hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    first = prefetch(cache, url)
    blob = snap.blob_path(str(cache), QWEN, next(i for i in first["manifest"]["files"] if i["path"] == SHARD))
    os.truncate(blob, 1000)  # a crash or a full disk after the fact
    again = prefetch(cache, url)
    assert again.get("failed") is not True, again.get("msg")
    assert again["changed"] is True and again["downloaded"] == [SHARD]
    assert_snapshot_is(cache, fixture_files(root))


def test_a_repository_whose_shard_is_truncated_at_the_source_fails_on_its_header(prefetch, hub, tmp_path):
    url, root = hub
    files = fixture_files(root)
    files[SHARD] = files[SHARD][: len(files[SHARD]) // 2]  # the Hub's own hashes describe the short file
    commit = build.commit_sha("sparkfleet-test/truncated", files)
    build.write_repo(root, "sparkfleet-test/truncated", commit, files)
    result = prefetch(tmp_path / "hub", url, repo_id="sparkfleet-test/truncated", revision=commit)
    assert result["failed"] is True
    assert f"{SHARD}: fastsafetensors rejects its header" in result["msg"]
    assert "MetadataIncompleteBuffer" in result["msg"]


def test_an_index_naming_a_tensor_no_shard_holds_fails_as_a_broken_repository(prefetch, hub, tmp_path):
    url, root = hub
    commit = json.loads((root / build.BROKEN / "repo.json").read_text())["refs"]["main"]
    result = prefetch(tmp_path / "hub", url, repo_id=build.BROKEN, revision=commit)
    assert result["failed"] is True
    assert f"names 1 tensor(s) its shard does not hold: {build.MISSING_TENSOR}" in result["msg"]
    assert "pin another revision" in result["msg"]


def test_patterns_that_leave_no_safetensors_file_are_refused(prefetch, hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, ignore_patterns=["*.safetensors"])
    assert result["failed"] is True
    assert (
        "no .safetensors file of Qwen/Qwen3-0.6B" in result["msg"] and "model_weights_ignore_patterns" in result["msg"]
    )


def test_a_missing_revision_is_named(prefetch, hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, revision="no-such-branch")
    assert result["failed"] is True
    assert "revision 'no-such-branch' does not exist in Qwen/Qwen3-0.6B" in result["msg"]


def test_a_missing_repository_is_named(prefetch, hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, repo_id="nobody/nothing", revision="main")
    assert result["failed"] is True
    assert "nobody/nothing was not found on" in result["msg"]


def test_a_disk_too_small_is_refused_before_any_byte_is_downloaded(prefetch, hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, disk_reserve_gib=10**9)
    assert result["failed"] is True
    assert "not downloading" in result["msg"] and "disk_reserve_gib" in result["msg"]
    assert hf_standin.stats(url)["get_requests"] == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"repo_id": "not-a-repo"}, "repo_id='not-a-repo' is not a Hugging Face repo id ORG/NAME"),
        ({"cache_dir": "relative/path"}, "must be an absolute path"),
        ({"endpoint": "ftp://mirror"}, "is not an http(s) URL"),
        ({"endpoint": "https://user:secret@mirror.example"}, "endpoint carries credentials"),
        ({"manifest": {"commit": "main", "files": []}}, "is not a 40-hex commit id"),
    ],
)
def test_bad_input_is_named(run_module, tmp_path, args, words):
    options = {"repo_id": QWEN, "cache_dir": str(tmp_path), **args}
    result = run_module("hf_prefetch", options)
    assert result["failed"] is True and words in result["msg"]


def test_a_peer_verifies_what_it_received_against_the_origins_manifest(prefetch, hub, tmp_path):
    url, _root = hub
    origin = tmp_path / "origin"
    manifest = prefetch(origin, url)["manifest"]
    folder = "models--Qwen--Qwen3-0.6B"
    peer = tmp_path / "peer"

    def deliver() -> None:
        shutil.rmtree(peer, ignore_errors=True)
        shutil.copytree(origin / folder, peer / folder, symlinks=True, ignore=shutil.ignore_patterns(".sparkfleet"))

    deliver()
    checked = prefetch(peer, DEAD_ENDPOINT, manifest=manifest, check=True)
    assert checked["changed"] is True  # no marker yet: a copy would be verified
    received = prefetch(peer, DEAD_ENDPOINT, manifest=manifest)
    assert received.get("failed") is not True, received.get("msg")
    assert received["changed"] is True and received["downloaded"] == [] and received["verified"] == "full"
    assert prefetch(peer, DEAD_ENDPOINT, manifest=manifest, check=True)["changed"] is False

    deliver()
    blob = snap.blob_path(str(peer), QWEN, next(i for i in manifest["files"] if i["path"] == SHARD))
    with open(blob, "r+b") as handle:
        handle.seek(4242)
        handle.write(b"\xff")
    damaged = prefetch(peer, DEAD_ENDPOINT, manifest=manifest)
    assert damaged["failed"] is True and f"{SHARD}: sha256" in damaged["msg"] and "origin host" in damaged["msg"]

    deliver()
    os.unlink(snap.snapshot_folder(str(peer), QWEN, COMMIT) + "/config.json")
    missing = prefetch(peer, DEAD_ENDPOINT, manifest=manifest)
    assert missing["failed"] is True and "did not arrive from the origin host: config.json" in missing["msg"]


def test_the_watch_reports_progress_and_stops_at_the_end(run_module, watch_clock, tmp_path):
    status = tmp_path / "status.json"
    args = {"kind": "fetch", "status_file": str(status), "wait_seconds": 0}
    nothing = run_module("job_watch", args)
    assert nothing["done"] is False and nothing["message"] == "waiting for the prefetch to start"
    record = snap.progress_record(
        "downloading", QWEN, time.time() - 60, commit=COMMIT, bytes_total=4_000_000_000, bytes_done=1_000_000_000,
        files_total=4, files_done=1,
    )  # fmt: skip
    snap.write_status_file(str(status), record)
    waited_from = watch_clock.monotonic()
    running = run_module("job_watch", dict(args, wait_seconds=2))
    assert running["done"] is False and running["changed"] is False and running["state"] == "downloading"
    assert watch_clock.monotonic() - waited_from == 2  # a running prefetch: the whole wait, then a line
    assert running["message"].startswith(
        "Qwen/Qwen3-0.6B@c1899de: downloading 1.0 GB of 4.0 GB (1 of 4 files) after 1m"
    )
    assert "MB/s, about " in running["message"]
    snap.write_status_file(str(status), dict(record, state="failed", error="the disk is full"))
    failed = run_module("job_watch", args)
    assert (failed["done"], failed["state"], failed["error"]) == (True, "failed", "the disk is full")
    assert failed.get("failed") is not True  # the job failed, not the watch: async_status collects why
    snap.write_status_file(str(status), dict(record, state="done", bytes_done=record["bytes_total"]))
    ended = run_module("job_watch", args)
    assert ended["done"] is True and ended["state"] == "done" and ended["error"] is None


def test_the_watch_of_a_long_fetch_waits_a_twentieth_of_its_time_so_far(run_module, watch_clock, tmp_path):
    status = tmp_path / "status.json"
    snap.write_status_file(str(status), snap.progress_record("downloading", QWEN, time.time() - 4000))
    args = {"kind": "fetch", "status_file": str(status), "wait_seconds": 30}
    for started_ago, wait in ((60, 30), (4000, 200)):
        waited_from = watch_clock.monotonic()
        result = run_module("job_watch", dict(args, started=time.time() - started_ago))
        assert watch_clock.monotonic() - waited_from == pytest.approx(wait, abs=1)
        assert result["waited_at_most"] == pytest.approx(wait, abs=1) and result["done"] is False
