#!/usr/bin/env python3
"""Verification throughput of hf_prefetch against a raw cold sequential read of the same files.

Writes N shards of random bytes (a stand-in for a model's safetensors shards; the hash work does not depend on
the content), drops them from the page cache, times a plain sequential read of every byte, drops them again, and
times hf_snapshot.file_problems at level 'full' (size + sha256 of every file, shards hashed in parallel), the
check a Spark runs after each download. Goal (issue 5): verification reaches at least 0.9 of the raw read's rate,
so verifying never costs much more than reading the weights once.

Usage: .venv/bin/python bench/verify-throughput.py [--gib 4] [--shards 4] [--dir /var/tmp/sparkfleet-bench]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "module_utils"))
import hf_snapshot

CHUNK = 8 * 1024 * 1024


def write_shards(folder: Path, total_bytes: int, shards: int) -> list[dict]:
    """Random shards and their manifest entries (path, size, sha256), as the Hub's tree listing gives them."""
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for number in range(shards):
        path = folder / f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        digest = hashlib.sha256()
        with open(path, "wb") as out:
            left = total_bytes // shards
            while left:
                block = os.urandom(min(CHUNK, left))
                digest.update(block)
                out.write(block)
                left -= len(block)
            out.flush()
            os.fsync(out.fileno())
        items.append({"path": path.name, "size": path.stat().st_size, "sha256": digest.hexdigest()})
    return items


def evict(folder: Path) -> str:
    """Drop the files from the page cache, so each timed pass reads from the disk. Returns how."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("1\n")
        return "drop_caches + POSIX_FADV_DONTNEED"
    except OSError:
        return "POSIX_FADV_DONTNEED (drop_caches not writable here)"


def raw_read(folder: Path, items: list[dict]) -> float:
    """Seconds for one thread to read every byte in order: the floor any verification has to stand on."""
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    for item in items:
        with open(folder / item["path"], "rb", buffering=0) as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while handle.readinto(buffer):
                pass
    return time.perf_counter() - started


def verify(folder: Path, items: list[dict], workers: int) -> float:
    started = time.perf_counter()
    problems = hf_snapshot.file_problems(str(folder), items, "full", workers)
    elapsed = time.perf_counter() - started
    if problems:
        raise SystemExit(f"verification found problems in sound files: {problems}")
    return elapsed


def seconds(times: list[float]) -> str:
    return ", ".join(f"{value:.2f} s" for value in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="total size of the shards (default 4)")
    parser.add_argument("--shards", type=int, default=4, help="number of shards (default 4)")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8), help="hashing threads")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/sparkfleet-bench-verify"))
    parser.add_argument("--runs", type=int, default=3, help="timed passes of each kind; the median counts")
    args = parser.parse_args()

    folder = args.dir
    shutil.rmtree(folder, ignore_errors=True)
    try:
        items = write_shards(folder, int(args.gib * 2**30), args.shards)
        total = sum(item["size"] for item in items)
        raw_times, verify_times = [], []
        how = ""
        for _ in range(args.runs):
            how = evict(folder)
            raw_times.append(raw_read(folder, items))
            evict(folder)
            verify_times.append(verify(folder, items, args.workers))
        raw_s, verify_s = sorted(raw_times)[len(raw_times) // 2], sorted(verify_times)[len(verify_times) // 2]
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    raw_rate, verify_rate = total / raw_s / 1e9, total / verify_s / 1e9
    print(f"files:              {args.shards} shards, {total / 1e9:.2f} GB, cold reads ({how})")
    print(f"cpus / hash threads: {os.cpu_count()} / {args.workers}")
    print(f"raw sequential read: {raw_rate:.2f} GB/s (median of {args.runs} runs: {seconds(raw_times)})")
    print(f"verify (size+sha256): {verify_rate:.2f} GB/s (median of {args.runs} runs: {seconds(verify_times)})")
    ratio = verify_rate / raw_rate
    print(f"verify / raw read:   {ratio:.2f} (goal >= 0.90: {'met' if ratio >= 0.9 else 'NOT met'})")


if __name__ == "__main__":
    main()
