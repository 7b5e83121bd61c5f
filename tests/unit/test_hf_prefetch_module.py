"""hf_prefetch through real Ansible against the stand-in Hugging Face Hub (tests/standins/hf_hub) on loopback:
a clean download, a rerun that changes nothing, a cut connection, a killed client, bytes damaged on the way, a
truncated shard, a broken index, a wrong token, a missing revision, a full disk, check mode and the peer
verification of the fleet fan-out."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, ansible_tool, run_ansible_module

sys.path.insert(0, str(ROOT / "tests"))
import hf_snapshot as snap
import hf_standin

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


@pytest.fixture(autouse=True)
def clean_hub(hub):
    url, root = hub
    hf_standin.set_faults(root, [])
    hf_standin.reset(url)
    yield
    hf_standin.set_faults(root, [])


def module_env() -> dict[str, str]:
    env = dict(os.environ, ANSIBLE_LIBRARY=str(ROOT / "library"), ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"))
    env.pop("HF_TOKEN", None)
    return env


def prefetch(cache: Path, endpoint: str, check: bool = False, **options) -> dict:
    args = {"repo_id": QWEN, "revision": COMMIT, "cache_dir": str(cache), "endpoint": endpoint}
    args.update({"status_file": str(cache.parent / "status.json"), "disk_reserve_gib": 0, **options})
    return run_ansible_module("hf_prefetch", module_env(), json.dumps(args), check)


def ansible_argv(args: dict, *extra: str) -> list[str]:
    """`ansible localhost -m hf_prefetch -a JSON`, for runs that need the raw process or output."""
    inventory = ["localhost", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return [ansible_tool("ansible"), *inventory, *extra, "-m", "hf_prefetch", "-a", json.dumps(args)]


def fixture_files(root: Path, repo_id: str = QWEN, commit: str = COMMIT) -> dict[str, bytes]:
    folder = root.joinpath(*repo_id.split("/"), commit)
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def assert_snapshot_equals(cache: Path, files: dict[str, bytes], repo_id: str = QWEN, commit: str = COMMIT):
    snapshot = Path(snap.snapshot_folder(str(cache), repo_id, commit))
    for path, content in files.items():
        assert (snapshot / path).read_bytes() == content, path


def test_a_clean_download_lands_in_the_hf_cache_verified_and_a_rerun_changes_nothing(hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    first = prefetch(cache, url)
    files = fixture_files(root)
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True and first["verified"] == "full"
    assert first["commit"] == COMMIT
    assert sorted(first["downloaded"]) == sorted(files)
    assert first["bytes_downloaded"] == first["bytes_total"] == sum(len(c) for c in files.values())
    assert_snapshot_equals(cache, files)
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


def test_check_mode_reports_what_would_be_downloaded_and_writes_nothing(hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    result = prefetch(cache, url, check=True)
    files = fixture_files(root)
    assert result["changed"] is True
    assert sorted(result["would_download"]) == sorted(files)
    assert result["bytes_to_download"] == sum(len(c) for c in files.values())
    assert not cache.exists() and not (tmp_path / "status.json").exists()
    assert hf_standin.stats(url)["get_requests"] == 0


def test_a_branch_is_resolved_to_its_commit(hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, revision="main")
    assert result["commit"] == COMMIT and result["changed"] is True


def add_big_repo(root: Path, repo_id: str, mib: int = 24) -> tuple[str, dict[str, bytes]]:
    """A repo with one shard larger than huggingface_hub's 10 MiB download chunk, so a cut can resume."""
    tensors = [(f"layer.{i}.weight", (1024, 1024)) for i in range(mib // 2)]
    files = {"config.json": b'{"model_type": "test"}\n', "model.safetensors": build.safetensors_bytes(tensors, 3)}
    commit = build.commit_sha(repo_id, files)
    build.write_repo(root, repo_id, commit, files)
    return commit, files


def test_a_connection_cut_mid_file_is_resumed_with_a_range_request(hub, tmp_path):
    url, root = hub
    commit, files = add_big_repo(root, "sparkfleet-test/big-shard")
    cut_at = 15 * 2**20  # past the first whole 10 MiB chunk, which the client keeps
    hf_standin.set_faults(
        root, [{"repo": "sparkfleet-test/big-shard", "path": "model.safetensors", "kind": "cut", "offset": cut_at}]
    )
    result = prefetch(tmp_path / "hub", url, repo_id="sparkfleet-test/big-shard", revision=commit)
    assert result.get("failed") is not True, result.get("msg")
    assert result["refetched"] == []
    assert_snapshot_equals(tmp_path / "hub", files, "sparkfleet-test/big-shard", commit)
    stats = hf_standin.stats(url)
    assert stats["faults_applied"] == 1 and stats["range_requests"] == 1
    # Resumed, not restarted: less than the file plus the bytes before the cut crossed the wire.
    assert (
        stats["bytes_served"]["sparkfleet-test/big-shard/model.safetensors"] < len(files["model.safetensors"]) + cut_at
    )


def kill_process_groups_mentioning(text: str) -> None:
    """SIGKILL every process whose command line holds TEXT, with its process group. Ansible's worker process
    starts a session of its own (setsid) and runs the module in it; the main process stays in ours, so it alone
    is killed by pid."""
    for proc in Path("/proc").iterdir():
        try:
            if not (proc.name.isdigit() and text in (proc / "cmdline").read_text(errors="replace")):
                continue
            pid = int(proc.name)
            group = os.getpgid(pid)
            if group == os.getpgrp():
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def test_a_killed_run_leaves_an_orphan_that_the_next_run_removes_before_completing(hub, tmp_path):
    url, root = hub
    commit, files = add_big_repo(root, "sparkfleet-test/killed")
    hf_standin.set_faults(
        root,
        [
            {
                "repo": "sparkfleet-test/killed",
                "path": "model.safetensors",
                "kind": "stall",
                "offset": 12 * 2**20,
                "seconds": 60,
            }
        ],
    )
    cache = tmp_path / "hub"
    args = {"repo_id": "sparkfleet-test/killed", "revision": commit, "cache_dir": str(cache), "endpoint": url,
            "status_file": str(tmp_path / "status.json"), "disk_reserve_gib": 0, "max_workers": 1}  # fmt: skip
    run = subprocess.Popen(ansible_argv(args), env=module_env(), cwd=ROOT, stdout=subprocess.DEVNULL)
    blobs = Path(snap.repo_folder(str(cache), "sparkfleet-test/killed")) / "blobs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.stat().st_size >= 10 * 2**20 for p in blobs.glob("*.incomplete")):
        time.sleep(0.2)
    kill_process_groups_mentioning(str(cache))  # ansible and the module it started, as a kill -9 would
    run.wait()
    orphans = list(blobs.glob("*.incomplete"))
    assert len(orphans) == 1 and orphans[0].stat().st_size >= 10 * 2**20

    hf_standin.set_faults(root, [])
    result = prefetch(cache, url, repo_id="sparkfleet-test/killed", revision=commit)
    assert result.get("failed") is not True, result.get("msg")
    assert result["orphans_removed"] == [str(orphans[0])]
    assert not list(blobs.glob("*.incomplete"))
    # The file that had completed before the kill was kept; only the unfinished one was fetched.
    assert result["downloaded"] == ["model.safetensors"]
    assert_snapshot_equals(cache, files, "sparkfleet-test/killed", commit)


def test_a_byte_flipped_on_the_way_is_detected_refetched_once_and_then_passes(hub, tmp_path):
    url, root = hub
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD, "kind": "flip", "offset": 1_000_000}])
    result = prefetch(tmp_path / "hub", url)
    assert result.get("failed") is not True, result.get("msg")
    assert result["refetched"] == [SHARD]
    assert_snapshot_equals(tmp_path / "hub", fixture_files(root))


def test_a_source_that_keeps_serving_a_flipped_byte_fails_naming_the_file_and_the_hash(hub, tmp_path):
    url, root = hub
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD, "kind": "flip", "offset": 1_000_000, "times": 2}])
    result = prefetch(tmp_path / "hub", url)
    assert result["failed"] is True
    assert f"{SHARD}: sha256 " in result["msg"] and "after one refetch" in result["msg"]
    assert "expected " + hashlib.sha256(fixture_files(root)[SHARD]).hexdigest() in result["msg"]
    assert not Path(snap.marker_path(str(tmp_path / "hub"), QWEN, COMMIT)).exists()


def test_a_shard_truncated_on_disk_after_verification_is_found_and_refetched(hub, tmp_path):
    url, root = hub
    cache = tmp_path / "hub"
    first = prefetch(cache, url)
    blob = snap.blob_path(str(cache), QWEN, next(i for i in first["manifest"]["files"] if i["path"] == SHARD))
    os.truncate(blob, 1000)  # a crash or a full disk after the fact
    again = prefetch(cache, url)
    assert again.get("failed") is not True, again.get("msg")
    assert again["changed"] is True and again["downloaded"] == [SHARD]
    assert_snapshot_equals(cache, fixture_files(root))


def test_a_repository_whose_shard_is_truncated_at_the_source_fails_on_its_header(hub, tmp_path):
    url, root = hub
    files = fixture_files(root)
    files[SHARD] = files[SHARD][: len(files[SHARD]) // 2]  # the Hub's own hashes describe the short file
    commit = build.commit_sha("sparkfleet-test/truncated", files)
    build.write_repo(root, "sparkfleet-test/truncated", commit, files)
    result = prefetch(tmp_path / "hub", url, repo_id="sparkfleet-test/truncated", revision=commit)
    assert result["failed"] is True
    assert f"{SHARD}: fastsafetensors rejects its header" in result["msg"]
    assert "MetadataIncompleteBuffer" in result["msg"]


def test_an_index_naming_a_tensor_no_shard_holds_fails_as_a_broken_repository(hub, tmp_path):
    url, root = hub
    commit = json.loads((root / build.BROKEN / "repo.json").read_text())["refs"]["main"]
    result = prefetch(tmp_path / "hub", url, repo_id=build.BROKEN, revision=commit)
    assert result["failed"] is True
    assert f"names 1 tensor(s) its shard does not hold: {build.MISSING_TENSOR}" in result["msg"]
    assert "pin another revision" in result["msg"]


def test_a_wrong_token_gives_a_clear_error_and_never_shows_the_token(hub, tmp_path):
    url, _root = hub
    token = "hf_wrong_token_that_must_not_leak_5e1a"
    args = {"repo_id": build.PRIVATE, "revision": "main", "cache_dir": str(tmp_path / "hub"), "endpoint": url,
            "token": token, "status_file": str(tmp_path / "status.json")}  # fmt: skip
    done = subprocess.run(
        ansible_argv(args, "-vvv"), env=module_env(), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "refused the token (HTTP 401)" in done.stdout
    assert token not in done.stdout + done.stderr
    assert token not in (tmp_path / "status.json").read_text()

    good = prefetch(tmp_path / "hub", url, repo_id=build.PRIVATE, revision="main", token=build.PRIVATE_TOKEN)
    assert good.get("failed") is not True, good.get("msg")


def test_patterns_that_leave_no_safetensors_file_are_refused(hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, ignore_patterns=["*.safetensors"])
    assert result["failed"] is True
    assert (
        "no .safetensors file of Qwen/Qwen3-0.6B" in result["msg"] and "model_weights_ignore_patterns" in result["msg"]
    )


def test_a_missing_revision_is_named(hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, revision="no-such-branch")
    assert result["failed"] is True
    assert "revision 'no-such-branch' does not exist in Qwen/Qwen3-0.6B" in result["msg"]


def test_a_missing_repository_is_named(hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, repo_id="nobody/nothing", revision="main")
    assert result["failed"] is True
    assert "nobody/nothing was not found on" in result["msg"]


def test_a_disk_too_small_is_refused_before_any_byte_is_downloaded(hub, tmp_path):
    url, _root = hub
    result = prefetch(tmp_path / "hub", url, disk_reserve_gib=10**9)
    assert result["failed"] is True
    assert "not downloading" in result["msg"] and "disk_reserve_gib" in result["msg"]
    assert hf_standin.stats(url)["get_requests"] == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"repo_id": "not-a-repo"}, "is not a Hub model id"),
        ({"cache_dir": "relative/path"}, "must be an absolute path"),
        ({"endpoint": "ftp://mirror"}, "is not an http(s) URL"),
        ({"endpoint": "https://user:secret@mirror.example"}, "endpoint carries credentials"),
        ({"manifest": {"commit": "main", "files": []}}, "is not a 40-hex commit id"),
    ],
)
def test_bad_input_is_named(tmp_path, args, words):
    options = {"repo_id": QWEN, "cache_dir": str(tmp_path), **args}
    result = run_ansible_module("hf_prefetch", module_env(), json.dumps(options))
    assert result["failed"] is True and words in result["msg"]


def test_a_peer_verifies_what_it_received_against_the_origins_manifest(hub, tmp_path):
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


def test_the_watcher_reports_progress_and_stops_at_the_end(tmp_path):
    status = tmp_path / "status.json"
    args = json.dumps({"status_file": str(status), "wait_seconds": 0})
    nothing = run_ansible_module("hf_prefetch_watch", module_env(), args)
    assert nothing["done"] is False and nothing["message"] == "waiting for the prefetch to start"
    record = snap.progress_record(
        "downloading", QWEN, time.time() - 60, commit=COMMIT, bytes_total=4_000_000_000, bytes_done=1_000_000_000,
        files_total=4, files_done=1,
    )  # fmt: skip
    snap.write_json_atomically(str(status), record)
    running = run_ansible_module(
        "hf_prefetch_watch", module_env(), json.dumps({"status_file": str(status), "wait_seconds": 2})
    )
    assert running["done"] is False and running["changed"] is False
    assert running["message"].startswith(
        "Qwen/Qwen3-0.6B@c1899de: downloading 1.0 GB of 4.0 GB (1 of 4 files) after 1m"
    )
    assert "MB/s, about " in running["message"]
    snap.write_json_atomically(str(status), dict(record, state="done", bytes_done=record["bytes_total"]))
    ended = run_ansible_module("hf_prefetch_watch", module_env(), args)
    assert ended["done"] is True and ended["state"] == "done"
