"""The GPU metrics collector (roles/fleet_monitoring/files/gpu_metrics.py) against the stand-in
nvidia-smi replaying real recordings: an H200's full row (every series, the clock-event reasons as labelled 0/1) and
a GB10's (temperature, power and utilization as recorded, [N/A] fields left out, fields the recording lacks dropped
and the query asked again, the memory each process holds on the unified pool). The file is replaced whole, and a
reading that fails keeps the last one and says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, STANDIN_NVIDIA_SMI

COLLECTOR = ROOT / "roles" / "fleet_monitoring" / "files" / "gpu_metrics.py"


def collect(tmp_path: Path, profile: str, nvidia_smi: Path = STANDIN_NVIDIA_SMI) -> tuple[int, str, str]:
    textfile = tmp_path / "sparkfleet-gpu.prom"
    env = {**os.environ, "NVIDIA_SMI_STANDIN_PROFILE": profile}
    argv = [sys.executable, str(COLLECTOR), "--textfile", str(textfile), "--once", "--nvidia-smi", str(nvidia_smi)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return done.returncode, (textfile.read_text() if textfile.exists() else ""), done.stderr


def samples(text: str) -> dict[str, float]:
    return {
        match[1]: float(match[2])
        for match in re.finditer(r"^(sparkfleet_gpu_\w+(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE)
    }


def test_an_h200_recording_gives_every_series(tmp_path):
    rc, text, _ = collect(tmp_path, "h200")
    assert rc == 0
    found = samples(text)
    labels = '{gpu="0",name="NVIDIA H200"}'
    assert found[f"sparkfleet_gpu_temperature_celsius{labels}"] == 28
    assert found[f"sparkfleet_gpu_power_draw_watts{labels}"] == 77.71
    assert found[f"sparkfleet_gpu_power_limit_watts{labels}"] == 700
    assert found[f"sparkfleet_gpu_sm_clock_hertz{labels}"] == 345e6
    assert found[f"sparkfleet_gpu_sm_clock_max_hertz{labels}"] == 1980e6
    assert found[f"sparkfleet_gpu_memory_clock_hertz{labels}"] == 3201e6
    assert found[f"sparkfleet_gpu_utilization_ratio{labels}"] == 0
    assert found[f"sparkfleet_gpu_performance_state{labels}"] == 0
    reasons = {key: value for key, value in found.items() if key.startswith("sparkfleet_gpu_clock_event_reason{")}
    assert (
        len(reasons) == 8 and reasons['sparkfleet_gpu_clock_event_reason{gpu="0",name="NVIDIA H200",reason="gpu_idle"}']
    )
    assert sum(reasons.values()) == 1
    assert "# TYPE sparkfleet_gpu_clock_event_reason gauge" in text


def test_a_gb10_recording_leaves_out_what_it_cannot_read(tmp_path):
    rc, text, _ = collect(tmp_path, "gb10")
    assert rc == 0
    found = samples(text)
    labels = '{gpu="0",name="NVIDIA GB10"}'
    assert found[f"sparkfleet_gpu_temperature_celsius{labels}"] == 35
    assert found[f"sparkfleet_gpu_power_draw_watts{labels}"] == 11.17
    # [N/A] on a GB10 (no power cap): no series rather than a 0. The clock fields no recording has: dropped.
    assert not any(key.startswith(("sparkfleet_gpu_power_limit", "sparkfleet_gpu_sm_clock")) for key in found)
    # Who holds the unified pool: 19135 MiB, as recorded.
    assert found['sparkfleet_gpu_process_memory_bytes{gpu="0",pid="114687",process="python"}'] == 19135 * 2**20
    assert found["sparkfleet_gpu_metrics_timestamp_seconds"] > 0


def test_a_failed_reading_keeps_the_last_file_and_says_why(tmp_path):
    assert collect(tmp_path, "gb10")[0] == 0
    before = (tmp_path / "sparkfleet-gpu.prom").read_text()
    rc, after, stderr = collect(tmp_path, "driver-not-loaded")
    assert rc == 1 and after == before
    assert stderr.startswith("sparkfleet_gpu_metrics: ") and "exit 9" in stderr
    assert [path.name for path in tmp_path.iterdir()] == ["sparkfleet-gpu.prom"]  # no temporary file left


def test_the_file_is_world_readable_for_node_exporter(tmp_path):
    collect(tmp_path, "gb10")
    assert (tmp_path / "sparkfleet-gpu.prom").stat().st_mode & 0o777 == 0o644


def test_the_role_writes_where_node_exporter_reads_like_the_startup_times():
    """One folder for node_exporter's textfile metrics: the role's (the GPU metrics) and module_utils' (the vLLM
    startup times) must name the same."""
    import yaml
    from startup_times import TEXTFILE_DIR

    internal = yaml.safe_load((ROOT / "roles" / "fleet_monitoring" / "vars" / "main.yml").read_text())
    assert internal["__fleet_monitoring_textfile_dir"] == TEXTFILE_DIR
