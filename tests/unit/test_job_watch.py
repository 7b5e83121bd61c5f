"""job_watch in-process (tests/unit/conftest.py's run_module), on what both kinds share: the async job's results
file ending the wait, the growing wait, and the refusals. What each kind's status file says is tested beside its
job: tests/unit/test_docker_pull_modules.py (pull) and tests/unit/test_hf_prefetch_module.py (fetch); the task
retried until done, with a real pull, in tests/integration/test_docker_pull_registry.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from status_watch import job_result, wait_seconds_for


def pull_record(state: str = "pulling", **changes) -> dict:
    now = time.time()
    record = {
        "state": state,
        "image": "a/b:v1",
        "started": now - 100,
        "updated": now,
        "layers_total": 2,
        "layers_done": 0,
        "layers_present": 0,
        "layers_downloaded": 0,
        "layers_size_known": 2,
        "bytes_done": 1_000_000,
        "bytes_total_known": 4_000_000,
        "digest": None,
        "outcome": None,
        "error": None,
    }
    return {**record, **changes}


@pytest.fixture
def status_file(tmp_path: Path) -> Path:
    path = tmp_path / "pull.json"
    path.write_text(json.dumps(pull_record()))
    return path


def test_a_running_job_waits_the_whole_interval(run_module, watch_clock, status_file, tmp_path):
    job_file = tmp_path / "j1"
    job_file.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j1"}))
    waited_from = watch_clock.monotonic()
    result = run_module("job_watch", {"kind": "pull", "status_file": str(status_file), "job_file": str(job_file)})
    assert watch_clock.monotonic() - waited_from == 30
    assert (result["done"], result["job_ended"], result["state"]) == (False, False, "pulling")
    assert result["waited_at_most"] == 30.0


@pytest.mark.parametrize(
    ("job", "error"),
    [
        ({"msg": "Timeout exceeded", "failed": True, "child_pid": 4242}, "Timeout exceeded"),
        ({"changed": False, "rc": 0}, None),
    ],
    ids=["killed-at-its-timeout", "ended-without-a-last-record"],
)
def test_a_job_whose_process_ended_ends_the_watch_at_once(run_module, watch_clock, status_file, tmp_path, job, error):
    job_file = tmp_path / "j1"
    job_file.write_text(json.dumps(job))
    waited_from = watch_clock.monotonic()
    result = run_module("job_watch", {"kind": "pull", "status_file": str(status_file), "job_file": str(job_file)})
    assert watch_clock.monotonic() == waited_from
    assert (result["done"], result["job_ended"], result["state"], result["error"]) == (True, True, "pulling", error)
    assert result["message"].startswith("a/b:v1: 1.0 of about 4.0 MB (0 of 2 layers) after 1m40s")
    assert result["message"].endswith("then the pull's process ended" + (f": {error}" if error else ""))
    assert result.get("failed") is not True


def test_the_status_files_end_wins_over_the_jobs(run_module, watch_clock, status_file, tmp_path):
    status_file.write_text(json.dumps(pull_record("failed", error="unknown blob")))
    job_file = tmp_path / "j1"
    job_file.write_text(json.dumps({"failed": True, "msg": "Pulling a/b:v1 failed: unknown blob. Retry."}))
    result = run_module("job_watch", {"kind": "pull", "status_file": str(status_file), "job_file": str(job_file)})
    assert (result["done"], result["job_ended"], result["state"]) == (True, True, "failed")
    assert result["error"] == "unknown blob"  # the status file's words, not the job's
    assert result["message"].startswith("a/b:v1: the pull failed after ")


def test_a_job_without_a_status_file_yet_ended_says_so(run_module, watch_clock, tmp_path):
    job_file = tmp_path / "j1"
    job_file.write_text(json.dumps({"failed": True, "msg": "MODULE FAILURE"}))
    args = {"kind": "fetch", "status_file": str(tmp_path / "none.json"), "job_file": str(job_file)}
    result = run_module("job_watch", args)
    assert (result["done"], result["state"], result["error"]) == (True, None, "MODULE FAILURE")
    assert result["message"] == "waiting for the prefetch to start; then the prefetch's process ended: MODULE FAILURE"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"wait_seconds": -1}, "wait_seconds=-1 is negative"),
        ({"kind": "fetch"}, "Could not read the prefetch's status file: "),
        ({"kind": "copy"}, "value of kind must be one of: fetch, pull, got: copy"),
    ],
    ids=["negative-wait", "a-pull-record-read-as-a-fetch", "unknown-kind"],
)
def test_what_the_watch_refuses(run_module, watch_clock, status_file, args, words):
    result = run_module("job_watch", {"kind": "pull", "status_file": str(status_file), **args})
    assert result["failed"] is True
    assert words in result["msg"]


def test_a_status_file_that_is_no_record_fails_the_watch(run_module, watch_clock, tmp_path):
    path = tmp_path / "pull.json"
    path.write_text("{half")
    result = run_module("job_watch", {"kind": "pull", "status_file": str(path)})
    assert result["failed"] is True and result["done"] is False
    assert result["msg"].startswith(f"Could not read the pull's status file: {path} is not JSON")


# --- the plain functions --------------------------------------------------------------------------------------


def test_the_wait_grows_to_a_twentieth_of_the_time_so_far():
    assert wait_seconds_for(30, None, 1_000_000) == 30
    assert wait_seconds_for(30, 1_000_000 - 300, 1_000_000) == 30
    assert wait_seconds_for(30, 1_000_000 - 1200, 1_000_000) == 60
    assert wait_seconds_for(30, 1_000_000 - 12_000, 1_000_000) == 600


def test_the_job_file_says_ended_only_with_a_result_in_it(tmp_path):
    job_file = tmp_path / "j1"
    assert job_result(None) is None
    assert job_result(str(job_file)) is None  # not written yet
    job_file.write_text("")
    assert job_result(str(job_file)) is None
    job_file.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j1"}))
    assert job_result(str(job_file)) is None
    job_file.write_text(json.dumps({"msg": "Timeout exceeded", "failed": True}))
    assert job_result(str(job_file)) == {"msg": "Timeout exceeded", "failed": True}
