"""Folding Docker's pull stream into progress, and the words about it, on a stream recorded from a real pull.

tests/fixtures/recorded/docker-pull-stream.jsonl is what Docker Engine 20.10.24 (API 1.41) sent for
`POST /images/create?fromImage=127.0.0.1:34691/sparkfleet-helper-test/rec&tag=v1` from a loopback registry:
one layer already present, a 3.0 MB and a 1.5 MB layer of random bytes, and a 113-byte one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from docker_engine import api_path, decode_json_stream, error_message, image_path
from helpers import ROOT
from pull_progress import (
    apply_event,
    estimate_total_bytes,
    explain_pull_error,
    fold_events,
    format_duration,
    format_part_of_total,
    format_size,
    format_time_left,
    image_reference,
    is_digest,
    name_problem,
    new_tracker,
    normalize_repository,
    progress_message,
    progress_record,
    read_status_file,
    reference_problem,
    repo_digest_for,
    short_image,
    write_status_file,
)

RECORDED = ROOT / "tests" / "fixtures" / "recorded" / "docker-pull-stream.jsonl"
DIGEST = "sha256:ceb12cca0f9b041348eb6126f0ba9fbbe11875f3e29c96c5be64d3da33689942"
IMAGE = "127.0.0.1:34691/sparkfleet-helper-test/rec:v1"

# Also recorded from the same engine: the same pull again, and one whose 3.0 MB blob the registry had lost.
UP_TO_DATE = [
    {"status": "Pulling from sparkfleet-helper-test/rec", "id": "v1"},
    {"status": f"Digest: {DIGEST}"},
    {"status": f"Status: Image is up to date for {IMAGE}"},
]
LOST_BLOB = [
    {"status": "Pulling from sparkfleet-helper-test/rec", "id": "v1"},
    {"status": "Already exists", "progressDetail": {}, "id": "c6e677264aa1"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "3e34c75f231b"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "a2349bbd2230"},
    {"status": "Downloading", "progressDetail": {"current": 36445, "total": 1500649}, "id": "a2349bbd2230"},
    {"status": "Downloading", "progressDetail": {}, "id": "3e34c75f231b"},
    {"status": "Downloading", "progressDetail": {"current": 1500649, "total": 1500649}, "id": "a2349bbd2230"},
    {"errorDetail": {"message": "unknown blob"}, "error": "unknown blob"},
]


def recorded_events() -> list[dict]:
    return [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]


def record_of(events: list[dict], state: str = "pulling", started: float = 1000.0, updated: float = 1000.0) -> dict:
    return progress_record(fold_events(events), IMAGE, state, started, updated)


# --- folding the stream ---------------------------------------------------------------------------------------


def test_the_recorded_stream_folds_into_a_finished_pull():
    record = record_of(recorded_events(), "done", 1000.0, 1002.5)
    assert record == {
        "state": "done",
        "image": IMAGE,
        "started": 1000.0,
        "updated": 1002.5,
        "layers_total": 4,
        "layers_done": 4,
        "layers_present": 1,
        "layers_downloaded": 3,
        "layers_size_known": 3,
        "bytes_done": 3001131 + 1500649 + 113,
        "bytes_total_known": 3001131 + 1500649 + 113,
        "digest": DIGEST,
        "outcome": f"Downloaded newer image for {IMAGE}",
        "error": None,
    }


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # "Pulling from" names the tag in "id"; it is no layer.
        (1, {"layers_total": 0, "layers_done": 0, "bytes_done": 0, "layers_size_known": 0}),
        (5, {"layers_total": 4, "layers_done": 1, "layers_present": 1, "bytes_done": 0, "layers_size_known": 0}),
        (7, {"layers_done": 1, "layers_downloaded": 0, "bytes_done": 113 + 36445, "layers_size_known": 2}),
        (10, {"layers_downloaded": 1, "bytes_done": 113 + 36445 + 36445, "layers_size_known": 3}),
        # "Verifying Checksum" counts the whole 3.0 MB layer, though its last "Downloading" said 36445.
        (15, {"layers_downloaded": 3, "bytes_done": 113 + 1500649 + 3001131, "layers_done": 1}),
        (len(recorded_events()), {"layers_done": 4, "layers_downloaded": 3}),
    ],
    ids=["pulling-from", "layers-listed", "first-progress", "downloading", "downloaded-not-unpacked", "all"],
)
def test_a_stream_folded_part_by_part(lines, expected):
    record = record_of(recorded_events()[:lines])
    assert {key: record[key] for key in expected} == expected


def test_folding_more_of_the_stream_into_a_tracker_equals_folding_it_all_at_once():
    events = recorded_events()
    tracker = fold_events(events[:9])
    fold_events(events[9:], tracker)
    assert tracker == fold_events(events)


def test_an_up_to_date_pull_has_no_layers_and_says_so():
    record = record_of(UP_TO_DATE, "done")
    assert record["layers_total"] == 0 and record["bytes_done"] == 0
    assert record["digest"] == DIGEST
    assert record["outcome"] == f"Image is up to date for {IMAGE}"


def test_an_error_in_the_stream_is_kept_with_the_progress_before_it():
    record = record_of(LOST_BLOB, "failed")
    assert record["error"] == "unknown blob"
    # An empty "Downloading" of the 3.0 MB layer keeps what is known; the 1.5 MB layer arrived.
    assert record["bytes_done"] == 1500649
    assert record["layers_present"] == 1


def test_error_without_detail_and_retries_are_understood():
    tracker = new_tracker()
    apply_event(tracker, {"status": "Pulling fs layer", "id": "aaa"})
    apply_event(tracker, {"status": "Downloading", "progressDetail": {"current": 10, "total": 100}, "id": "aaa"})
    apply_event(tracker, {"status": "Retrying in 5 seconds", "progressDetail": {}, "id": "aaa"})
    assert tracker["layers"]["aaa"]["status"] == "Retrying in 5 seconds"
    assert tracker["layers"]["aaa"]["current"] == 10
    apply_event(tracker, {"error": "EOF"})
    assert tracker["error"] == "EOF"


def test_a_record_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="'finished' is not one of pulling, done, failed"):
        progress_record(new_tracker(), IMAGE, "finished", 0, 0)


# --- estimates and words --------------------------------------------------------------------------------------


def mid_pull(**changes) -> dict:
    """A hand-made record 4m10s into a pull of 31 layers, 15 of whose sizes are known."""
    record = {
        "state": "pulling",
        "image": "vllm/vllm-openai@sha256:abc0123456789abc0123456789abc0123456789abc0123456789abc012345678",
        "started": 1000.0,
        "updated": 1250.0,
        "layers_total": 31,
        "layers_done": 12,
        "layers_present": 0,
        "layers_downloaded": 13,
        "layers_size_known": 15,
        "bytes_done": 3_125_000_000,
        "bytes_total_known": 5_032_258_065,
        "digest": None,
        "outcome": None,
        "error": None,
    }
    return record | changes


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"layers_total": 4, "layers_size_known": 0, "bytes_total_known": 0}, None),
        ({"layers_total": 4, "layers_size_known": 4, "bytes_total_known": 400}, 400),
        ({"layers_total": 4, "layers_size_known": 2, "bytes_total_known": 400}, 800),
        # Present layers need no download and do not count as unknown.
        ({"layers_total": 4, "layers_present": 2, "layers_size_known": 2, "bytes_total_known": 400}, 400),
        # Never less than what has arrived.
        ({"layers_total": 2, "layers_size_known": 1, "bytes_total_known": 10, "bytes_done": 50}, 50),
    ],
    ids=["nothing-known", "all-known", "half-known", "present-layers", "at-least-done"],
)
def test_estimate_total_bytes(record, expected):
    assert estimate_total_bytes(record) == expected


@pytest.mark.parametrize(
    ("record", "now", "expected"),
    [
        (None, 0, "waiting for the pull to start"),
        (
            mid_pull(),
            1250.0,
            "vllm/vllm-openai@sha256:abc012345678…: 3.1 of about 10.4 GB (12 of 31 layers) after 4m10s, "
            "12.5 MB/s, about 10m left",
        ),
        (
            mid_pull(updated=1005.0, bytes_done=40_000_000),
            1006.0,
            "vllm/vllm-openai@sha256:abc012345678…: 0.0 of about 10.4 GB (12 of 31 layers) after 6s, "
            "estimating the time left",
        ),
        (
            mid_pull(layers_size_known=0, bytes_total_known=0, bytes_done=0, layers_done=0),
            1003.0,
            "vllm/vllm-openai@sha256:abc012345678…: 0 B so far (0 of 31 layers) after 3s, estimating the size",
        ),
        (
            mid_pull(layers_total=0, layers_done=0),
            1002.0,
            "vllm/vllm-openai@sha256:abc012345678…: asking the registry for the image's layers, after 2s",
        ),
        (
            mid_pull(layers_downloaded=31, layers_size_known=31, bytes_done=10_400_000_000, layers_done=28),
            1900.0,
            "vllm/vllm-openai@sha256:abc012345678…: all 10.4 GB downloaded, unpacking (28 of 31 layers) after 15m00s",
        ),
        (
            record_of(recorded_events(), "done", 1000.0, 1002.0),
            5000.0,
            f"{IMAGE}: done, 4.5 MB downloaded in 2s (2.3 MB/s; 4 layers, 1 already present)",
        ),
        (
            record_of(UP_TO_DATE, "done"),
            5000.0,
            f"{IMAGE}: done, nothing to download (Image is up to date for {IMAGE})",
        ),
        (
            record_of(LOST_BLOB, "failed", 1000.0, 1003.0),
            5000.0,
            f"{IMAGE}: the pull failed after 3s: unknown blob",
        ),
    ],
    ids=[
        "no-file",
        "mid-pull",
        "too-early",
        "no-size-yet",
        "no-layers-yet",
        "unpacking",
        "done",
        "up-to-date",
        "failed",
    ],
)
def test_progress_message(record, now, expected):
    assert progress_message(record, now) == expected


@pytest.mark.parametrize(
    ("function", "value", "expected"),
    [
        (format_size, 999, "999 B"),
        (format_size, 36445, "36.4 kB"),
        (format_size, 12_500_000, "12.5 MB"),
        (format_size, 10_412_345_678, "10.4 GB"),
        (format_duration, 42, "42s"),
        (format_duration, 250, "4m10s"),
        (format_duration, 3900, "1h05m"),
        (format_duration, -3, "0s"),
        (format_time_left, 30, "less than a minute left"),
        (format_time_left, 545, "about 9m left"),
        (format_time_left, 3900, "about 1h05m left"),
        (short_image, "a/b@sha256:" + "0123456789ab" * 5 + "cdef", "a/b@sha256:0123456789ab…"),
        (short_image, "a/b:cu130-nightly", "a/b:cu130-nightly"),
    ],
)
def test_words_for_sizes_times_and_images(function, value, expected):
    assert function(value) == expected


def test_part_of_total_uses_the_totals_unit():
    assert format_part_of_total(3.1e9, 10.4e9) == "3.1 of about 10.4 GB"
    assert format_part_of_total(400, 800) == "400 of about 800 B"


# --- image references -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reference", "problem"),
    [
        ("vllm/vllm-openai", "cu130-nightly", None),
        ("registry.example:5000/vllm/vllm-openai", DIGEST, None),
        ("ubuntu", "24.04", None),
        ("vllm/vllm-openai:latest", "latest", "carries a tag or digest"),
        ("vllm/vllm-openai@" + DIGEST, DIGEST, "carries a tag or digest"),
        ("vLLM/openai", "x", "is not a repository name"),
        ("vllm/vllm-openai", "sha256:abc", "starts like a digest"),
        ("vllm/vllm-openai", "-bad", "is not a tag"),
    ],
)
def test_names_and_references_are_checked(name, reference, problem):
    found = name_problem(name) or reference_problem(reference)
    assert (found is None) if problem is None else (problem in found)


def test_image_reference_joins_a_tag_with_colon_and_a_digest_with_at():
    assert image_reference("vllm/vllm-openai", "cu130-nightly") == "vllm/vllm-openai:cu130-nightly"
    assert image_reference("vllm/vllm-openai", DIGEST) == f"vllm/vllm-openai@{DIGEST}"
    assert is_digest(DIGEST) and not is_digest("cu130-nightly")


@pytest.mark.parametrize(
    ("name", "normal"),
    [
        ("vllm/vllm-openai", "docker.io/vllm/vllm-openai"),
        ("docker.io/vllm/vllm-openai", "docker.io/vllm/vllm-openai"),
        ("index.docker.io/vllm/vllm-openai", "docker.io/vllm/vllm-openai"),
        ("ubuntu", "docker.io/library/ubuntu"),
        ("docker.io/ubuntu", "docker.io/library/ubuntu"),
        ("library/ubuntu", "docker.io/library/ubuntu"),
        ("localhost/a", "localhost/a"),
        ("127.0.0.1:5000/sparkfleet-helper-test/app", "127.0.0.1:5000/sparkfleet-helper-test/app"),
    ],
)
def test_normalize_repository(name, normal):
    assert normalize_repository(name) == normal


@pytest.mark.parametrize(
    ("name", "repo_digests", "expected"),
    [
        ("vllm/vllm-openai", [f"vllm/vllm-openai@{DIGEST}"], DIGEST),
        ("docker.io/vllm/vllm-openai", [f"vllm/vllm-openai@{DIGEST}"], DIGEST),
        ("docker.io/library/ubuntu", [f"ubuntu@{DIGEST}"], DIGEST),
        ("ubuntu", [f"other/ubuntu@sha256:{'0' * 64}", f"ubuntu@{DIGEST}"], DIGEST),
        ("registry.example:5000/vllm/vllm-openai", [f"vllm/vllm-openai@{DIGEST}"], None),
        ("vllm/vllm-openai", [], None),
        ("vllm/vllm-openai", None, None),
    ],
    ids=["hub-short", "hub-long", "official-image", "several", "other-registry", "empty", "none"],
)
def test_repo_digest_for(name, repo_digests, expected):
    assert repo_digest_for(name, repo_digests) == expected


@pytest.mark.parametrize(
    ("name", "words", "expected"),
    [
        (
            "127.0.0.1:5000/a/b",
            "manifest for 127.0.0.1:5000/a/b:nope not found: manifest unknown: manifest unknown",
            "check that the tag or digest exists in 127.0.0.1:5000",
        ),
        ("vllm/vllm-openai", "pull access denied for vllm/nothing", "logged in to Docker Hub (docker.io)"),
        ("127.0.0.1:1/a/b", "dial tcp 127.0.0.1:1: connect: connection refused", "127.0.0.1:1 is reachable"),
        ("a/b", "write /var/lib/docker/tmp/x: no space left on device", "free disk space"),
        ("a/b", "unknown blob", "served a broken or missing layer"),
        ("a/b", "something new", "dockerd's log"),
    ],
    ids=["manifest-unknown", "denied", "unreachable", "disk-full", "lost-blob", "other"],
)
def test_pull_errors_name_the_image_quote_the_words_and_say_what_to_check(name, words, expected):
    message = explain_pull_error(name, "v1", words)
    assert message.startswith(f"Pulling {name}:v1 failed: {words}. ")
    assert expected.lower() in message.lower()


# --- the status file ------------------------------------------------------------------------------------------


def test_the_status_file_is_written_whole_with_its_folders(tmp_path: Path):
    path = tmp_path / "run" / "sparkfleet" / "docker-pull.json"
    old_umask = os.umask(0o077)
    try:
        write_status_file(str(path), mid_pull())
        write_status_file(str(path), mid_pull(state="done"))
    finally:
        os.umask(old_umask)
    assert read_status_file(str(path)) == mid_pull(state="done")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o755
    assert [child.name for child in path.parent.iterdir()] == ["docker-pull.json"]


def test_reading_a_missing_or_foreign_status_file(tmp_path: Path):
    assert read_status_file(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_text("{half")
    with pytest.raises(ValueError, match=r"bad\.json is not JSON"):
        read_status_file(str(tmp_path / "bad.json"))
    (tmp_path / "other.json").write_text('{"state": "sleeping"}')
    with pytest.raises(ValueError, match=r"other\.json is not a docker_pull status file"):
        read_status_file(str(tmp_path / "other.json"))


# --- the engine's stream and paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100_000])
def test_the_stream_decodes_the_same_however_it_is_chunked(chunk_size):
    raw = b"".join(line.encode() + b"\r\n" for line in RECORDED.read_text().splitlines())
    chunks = [raw[start : start + chunk_size] for start in range(0, len(raw), chunk_size)]
    assert list(decode_json_stream(chunks)) == recorded_events()


def test_the_stream_decoder_copes_with_joined_broken_and_unfinished_messages():
    chunks = [b'{"status":"a"}{"status":"b"}\r\n', b"\r\n", b"<html>proxy error</html>\r\n", b'{"status":"c"']
    events = list(decode_json_stream(chunks))
    assert events[:2] == [{"status": "a"}, {"status": "b"}]
    assert "not JSON" in events[2]["error"] and "proxy error" in events[2]["error"]
    assert "not JSON" in events[3]["error"]
    assert len(events) == 4


def test_engine_paths_and_error_words():
    assert api_path("/images/create", {"fromImage": "127.0.0.1:5000/a/b", "tag": DIGEST}) == (
        f"/v1.41/images/create?fromImage=127.0.0.1%3A5000%2Fa%2Fb&tag=sha256%3A{DIGEST[7:]}"
    )
    assert image_path(f"127.0.0.1:5000/a/b@{DIGEST}") == f"/v1.41/images/127.0.0.1:5000/a/b@{DIGEST}/json"
    assert error_message(b'{"message":"no such image: x"}', 404) == "no such image: x"
    assert error_message(b"", 500) == "HTTP 500 with an empty answer"
