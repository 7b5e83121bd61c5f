"""hf_snapshot's plain functions: the manifest from a tree listing, file checks, fastsafetensors headers, the shard
index, markers, orphans of killed runs, disk space and the progress line."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import hf_snapshot as snap
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

COMMIT = "c1899de289a04d12100db370d81485cdf75e47ca"
REPO = "Qwen/Qwen3-0.6B"


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def test_paths_follow_huggingface_hub_cache_layout(tmp_path):
    assert snap.repo_folder(str(tmp_path), REPO) == str(tmp_path / "models--Qwen--Qwen3-0.6B")
    assert snap.snapshot_folder(str(tmp_path), REPO, COMMIT).endswith(f"models--Qwen--Qwen3-0.6B/snapshots/{COMMIT}")
    assert snap.marker_path(str(tmp_path), REPO, COMMIT).endswith(f".sparkfleet/verified-{COMMIT}.json")


@pytest.mark.parametrize(
    ("revision", "expected"),
    [
        (COMMIT, True),
        ("main", False),
        (COMMIT[:39], False),
        (COMMIT.upper(), False),
        ("v1.0", False),
        (COMMIT + "\n", False),
    ],
)
def test_only_a_full_commit_id_counts_as_pinned(revision, expected):
    assert snap.is_commit(revision) is expected


@pytest.mark.parametrize(
    ("path", "allow", "ignore", "expected"),
    [
        ("model.safetensors", [], [], True),
        ("original/consolidated.00.pth", [], ["original/*"], False),
        ("metal/model.bin", [], ["metal/*", "*.bin"], False),
        ("config.json", ["*.json", "*.safetensors"], [], True),
        ("README.md", ["*.json", "*.safetensors"], [], False),
        # fnmatch's '*' crosses '/', as in huggingface_hub: '*.safetensors' also takes files in folders.
        ("sub/model.safetensors", ["*.safetensors"], [], True),
    ],
)
def test_patterns_select_as_huggingface_hub_does(path, allow, ignore, expected):
    assert snap.selected(path, allow, ignore) is expected


def tree_entries() -> list[dict]:
    return [
        {"type": "directory", "path": "original", "oid": "0" * 40, "size": 0},
        {"type": "file", "path": "config.json", "oid": "a" * 40, "size": 700},
        {
            "type": "file",
            "path": "model.safetensors",
            "oid": "b" * 40,
            "size": 134,
            "lfs": {"oid": "c" * 64, "size": 1_503_300_328, "pointerSize": 134},
        },
        {"type": "file", "path": "original/consolidated.00.pth", "oid": "d" * 40, "size": 10},
    ]


def test_manifest_takes_sha256_for_lfs_files_and_git_ids_for_the_rest():
    manifest = snap.manifest_from_tree(REPO, COMMIT, tree_entries(), ignore_patterns=["original/*"])
    assert manifest == {
        "repo_id": REPO,
        "commit": COMMIT,
        "files": [
            {"path": "config.json", "size": 700, "git_oid": "a" * 40},
            # The LFS object's size, not the 134-byte pointer's.
            {"path": "model.safetensors", "size": 1_503_300_328, "sha256": "c" * 64},
        ],
        "bytes": 1_503_301_028,
    }


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        ("not a dict", "a mapping"),
        ({"commit": "main", "files": [{"path": "a", "size": 1, "sha256": "x"}]}, "not a 40-hex commit"),
        ({"commit": COMMIT, "files": []}, "non-empty list"),
        ({"commit": COMMIT, "files": [{"path": "a"}]}, "lacks path or size"),
        ({"commit": COMMIT, "files": [{"path": "a", "size": 1}]}, "neither sha256 nor git_oid"),
    ],
)
def test_a_handed_over_manifest_is_checked(manifest, words):
    assert words in snap.manifest_problem(manifest)


def lay_snapshot(cache: Path, files: dict[str, bytes], lfs: tuple[str, ...] = ()) -> dict:
    """Write files the way huggingface_hub does (blob + relative symlink) and return their manifest."""
    items = []
    folder = Path(snap.repo_folder(str(cache), REPO))
    for path, content in files.items():
        item = {"path": path, "size": len(content)}
        if path in lfs:
            item["sha256"] = hashlib.sha256(content).hexdigest()
        else:
            item["git_oid"] = git_blob_id(content)
        blob = folder / "blobs" / snap.etag_of(item)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = folder / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        items.append(item)
    return {"repo_id": REPO, "commit": COMMIT, "files": items, "bytes": sum(i["size"] for i in items)}


def test_git_blob_id_matches_git(tmp_path):
    path = tmp_path / "hello"
    path.write_bytes(b"hello\n")
    # `printf 'hello\n' | git hash-object --stdin`
    assert snap.file_digest(str(path), {"git_oid": "x"}) == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_sound_files_pass_and_each_fault_is_named(tmp_path):
    content = os.urandom(3 * snap.READ_CHUNK + 17)
    manifest = lay_snapshot(
        tmp_path,
        {"a.safetensors": content, "b.safetensors": content[:1000], "config.json": b"{}"},
        lfs=("a.safetensors", "b.safetensors"),
    )
    snapshot = snap.snapshot_folder(str(tmp_path), REPO, COMMIT)
    counter = snap.ByteCounter()
    assert snap.file_problems(snapshot, manifest["files"], "full", 4, counter) == {}
    assert counter.value == manifest["bytes"]

    blob_a = snap.blob_path(str(tmp_path), REPO, manifest["files"][0])
    with open(blob_a, "r+b") as handle:  # one flipped bit, size unchanged
        handle.seek(2 * snap.READ_CHUNK + 5)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.truncate(snap.blob_path(str(tmp_path), REPO, manifest["files"][1]), 999)
    problems = snap.file_problems(snapshot, manifest["files"], "full", 4)
    assert set(problems) == {"a.safetensors", "b.safetensors"}
    assert "sha256" in problems["a.safetensors"] and "the bytes differ" in problems["a.safetensors"]
    assert problems["b.safetensors"].startswith("size 999 bytes, expected 1000")
    # The size level misses the flipped bit: that is what 'full' is for.
    assert set(snap.file_problems(snapshot, manifest["files"], "size", 2)) == {"b.safetensors"}


def write_shard(path: Path, names: list[str]) -> None:
    rng = np.random.default_rng(7)
    save_file({name: rng.standard_normal((8, 16)).astype(np.float16) for name in names}, str(path))


def test_fastsafetensors_reads_the_tensor_names_of_a_sound_shard(tmp_path):
    write_shard(tmp_path / "s.safetensors", ["b.weight", "a.weight"])
    assert sorted(snap.safetensors_tensors(str(tmp_path / "s.safetensors"))) == ["a.weight", "b.weight"]


def test_fastsafetensors_rejects_a_truncated_shard_and_a_bad_header(tmp_path):
    shard = tmp_path / "s.safetensors"
    write_shard(shard, ["a.weight", "b.weight"])
    os.truncate(shard, shard.stat().st_size - 10)
    with pytest.raises(ValueError, match="MetadataIncompleteBuffer"):
        snap.safetensors_tensors(str(shard))
    shard.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match=r"HeaderTooLarge|InvalidHeaderLength"):
        snap.safetensors_tensors(str(shard))


def test_fastsafetensors_accepts_trailing_bytes_which_is_why_files_are_hashed(tmp_path):
    shard = tmp_path / "s.safetensors"
    write_shard(shard, ["a.weight"])
    with open(shard, "ab") as handle:
        handle.write(b"\0" * 64)
    assert snap.safetensors_tensors(str(shard)) == ["a.weight"]


def lay_sharded_model(tmp_path: Path, index_map: dict[str, str]) -> tuple[str, dict]:
    write_shard(tmp_path / "one.safetensors", ["layer.0.weight", "layer.1.weight"])
    write_shard(tmp_path / "two.safetensors", ["layer.2.weight"])
    index = json.dumps({"metadata": {}, "weight_map": index_map}).encode()
    files = {
        "model-00001-of-00002.safetensors": (tmp_path / "one.safetensors").read_bytes(),
        "model-00002-of-00002.safetensors": (tmp_path / "two.safetensors").read_bytes(),
        "model.safetensors.index.json": index,
    }
    manifest = lay_snapshot(tmp_path / "cache", files, lfs=tuple(files)[:2])
    return snap.snapshot_folder(str(tmp_path / "cache"), REPO, COMMIT), manifest


GOOD_MAP = {
    "layer.0.weight": "model-00001-of-00002.safetensors",
    "layer.1.weight": "model-00001-of-00002.safetensors",
    "layer.2.weight": "model-00002-of-00002.safetensors",
}


@pytest.mark.parametrize(
    ("index_map", "words"),
    [
        (GOOD_MAP, None),
        (
            dict(GOOD_MAP, **{"layer.3.weight": "model-00002-of-00002.safetensors"}),
            "names 1 tensor(s) its shard does not hold: layer.3.weight",
        ),
        (
            {k: v for k, v in GOOD_MAP.items() if k != "layer.1.weight"},
            "misses 1 tensor(s) the shards hold: layer.1.weight",
        ),
        (
            dict(GOOD_MAP, **{"layer.2.weight": "model-00003-of-00003.safetensors"}),
            "names shard(s) model-00003-of-00003",
        ),
    ],
)
def test_the_index_must_cover_exactly_the_tensors_the_shards_hold(tmp_path, index_map, words):
    snapshot, manifest = lay_sharded_model(tmp_path, index_map)
    bad_headers, tensors = snap.header_problems(snapshot, manifest["files"])
    assert bad_headers == {}
    problems = snap.index_problems(snapshot, manifest["files"], tensors)
    if words is None:
        assert problems == {}
    else:
        assert words in problems["model.safetensors.index.json"]


def test_a_marker_holds_only_for_the_same_files_a_strict_enough_level_and_intact_sizes(tmp_path):
    manifest = lay_snapshot(tmp_path, {"a.safetensors": b"x" * 100, "config.json": b"{}"}, lfs=("a.safetensors",))
    assert snap.read_marker(str(tmp_path), REPO, COMMIT) is None
    snap.write_marker(str(tmp_path), manifest, "full")
    marker = snap.read_marker(str(tmp_path), REPO, COMMIT)
    assert snap.marker_holds(marker, manifest["files"], "full", str(tmp_path))
    assert snap.marker_holds(marker, None, "size", str(tmp_path))
    other_files = [dict(manifest["files"][0], size=101), manifest["files"][1]]
    assert not snap.marker_holds(marker, other_files, "full", str(tmp_path))
    snap.write_marker(str(tmp_path), manifest, "size")
    assert not snap.marker_holds(snap.read_marker(str(tmp_path), REPO, COMMIT), None, "full", str(tmp_path))
    snap.write_marker(str(tmp_path), manifest, "full")
    os.truncate(snap.blob_path(str(tmp_path), REPO, manifest["files"][0]), 50)
    assert not snap.marker_holds(snap.read_marker(str(tmp_path), REPO, COMMIT), None, "full", str(tmp_path))


def test_orphans_are_partial_files_no_download_holds_and_removing_them_frees_their_bytes(tmp_path):
    blobs = Path(snap.repo_folder(str(tmp_path), REPO)) / "blobs"
    blobs.mkdir(parents=True)
    left_behind = blobs / ("e" * 64 + ".1a2b3c4d.incomplete")
    in_progress = blobs / ("f" * 64 + ".5e6f7a8b.incomplete")
    left_behind.write_bytes(b"x" * 4096)
    in_progress.write_bytes(b"y" * 10)
    (blobs / ("f" * 64)).write_bytes(b"complete blobs are never orphans")
    locks = tmp_path / ".locks" / "models--Qwen--Qwen3-0.6B"
    locks.mkdir(parents=True)
    (locks / ("e" * 64 + ".lock")).touch()  # a lock file of a finished process: nobody holds it
    with open(locks / ("f" * 64 + ".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert snap.partial_files(str(tmp_path), REPO) == sorted([str(left_behind), str(in_progress)])
        # The flock is the other process's; open() in this one is a separate open file description.
        assert snap.orphan_files(str(tmp_path), REPO) == [str(left_behind)]
    assert snap.remove_orphans([str(left_behind)]) == 4096
    assert not left_behind.exists() and in_progress.exists()


def test_disk_problem_refuses_when_the_download_and_reserve_do_not_fit(tmp_path):
    assert snap.disk_problem(str(tmp_path / "not" / "yet"), 1, 0) is None
    words = snap.disk_problem(str(tmp_path), 10**18, 2**30)
    assert "free, and the download needs 1000000000.0 GB" in words and "disk_reserve_gib" in words


def test_progress_message_gives_bytes_files_rate_and_time_left():
    record = snap.progress_record(
        "downloading", REPO, 1000.0, commit=COMMIT, bytes_total=10_400_000_000, bytes_done=3_100_000_000,
        files_total=5, files_done=2,
    )  # fmt: skip
    line = snap.progress_message(record, 1250.0)
    assert line == (
        "Qwen/Qwen3-0.6B@c1899de: downloading 3.1 GB of 10.4 GB (2 of 5 files) after 4m10s, 12.4 MB/s, about 9m48s left"
    )
    assert snap.progress_message(None, 0) == "waiting for the prefetch to start"
    failed = snap.progress_record("failed", REPO, 1000.0, error="boom")
    assert snap.progress_message(failed, 1001) == "Qwen/Qwen3-0.6B: failed: boom"
    with pytest.raises(ValueError, match="not one of"):
        snap.progress_record("pulling", REPO, 0)


def test_the_spark_venv_pins_the_versions_the_tests_run():
    """hf_prefetch is tested here with requirements-dev.txt's libraries; a Spark's venv must get the same ones."""
    from helpers import ROOT

    role = yaml.safe_load((ROOT / "roles" / "model_weights" / "defaults" / "main.yml").read_text())
    dev = {line.strip() for line in (ROOT / "requirements-dev.txt").read_text().splitlines()}
    assert role["model_weights_pip_packages"] and set(role["model_weights_pip_packages"]) <= dev
