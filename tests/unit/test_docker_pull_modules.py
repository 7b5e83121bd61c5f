"""docker_pull and job_watch (kind=pull) in-process (tests/unit/conftest.py's run_module): what they do without a
Docker engine, namely refusing bad input, naming a missing engine, and reading a pull's status file. The pulls
themselves, from a loopback registry through this machine's dockerd, are in
tests/integration/test_docker_pull_registry.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

# --- docker_pull ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"name": "vllm/vllm-openai:latest", "reference": "latest"}, "give the repository alone in name"),
        ({"name": "vllm/vllm-openai", "reference": "sha256:abc"}, "starts like a digest"),
        ({"name": "a/b", "reference": "v1", "docker_socket": "/nonexistent.sock"}, "/nonexistent.sock does not exist"),
    ],
    ids=["tag-in-name", "short-digest", "no-socket"],
)
def test_bad_input_and_a_missing_engine_are_named(run_module, tmp_path, args, message):
    result = run_module("docker_pull", {"status_file": str(tmp_path / "pull.json"), **args})
    assert result["failed"] is True
    assert message in result["msg"]


# --- job_watch, kind=pull ---------------------------------------------------------------------------------------


def write_status(path: Path, **record) -> None:
    path.write_text(json.dumps(record))


def test_watch_without_a_status_file_waits_for_the_pull_to_start(run_module, watch_clock, tmp_path):
    started = watch_clock.monotonic()
    result = run_module("job_watch", {"kind": "pull", "status_file": str(tmp_path / "none.json"), "wait_seconds": 2})
    assert watch_clock.monotonic() - started >= 2
    assert (result["changed"], result["done"], result["state"], result["error"]) == (False, False, None, None)
    assert result["message"] == "waiting for the pull to start"


def test_watch_mid_pull_reports_bytes_layers_and_time_left(run_module, watch_clock, tmp_path):
    now = time.time()
    path = tmp_path / "pull.json"
    write_status(
        path,
        state="pulling",
        image="vllm/vllm-openai@sha256:" + "ab12" * 16,
        started=now - 250,
        updated=now,
        layers_total=31,
        layers_done=12,
        layers_present=0,
        layers_downloaded=13,
        layers_size_known=15,
        bytes_done=3_125_000_000,
        bytes_total_known=5_032_258_065,
        digest=None,
        outcome=None,
        error=None,
    )
    args = {"kind": "pull", "status_file": str(path), "wait_seconds": 1}
    result = run_module("job_watch", args, check_mode=True)
    assert (result["changed"], result["done"], result["state"]) == (False, False, "pulling")
    assert result["message"].startswith(
        "vllm/vllm-openai@sha256:ab12ab12ab12…: 3.1 of about 10.4 GB (12 of 31 layers) after 4m1"
    )
    assert result["message"].endswith(", 12.5 MB/s, about 10m left")


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        ("done", None, "a/b:v1: done, 4.5 MB downloaded in 2s"),
        ("failed", "unknown blob", "a/b:v1: the pull failed after 2s: unknown blob"),
    ],
)
def test_watch_on_an_ended_pull_is_done_and_never_fails(run_module, watch_clock, tmp_path, state, error, message):
    path = tmp_path / "pull.json"
    write_status(
        path,
        state=state,
        image="a/b:v1",
        started=100.0,
        updated=102.0,
        layers_total=4,
        layers_done=4,
        layers_present=1,
        layers_downloaded=3,
        layers_size_known=3,
        bytes_done=4_501_893,
        bytes_total_known=4_501_893,
        digest=None,
        outcome=None,
        error=error,
    )
    started = watch_clock.monotonic()
    result = run_module("job_watch", {"kind": "pull", "status_file": str(path), "wait_seconds": 30})
    assert watch_clock.monotonic() - started < 20  # an ended pull answers at once
    assert not result.get("failed")
    assert (result["changed"], result["done"], result["state"], result["error"]) == (False, True, state, error)
    assert result["message"].startswith(message)
