"""module_utils/atomic_file.py: the one way sparkfleet's modules replace a file. The content lands whole, with
the mode asked for whatever the umask, in folders made as asked; no temporary file stays behind, after success
or after a failure halfway."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import atomic_file
import pytest
from atomic_file import write_bytes_atomically, write_json_atomically, write_text_atomically


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def strict_umask():
    """A umask that would filter 0644 and 0755, as a root shell hardened with umask 077 has."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_text_lands_whole_with_its_mode_and_folders(tmp_path: Path, strict_umask):
    path = tmp_path / "run" / "sparkfleet" / "help.txt"
    write_text_atomically(path, "first\n")
    write_text_atomically(path, "second, longer ✓\n")
    assert path.read_text(encoding="utf-8") == "second, longer ✓\n"
    assert mode_of(path) == 0o644
    assert mode_of(path.parent) == mode_of(path.parent.parent) == 0o755
    assert os.listdir(path.parent) == ["help.txt"]


def test_mode_and_folder_mode_are_the_callers(tmp_path: Path, strict_umask):
    secret = tmp_path / "private" / "token"
    write_bytes_atomically(secret, b"s3cr3t", mode=0o600, folder_mode=0o700)
    assert (secret.read_bytes(), mode_of(secret), mode_of(secret.parent)) == (b"s3cr3t", 0o600, 0o700)


def test_an_existing_folder_keeps_its_mode(tmp_path: Path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    write_text_atomically(folder / "a.txt", "a")
    assert mode_of(folder) == 0o700


def test_mode_none_leaves_the_mode_to_the_caller(tmp_path: Path):
    """vllm_bench_report sets the mode (and owner) the task asked for right after, with Ansible's own call."""
    path = tmp_path / "results.csv"
    write_bytes_atomically(path, b"a,b\n", mode=None, folder_mode=None)
    assert path.read_bytes() == b"a,b\n" and mode_of(path) == 0o600


def test_folder_mode_none_needs_the_folder(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        write_text_atomically(tmp_path / "missing" / "a.txt", "a", folder_mode=None)
    assert not (tmp_path / "missing").exists()


def test_json_is_sorted_ends_with_a_newline_and_reads_back(tmp_path: Path):
    path = tmp_path / "status.json"
    write_json_atomically(path, {"b": 1, "a": [1, 2]}, fsync=False)
    assert path.read_text() == '{"a": [1, 2], "b": 1}\n'
    write_json_atomically(path, {"b": 1, "a": 2}, indent=1)
    assert path.read_text() == '{\n "a": 2,\n "b": 1\n}\n'
    assert json.loads(path.read_text()) == {"a": 2, "b": 1}


def test_a_value_json_cannot_hold_changes_nothing(tmp_path: Path):
    path = tmp_path / "status.json"
    write_json_atomically(path, {"state": "pulling"})
    with pytest.raises(TypeError):
        write_json_atomically(path, {"state": object()})
    assert json.loads(path.read_text()) == {"state": "pulling"}
    assert os.listdir(tmp_path) == ["status.json"]


@pytest.mark.parametrize("fails_at", ["write", "fsync", "chmod", "replace"])
def test_a_failure_halfway_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str
):
    path = tmp_path / "marker.json"
    path.write_text("old\n")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if fails_at == "write":
        monkeypatch.setattr(atomic_file.os, "fdopen", lambda fd, *a, **k: BrokenFile(fd))
    else:
        monkeypatch.setattr(atomic_file.os, fails_at, broken)
    with pytest.raises(OSError, match="No space left on device"):
        write_text_atomically(path, "new\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["marker.json"]


class BrokenFile:
    """A file whose write fails, as on a full disk; it still closes its descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> BrokenFile:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")


def test_an_interrupt_halfway_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_file.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomically(tmp_path / "a.txt", "a")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
