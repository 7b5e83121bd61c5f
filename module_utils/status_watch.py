"""The wait both progress watchers share (docker_pull_watch, hf_prefetch_watch): read a background job's status
record until it says the job ended or the wait is over, so the play prints one line per interval."""

from __future__ import annotations

import time
from collections.abc import Callable

END_STATES = ("done", "failed")
POLL_SECONDS = 1.0


def wait_for_end(read: Callable[[], dict | None], wait_seconds: float) -> dict | None:
    """The last record read: one whose state is in END_STATES, or the latest when wait_seconds ran out. None
    means the job has not written a record yet."""
    deadline = time.monotonic() + wait_seconds
    record = read()
    while (record is None or record["state"] not in END_STATES) and time.monotonic() < deadline:
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0)))
        record = read()
    return record
