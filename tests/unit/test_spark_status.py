"""The status view (module_utils/spark_status.py, library/spark_status): memory from /proc/meminfo, the GPU from the
collector's textfile (the clock-event reasons that hold, the reading's age), each model from its last good files;
the lines name what they read, and a Spark without the GPU metrics says why there are none."""

from __future__ import annotations

import json

from spark_status import gpu, line, meminfo, model

MEMINFO = "MemTotal:       127601400 kB\nMemFree:        1000 kB\nMemAvailable:   41943040 kB\n"
PROM = """# HELP sparkfleet_gpu_temperature_celsius x
sparkfleet_gpu_temperature_celsius{gpu="0",name="NVIDIA GB10"} 71
sparkfleet_gpu_sm_clock_hertz{gpu="0",name="NVIDIA GB10"} 650000000
sparkfleet_gpu_power_draw_watts{gpu="0",name="NVIDIA GB10"} 17.5
sparkfleet_gpu_clock_event_reason{gpu="0",name="NVIDIA GB10",reason="gpu_idle"} 1
sparkfleet_gpu_clock_event_reason{gpu="0",name="NVIDIA GB10",reason="hw_slowdown"} 1
sparkfleet_gpu_clock_event_reason{gpu="0",name="NVIDIA GB10",reason="sw_power_cap"} 0
sparkfleet_gpu_metrics_timestamp_seconds 1000
"""


def test_a_spark_with_two_models_and_a_slowed_gpu():
    memory = meminfo(MEMINFO)
    assert memory == {"MemTotal": 127601400 * 1024, "MemAvailable": 40 * 1024**3}
    found = gpu(PROM, now=1012)
    assert found == {
        "gpus": {"0": {"temperature_c": 71, "sm_clock_mhz": 650, "power_w": 17.5, "throttled_by": ["hw_slowdown"]}},
        "age_s": 12,  # gpu_idle is no throttling
    }
    startup = {"last": {"started_at": 1796390000, "phases_s": {"healthy": 612.5}}}
    nemotron = {"served": "nemotron-3-super", "port": 8000, "unit": "vllm-a.service", "gpu_memory_utilization": 0.5}
    small = {"served": "qwen3-0.6b", "port": 8001, "unit": "vllm-b.service", "gpu_memory_utilization": 0.25}
    models = [model(nemotron, startup, "active/running"), model(small, None, "failed/failed")]
    lines = line("spark-1", models, memory, found)
    # The failed unit holds no share of the pool.
    assert lines[0] == "spark-1: memory 40.0 of 121.7 GiB available, 60.8 GiB reserved by the plan (1 model running)"
    assert lines[1] == "  GPU 0: 71 C, SM clock 650 MHz, 17.5 W, throttled by hw_slowdown, read 12 s ago"
    assert lines[2].startswith("  nemotron-3-super on port 8000: active/running (vllm-a.service), 0.50 of the pool, ")
    assert lines[2].endswith("(healthy after 612.5 s)")
    assert lines[3] == "  qwen3-0.6b on port 8001: failed/failed (vllm-b.service), not running, not counted"


def test_no_metrics_file_says_why(run_module, tmp_path):
    (tmp_path / "m.last-good.json").write_text(json.dumps({"served": "m", "port": 8000, "unit": "vllm-m.service"}))
    done = run_module(
        "spark_status", {"host": "h", "config_dir": str(tmp_path), "gpu_metrics_file": str(tmp_path / "none.prom")}
    )
    assert not done.get("failed") and done["changed"] is False
    assert done["gpu"] == {} and done["models"][0]["served"] == "m"
    assert done["lines"][0].endswith("(0 models running)")
    assert done["lines"][1] == "  GPU: no metrics file (fleet_monitoring_gpu_metrics off, or no monitoring group)"


def test_an_unreadable_folder_of_last_good_files_fails_naming_become(run_module, tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    done = run_module("spark_status", {"host": "h", "config_dir": str(tmp_path)})
    assert done["failed"] and "run with become (-b)" in done["msg"]


def test_what_the_guard_kept_between_runs_is_shown_under_its_model(run_module, tmp_path):
    (tmp_path / "m.last-good.json").write_text(json.dumps({"served": "m", "port": 8000, "unit": "vllm-m.service"}))
    exits = {
        "unit": "vllm-m.service",
        "unplanned_exits_total": 3,
        "oom_kills_total": 1,
        "refused_starts_total": 0,
        "failures_total": 0,
        "records": [
            {
                "kind": "exit",
                "timestamp": 1796653682,
                "exit": "status 137",
                "oom_kill": True,
                "mem_available_gib": 2.5,
                "last_lines": ["torch.OutOfMemoryError: CUDA out of memory", ""],
            }
        ],
    }
    (tmp_path / "m.exits.json").write_text(json.dumps(exits))
    done = run_module("spark_status", {"host": "h", "config_dir": str(tmp_path)})
    assert done["models"][0]["guard"]["unplanned_exits"] == 3
    assert done["lines"][-1] == (
        "    between runs: 3 unplanned exits, 1 OOM kills; last unplanned exit 2026-12-07 14:28 UTC: status 137, "
        "OOM kill, 2.5 GiB available, last line: torch.OutOfMemoryError: CUDA out of memory"
    )


def test_an_exit_the_runtime_watch_caused_names_it():
    from spark_status import event_text

    event = {"kind": "exit", "timestamp": 0, "exit": "status 137", "mem_available_gib": 90.5, "last_lines": [],
             "watch": "2 failed probes in a row, the last: wedged"}  # fmt: skip
    assert event_text(event) == (
        "last unplanned exit 1970-01-01 00:00 UTC: status 137, killed by the runtime watch (2 failed probes in a "
        "row, the last: wedged), 90.5 GiB available"
    )


def test_a_refused_start_is_shown_with_its_reason():
    from spark_status import event_text

    event = {"kind": "refused", "timestamp": 0, "reason": "sparkfleet-vllm-guard: refused to start vllm-m.service: x"}
    assert event_text(event) == "start refused 1970-01-01 00:00 UTC: refused to start vllm-m.service: x"
