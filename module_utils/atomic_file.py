"""Writing a file so that a reader never sees half of it: a temporary file beside the target, then os.replace.

The one way sparkfleet's modules replace a file: the progress records of docker_pull and hf_prefetch, the marker of
a verified snapshot, the cached `vllm serve --help=all` of an image, the files of a benchmark report.

Nothing here imports Ansible, so pytest calls these functions directly. A module imports them as
`from ansible.module_utils.atomic_file import write_text_atomically`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


def make_folders(folder: str, mode: int = 0o755) -> None:
    """Create `folder` and the folders above it that are missing, each with exactly `mode` (mkdir's mode would be
    filtered by the umask). Folders already there are left as they are."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        try:
            os.mkdir(path, mode)
        except FileExistsError:  # made by someone else meanwhile
            continue
        os.chmod(path, mode)


def write_bytes_atomically(
    path: str | os.PathLike,
    data: bytes,
    *,
    mode: int | None = 0o644,
    folder_mode: int | None = 0o755,
    fsync: bool = True,
) -> None:
    """Replace `path` with `data`. The bytes go to a temporary file in the same folder ('.<name>.<random>.tmp'),
    which then takes the name with os.replace: a reader sees the old content or the new, never a mix.

    mode: the file's permission bits, exactly (not filtered by the umask); None leaves the temporary file's 0600,
      for a caller that sets the mode (and owner) itself right after.
    folder_mode: folders missing above `path` are created with exactly these bits; None: the folder must exist.
    fsync: the bytes reach the disk before the rename, and the rename before the return, so that after a crash
      `path` holds the old content or the new, never an empty file. A record rewritten every second that nobody
      reads after a reboot can skip it.

    On any failure the temporary file is removed and the error raised; `path` is then as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if folder_mode is not None:
        make_folders(folder, folder_mode)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if fsync:
                out.flush()
                os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if fsync:
        _fsync_folder(folder)


def write_text_atomically(
    path: str | os.PathLike,
    text: str,
    *,
    mode: int | None = 0o644,
    folder_mode: int | None = 0o755,
    fsync: bool = True,
    encoding: str = "utf-8",
) -> None:
    """write_bytes_atomically for text, encoded with `encoding`."""
    write_bytes_atomically(path, text.encode(encoding), mode=mode, folder_mode=folder_mode, fsync=fsync)


def write_json_atomically(
    path: str | os.PathLike,
    data: object,
    *,
    indent: int | None = None,
    mode: int | None = 0o644,
    folder_mode: int | None = 0o755,
    fsync: bool = True,
) -> None:
    """`data` as JSON (keys sorted, one line unless `indent` is given, a newline at the end), through
    write_text_atomically. A value JSON cannot hold raises before anything is written."""
    text = json.dumps(data, indent=indent, sort_keys=True) + "\n"
    write_text_atomically(path, text, mode=mode, folder_mode=folder_mode, fsync=fsync)


def _fsync_folder(folder: str) -> None:
    """Make a rename in `folder` durable; a file system that cannot fsync a folder is left as it is."""
    try:
        handle = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(handle)
    finally:
        os.close(handle)
