"""Tests of the stand-in Hugging Face Hub (tests/standins/hf_hub) with the REAL huggingface_hub client.

One stand-in process serves the fixture repos (tests/fixtures/build_hf_models.py) for the whole module, on
127.0.0.1 and a free port; every download goes to a fresh cache_dir. The client is isolated from the machine:
no token but the ones passed, no Xet, no telemetry, no proxy, and a throw-away HF_HOME.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("huggingface_hub")
pytest.importorskip("safetensors")

from helpers import ROOT, hf_standin
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import close_session

BUILD = hf_standin.builder()
QWEN = BUILD.QWEN
SHARD1, SHARD2 = BUILD.SHARDS
GOOD_TOKEN = BUILD.PRIVATE_TOKEN
WRONG_TOKEN = "hf_standin_wrong_token_9999"
RECIPE_REVISION = yaml.safe_load((ROOT / "recipes" / "qwen3-0.6b.yml").read_text())["hf_revision"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture repos, built once for the module."""
    return hf_standin.build_fixture_models(tmp_path_factory.mktemp("hf-root"))


@pytest.fixture(scope="module")
def endpoint(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running stand-in, with the client isolated from the machine's token, proxy, cache and Xet."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
            patch.delenv(name, raising=False)
        for name, value in {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(home)}.items():
            patch.setenv(name, value)
        patch.setenv("NO_PROXY", "127.0.0.1,localhost")
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        # The constants were read when huggingface_hub was imported: set them too.
        patch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        patch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        patch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
        close_session()  # a new httpx client, made with this environment
        with hf_standin.running_standin(root) as url:
            yield url
        close_session()


@pytest.fixture
def fresh(endpoint: str, root: Path) -> Iterator[str]:
    """The stand-in with zeroed stats and no faults; faults are removed again afterwards."""
    hf_standin.set_faults(root, [])
    hf_standin.reset(endpoint)
    yield endpoint
    hf_standin.set_faults(root, [])


def fixture_file(root: Path, repo_id: str, path: str) -> Path:
    repo = json.loads(root.joinpath(*repo_id.split("/"), "repo.json").read_text())
    return root.joinpath(*repo_id.split("/"), repo["refs"]["main"], path)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha: str, size: int) -> bytes:
    """The git-lfs pointer git stores for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()


def download(endpoint: str, cache: Path, filename: str, repo_id: str = QWEN, **kwargs) -> Path:
    kwargs.setdefault("token", False)
    return Path(hf_hub_download(repo_id, filename, endpoint=endpoint, cache_dir=cache, **kwargs))


# --- the builder ---------------------------------------------------------------------------------------------


def test_builder_is_idempotent_and_indexes_match_the_shards(root: Path) -> None:
    from safetensors import safe_open

    stamp = (root / ".build-stamp.json").stat().st_mtime_ns
    again = subprocess.run([sys.executable, str(hf_standin.BUILDER), str(root)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("up to date:") == len(BUILD.repo_ids(None))
    assert (root / ".build-stamp.json").stat().st_mtime_ns == stamp

    def index_and_keys(repo_id: str) -> tuple[dict[str, str], dict[str, str]]:
        index = json.loads(fixture_file(root, repo_id, "model.safetensors.index.json").read_text())
        held = {}
        for shard in BUILD.SHARDS:
            with safe_open(str(fixture_file(root, repo_id, shard)), framework="numpy") as handle:
                held.update(dict.fromkeys(handle.keys(), shard))
        return index["weight_map"], held

    weight_map, held = index_and_keys(QWEN)
    assert weight_map == held
    weight_map, held = index_and_keys(BUILD.BROKEN)
    assert set(weight_map) - set(held) == {BUILD.MISSING_TENSOR}


# --- metadata ------------------------------------------------------------------------------------------------


def test_model_info_gives_the_pinned_revision(fresh: str, root: Path) -> None:
    api = HfApi(endpoint=fresh, token=False)
    info = api.model_info(QWEN)
    assert info.sha == RECIPE_REVISION
    assert info.id == QWEN and info.private is False
    assert {s.rfilename for s in info.siblings} == {p.name for p in fixture_file(root, QWEN, "").iterdir()}
    assert api.model_info(QWEN, revision="main").sha == RECIPE_REVISION
    assert api.repo_info(QWEN, revision=RECIPE_REVISION).sha == RECIPE_REVISION
    detailed = api.model_info(QWEN, files_metadata=True)
    shard = next(s for s in detailed.siblings if s.rfilename == SHARD1)
    assert shard.lfs.sha256 == sha256(fixture_file(root, QWEN, SHARD1))


def test_list_repo_tree_gives_sizes_oids_and_lfs_sha256(fresh: str, root: Path) -> None:
    entries = list(HfApi(endpoint=fresh, token=False).list_repo_tree(QWEN, recursive=True))
    assert {e.path for e in entries} == {p.name for p in fixture_file(root, QWEN, "").iterdir()}
    for entry in entries:
        content = fixture_file(root, QWEN, entry.path).read_bytes()
        assert entry.size == len(content)
        if entry.path.endswith(".safetensors"):
            assert entry.lfs.sha256 == hashlib.sha256(content).hexdigest()
            assert entry.lfs.size == len(content)
            # As on the Hub: an LFS file's blob id is that of its git-lfs pointer, not of its content.
            pointer = lfs_pointer(entry.lfs.sha256, len(content))
            assert entry.blob_id == git_blob_oid(pointer) and entry.lfs.pointer_size == len(pointer)
        else:
            assert entry.lfs is None
            assert entry.blob_id == git_blob_oid(content)


def test_tree_directories_carry_git_tree_ids(fresh: str, root: Path, tmp_path: Path) -> None:
    files = {
        "README.md": b"# nested\n",
        "sub/a.json": b'{"a": 1}\n',
        "sub/deeper/b.bin": b"\x00\x01\x02" * 100,
        "z.txt": b"z\n",
    }
    BUILD.write_repo(root, "sparkfleet-test/nested", "1" * 40, files)
    api = HfApi(endpoint=fresh, token=False)
    top = {e.path: e for e in api.list_repo_tree("sparkfleet-test/nested")}
    assert set(top) == {"README.md", "sub", "z.txt"}
    everything = {e.path for e in api.list_repo_tree("sparkfleet-test/nested", recursive=True)}
    assert everything == {"README.md", "sub", "sub/a.json", "sub/deeper", "sub/deeper/b.bin", "z.txt"}
    assert {e.path for e in api.list_repo_tree("sparkfleet-test/nested", "sub")} == {"sub/a.json", "sub/deeper"}
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree("sparkfleet-test/nested", "nope"))

    # The same tree in real git (LFS files as their pointers): the stand-in's oids are git's.
    work = tmp_path / "git"
    for path, content in files.items():
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        stored = lfs_pointer(hashlib.sha256(content).hexdigest(), len(content)) if path.endswith(".bin") else content
        target.write_bytes(stored)

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=work, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    tree = git("write-tree")
    assert top["sub"].tree_id == git("rev-parse", f"{tree}:sub")
    assert top["README.md"].blob_id == git("rev-parse", f"{tree}:README.md")
    deeper = {e.path: e for e in api.list_repo_tree("sparkfleet-test/nested", "sub/deeper")}
    assert deeper["sub/deeper/b.bin"].blob_id == git("rev-parse", f"{tree}:sub/deeper/b.bin")


# --- downloads -----------------------------------------------------------------------------------------------


def test_snapshot_download_matches_the_fixture(fresh: str, root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    folder = Path(snapshot_download(QWEN, endpoint=fresh, cache_dir=cache, token=False))
    assert folder == cache / "models--Qwen--Qwen3-0.6B" / "snapshots" / RECIPE_REVISION
    source = fixture_file(root, QWEN, "")
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in source.iterdir())
    for path in folder.iterdir():
        assert path.read_bytes() == (source / path.name).read_bytes(), path.name
    storage = cache / "models--Qwen--Qwen3-0.6B"
    assert (storage / "refs" / "main").read_text() == RECIPE_REVISION
    # Blobs are named by etag: sha256 for LFS files, the git blob id for the others.
    blobs = {p.name for p in (storage / "blobs").iterdir()}
    assert sha256(source / SHARD1) in blobs
    assert git_blob_oid((source / "config.json").read_bytes()) in blobs
    assert not any(name.endswith(".incomplete") for name in blobs)
    assert hf_standin.stats(fresh)["range_requests"] == 0


def test_cut_within_the_first_chunk_restarts_from_zero(fresh: str, root: Path, tmp_path: Path) -> None:
    """The client buffers 10 MiB (DOWNLOAD_CHUNK_SIZE) before writing: a cut before that loses everything, and it
    retries with a plain GET from byte 0."""
    offset = 1024 * 1024 + 77
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD1, "kind": "cut", "offset": offset}])
    path = download(fresh, tmp_path / "cache", SHARD1)
    size = fixture_file(root, QWEN, SHARD1).stat().st_size
    assert sha256(path) == sha256(fixture_file(root, QWEN, SHARD1))
    stats = hf_standin.stats(fresh)
    assert stats["faults_applied"] == 1 and stats["range_requests"] == 0 and stats["get_requests"] == 2
    assert stats["bytes_served"][f"{QWEN}/{SHARD1}"] == size + offset


def test_cut_is_resumed_with_a_range_request(
    fresh: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With smaller chunks the client keeps what it has written and resumes with `Range: bytes=N-` (a 206)."""
    chunk = 256 * 1024
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk)
    offset = 4 * chunk + 12345
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD1, "kind": "cut", "offset": offset}])
    path = download(fresh, tmp_path / "cache", SHARD1)
    size = fixture_file(root, QWEN, SHARD1).stat().st_size
    assert sha256(path) == sha256(fixture_file(root, QWEN, SHARD1))
    stats = hf_standin.stats(fresh)
    assert stats["faults_applied"] == 1 and stats["range_requests"] == 1 and stats["get_requests"] == 2
    # Resumed at the last whole chunk written (4 * chunk): only the 12345 buffered bytes came twice.
    assert stats["bytes_served"][f"{QWEN}/{SHARD1}"] == size + offset - 4 * chunk
    assert f"GET /{QWEN}/resolve/main/{SHARD1} 206" in (root / "standin.log").read_text()


def test_flip_goes_unnoticed_by_the_download(fresh: str, root: Path, tmp_path: Path) -> None:
    """The client checks sizes, never hashes: a flipped byte lands in the cache. verify_repo_checksums sees it."""
    hf_standin.set_faults(root, [{"repo": QWEN, "path": SHARD2, "kind": "flip", "offset": 4096}])
    cache = tmp_path / "cache"
    path = download(fresh, cache, SHARD2)
    good = fixture_file(root, QWEN, SHARD2).read_bytes()
    got = path.read_bytes()
    tree = {e.path: e for e in HfApi(endpoint=fresh, token=False).list_repo_tree(QWEN)}
    assert len(got) == len(good) and hashlib.sha256(got).hexdigest() != tree[SHARD2].lfs.sha256
    assert [i for i in range(len(good)) if got[i] != good[i]] == [4096]
    assert path.resolve().name == tree[SHARD2].lfs.sha256  # cached under the etag it should have had
    report = HfApi(endpoint=fresh, token=False).verify_repo_checksums(QWEN, cache_dir=cache, revision="main")
    assert [m["path"] for m in report.mismatches] == [SHARD2]


def test_truncate_fails_the_size_check(fresh: str, root: Path, tmp_path: Path) -> None:
    """A short but well-formed body: the client compares with the HEAD size and leaves nothing in the cache."""
    hf_standin.set_faults(root, [{"repo": QWEN, "path": "config.json", "kind": "truncate", "offset": 100}])
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="Consistency check failed"):
        download(fresh, cache, "config.json")
    assert not list(cache.rglob("*.incomplete"))
    assert download(fresh, cache, "config.json").read_bytes() == fixture_file(root, QWEN, "config.json").read_bytes()


# --- errors and access ---------------------------------------------------------------------------------------


def test_missing_repo_revision_and_file_raise_the_hub_errors(fresh: str, tmp_path: Path) -> None:
    api = HfApi(endpoint=fresh, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("sparkfleet-test/no-such-model")
    with pytest.raises(RepositoryNotFoundError):
        download(fresh, tmp_path / "c1", "config.json", repo_id="sparkfleet-test/no-such-model")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(QWEN, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        download(fresh, tmp_path / "c2", "config.json", revision="f" * 40)
    with pytest.raises(RemoteEntryNotFoundError):
        download(fresh, tmp_path / "c3", "no-such-file.json")
    # The client remembers the absence under .no_exist/<commit>/ (X-Repo-Commit of the 404).
    assert (tmp_path / "c3" / "models--Qwen--Qwen3-0.6B" / ".no_exist" / RECIPE_REVISION / "no-such-file.json").exists()


def test_private_repo_needs_its_token(fresh: str, root: Path, tmp_path: Path) -> None:
    private = BUILD.PRIVATE
    path = download(fresh, tmp_path / "ok", "model.safetensors", repo_id=private, token=GOOD_TOKEN)
    assert path.read_bytes() == fixture_file(root, private, "model.safetensors").read_bytes()
    assert HfApi(endpoint=fresh, token=GOOD_TOKEN).model_info(private).private is True
    with pytest.raises(RepositoryNotFoundError) as anonymous:
        download(fresh, tmp_path / "anon", "config.json", repo_id=private)
    assert anonymous.value.response.status_code == 401


def test_wrong_token_is_a_401_that_does_not_show_the_token(fresh: str, tmp_path: Path) -> None:
    attempts = [
        lambda: download(fresh, tmp_path / "a", "config.json", repo_id=BUILD.PRIVATE, token=WRONG_TOKEN),
        lambda: snapshot_download(BUILD.PRIVATE, endpoint=fresh, cache_dir=tmp_path / "b", token=WRONG_TOKEN),
        lambda: HfApi(endpoint=fresh, token=WRONG_TOKEN).model_info(QWEN),  # as on the Hub: public repos too
    ]
    for attempt in attempts:
        with pytest.raises(HfHubHTTPError) as error:
            attempt()
        assert not isinstance(error.value, RepositoryNotFoundError)
        assert error.value.response.status_code == 401
        assert "Invalid credentials in Authorization header" in str(error.value)
        assert WRONG_TOKEN not in str(error.value)


def test_wrong_token_is_not_noticed_when_the_file_is_cached(fresh: str, tmp_path: Path) -> None:
    """The client falls back to its cache on a failed HEAD (401 included): a bad token goes unnoticed then."""
    cache = tmp_path / "cache"
    good = download(fresh, cache, "config.json", repo_id=BUILD.PRIVATE, token=GOOD_TOKEN)
    assert download(fresh, cache, "config.json", repo_id=BUILD.PRIVATE, token=WRONG_TOKEN) == good
    folder = snapshot_download(BUILD.PRIVATE, endpoint=fresh, cache_dir=cache, token=GOOD_TOKEN)
    assert snapshot_download(BUILD.PRIVATE, endpoint=fresh, cache_dir=cache, token=WRONG_TOKEN) == folder
