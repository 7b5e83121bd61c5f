"""Plain functions behind library/'s free-space module (this file's name plus _info): free space on the file
system that holds (or will hold) a path.

Ansible's mount facts leave out overlay and tmpfs mounts (their device is not a path), and the paths that
sparkfleet will fill may not exist yet, so the module asks the kernel (statvfs) about the nearest existing
parent instead.
"""

from __future__ import annotations

import os

GIB = 1024**3


def nearest_existing(path: str) -> str:
    """`path` itself if it exists, else its closest existing parent (at worst '/')."""
    path = os.path.normpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def free_space(path: str) -> dict:
    """Free and total bytes, for an unprivileged writer like the root-owned services, of the file system of `path`."""
    existing = nearest_existing(path)
    stats = os.statvfs(existing)
    return {
        "path": path,
        "measured_at": existing,
        "free_bytes": stats.f_bavail * stats.f_frsize,
        "total_bytes": stats.f_blocks * stats.f_frsize,
    }


def shortfall(measurement: dict, min_free_gib: float, variable: str) -> str | None:
    """A message when the file system has less than `min_free_gib` free, naming the variable to change."""
    free_gib = measurement["free_bytes"] / GIB
    if free_gib >= min_free_gib:
        return None
    return (
        f"{measurement['path']} (measured at {measurement['measured_at']}) has {free_gib:.1f} GiB free; it needs "
        f"{min_free_gib} GiB. Free space there, or lower its min_free_gib in {variable}."
    )
