"""module_utils/startup_times.py: a start's phases from Docker's and vLLM's own records, the record kept beside the
last good configuration, and the textfile metrics the alert VllmStartSlower reads."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from startup_times import (
    PHASES,
    docker_time,
    journal_entries,
    log_phases,
    next_record,
    startup_times,
    summary,
    textfile_metrics,
    textfile_path,
)

# Lines as vLLM 0.33.0 logs them (vllm/v1/worker/gpu_model_runner.py, vllm/entrypoints/launchers/api_server/entry.py).
LOADED = (
    "(EngineCore_DP0 pid=212) INFO 12-04 02:20:31 [gpu_model_runner.py:5089] "
    "Model loading took 66.9 GiB memory and 612.418203 seconds"
)
SERVING = "(APIServer pid=1) INFO 12-04 02:22:02 [entry.py:139] Starting vLLM server on http://127.0.0.1:8000"


def journal(*entries: tuple[float, object]) -> str:
    return "\n".join(json.dumps({"__REALTIME_TIMESTAMP": str(int(at * 1e6)), "MESSAGE": text}) for at, text in entries)


def test_dockers_start_time_is_read_to_the_microsecond():
    assert docker_time("1970-01-01T00:01:40.250000000Z") == pytest.approx(100.25)
    assert docker_time("1970-01-01T01:01:40+01:00") == pytest.approx(100.0)
    assert docker_time("0001-01-01T00:00:00Z") is None  # a container that never started
    assert docker_time("") is None and docker_time("garbage") is None


def test_vllms_log_tells_when_the_weights_were_loaded_and_the_server_started():
    text = journal((1000.0, "Started vllm-x.service."), (1612.5, LOADED), (1703.0, SERVING), (1800.0, LOADED))
    # A message journald could not store as text comes as a list of bytes.
    text += "\n" + json.dumps({"__REALTIME_TIMESTAMP": "1704000000", "MESSAGE": list(b"\xff binary")})
    entries = journal_entries(text + "\nnot json")
    assert len(entries) == 5
    assert log_phases(entries) == {"weights_loaded": 1612.5, "weight_load_s": 612.418203, "port_open": 1703.0}
    assert log_phases([(1.0, "an image whose log differs")]) == {}
    # The CPU engine's model runner does not say it; its loader does.
    weights = "INFO 12-04 02:20:31 [default_loader.py:507] Loading weights took 0.84 seconds"
    assert log_phases([(5.0, weights), (9.0, SERVING)]) == {
        "weights_loaded": 5.0,
        "weight_load_s": 0.84,
        "port_open": 9.0,
    }
    assert log_phases([(5.0, weights), (6.0, LOADED)])["weights_loaded"] == 6.0


def test_each_phase_counts_from_the_units_start_and_an_unseen_one_is_null():
    moments = {
        "container": 1001.5,
        "weights_loaded": 1612.5,
        "port_open": None,
        "healthy": 1710.0,
        "first_token": 1731.25,
    }
    times = startup_times(1000.0, moments, 612.418203, 21.25)
    assert times == {
        "started_at": 1000.0,
        "phases_s": {
            "container": 1.5,
            "weights_loaded": 612.5,
            "port_open": None,
            "healthy": 710.0,
            "first_token": 731.25,
        },
        "weight_load_s": 612.418,
        "startup_ttft_s": 21.25,
    }
    assert summary(times) == (
        "container 1.5 s, weights loaded 612.5 s, healthy 710 s, first token 731.25 s "
        "(weights loaded in 612.418 s, startup TTFT 21.25 s)"
    )


def start(healthy: float, at: float = 1000.0) -> dict:
    return startup_times(at, {phase: at + healthy for phase in PHASES}, 10.0, 1.0)


def test_the_record_keeps_this_start_and_the_one_before():
    first = next_record(None, start(300))
    assert first == {"last": start(300), "previous": None}
    second = next_record(json.dumps(first), start(900, at=5000.0))
    assert second == {"last": start(900, at=5000.0), "previous": start(300)}
    assert next_record("{broken", start(5))["previous"] is None


def test_the_metrics_are_prometheus_text_with_both_starts_by_phase():
    record = next_record(json.dumps(next_record(None, start(300))), start(900, at=5000.0))
    text = textfile_metrics(record, "vllm-a.service", 'odd"name')
    labels = 'unit="vllm-a.service",served_model_name="odd\\"name"'
    assert f'sparkfleet_vllm_startup_seconds{{{labels},phase="healthy"}} 900.0' in text
    assert f'sparkfleet_vllm_startup_previous_seconds{{{labels},phase="healthy"}} 300.0' in text
    assert f"sparkfleet_vllm_startup_weight_load_seconds{{{labels}}} 10.0" in text
    assert f"sparkfleet_vllm_startup_timestamp_seconds{{{labels}}} 5000.0" in text
    assert "# TYPE sparkfleet_vllm_startup_seconds gauge" in text and text.endswith("\n")
    # The first good start has no previous one: no such family at all.
    assert "previous" not in textfile_metrics(next_record(None, start(300)), "vllm-a.service", "a")
    assert textfile_path("vllm-a.service") == "/var/lib/prometheus/node-exporter/sparkfleet-vllm-a-startup.prom"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing: apt-get install prometheus")
def test_promtool_reads_the_metrics_without_a_complaint():
    record = next_record(json.dumps(next_record(None, start(300))), start(900, at=5000.0))
    done = subprocess.run(
        ["promtool", "check", "metrics"],
        input=textfile_metrics(record, "vllm-a.service", "a"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
