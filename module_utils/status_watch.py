"""The wait behind job_watch: read a background job's status record until it says the job ended, or the job's
process ended, or the wait is over, so that a task retried with `until` reports once per interval.

Nothing here imports Ansible, so pytest calls these functions directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

END_STATES = ("done", "failed")
POLL_SECONDS = 1.0
# A long job's wait grows to this fraction of the time it has run: one report a minute after 20 minutes, one in
# 10 minutes after 3 hours and 20 minutes.
GROWTH = 1 / 20


def wait_seconds_for(interval: float, started: float | None, now: float) -> float:
    """How long one round waits: `interval`, or a twentieth of the time since `started` (epoch seconds) when that
    is longer. With no `started`, always `interval`."""
    if started is None:
        return interval
    return max(interval, (now - started) * GROWTH)


def job_result(job_file: str | None) -> dict | None:
    """What the async job's results file says once the job has ended (the module's result, or async_wrapper's
    timeout), read as ansible.builtin.async_status reads it; None while it runs, before the file exists, or with
    no file to read. async_wrapper replaces the file with a rename, so a half-written one is never read."""
    if not job_file:
        return None
    try:
        with open(job_file, encoding="utf-8") as handle:
            result = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or "started" in result:
        return None
    return result


def wait_for_end(
    read: Callable[[], dict | None],
    wait_seconds: float,
    job_ended: Callable[[], dict | None] = lambda: None,
) -> tuple[dict | None, dict | None]:
    """(the last record read, the job's result if its process ended). Returns when the record's state is in
    END_STATES, when job_ended() returns the ended job's result, or when wait_seconds ran out. A record of None
    means the job has not written one yet.

    job_ended() is asked before each read: a job that wrote its last record and then ended is seen with that
    record."""
    deadline = time.monotonic() + wait_seconds
    while True:
        ended = job_ended()
        record = read()
        if ended is not None or (record is not None and record["state"] in END_STATES):
            return record, ended
        left = deadline - time.monotonic()
        if left <= 0:
            return record, None
        time.sleep(min(POLL_SECONDS, left))
