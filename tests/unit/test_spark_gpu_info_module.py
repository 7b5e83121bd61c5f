"""The spark_gpu_info module, run in-process (tests/unit/conftest.py), with the stand-in nvidia-smi on the PATH."""

from __future__ import annotations

import pytest


def test_gb10_passes_and_reports_the_gpu_and_memory(run_module, nvidia_smi):
    nvidia_smi("gb10")
    result = run_module("spark_gpu_info", {})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    assert result["gpu_count"] == 1
    assert result["gpus"][0]["name"] == "NVIDIA GB10"
    assert result["gpus"][0]["compute_capability"] == "12.1"
    assert result["gpus"][0]["memory_total_mib"] is None
    assert result["nvidia_smi_path"].endswith("/bin/nvidia-smi")
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    assert result["memory"]["mem_total_bytes"] == total_kib * 1024


def test_check_mode_reports_the_same_and_no_change(run_module, nvidia_smi):
    nvidia_smi("gb10")
    first = run_module("spark_gpu_info", {}, check_mode=True)
    second = run_module("spark_gpu_info", {})
    assert first["changed"] is False and second["changed"] is False
    assert first["gpus"] == second["gpus"]


# Each misfit host: the message must name what was found and what was expected.
@pytest.mark.parametrize(
    ("profile", "found", "expected"),
    [
        (None, "nvidia-smi was not found", "expected an NVIDIA GPU with compute capability 12.1 (sm_121"),
        ("driver-not-loaded", "couldn't communicate with the NVIDIA driver", "NVIDIA GB10"),
        ("no-gpu", "No devices were found", "compute capability 12.1"),
        ("h200", "GPU 0 (NVIDIA H200) has compute capability 9.0", "expected compute capability 12.1 (sm_121"),
        ("gb10-old-driver", "runs NVIDIA driver 575.57.08", "expected 580.95.05 or newer"),
        ("driver-470", 'Field "compute_cap" is not a valid field', "compute capability 12.1"),
    ],
    ids=["no-nvidia-smi", "driver-not-loaded", "no-gpu", "wrong-gpu", "old-driver", "driver-470"],
)
def test_misfit_hosts_are_refused_with_found_and_expected(run_module, nvidia_smi, profile, found, expected):
    nvidia_smi(profile)
    result = run_module("spark_gpu_info", {})
    assert result["failed"] is True
    assert found in result["msg"]
    assert expected in result["msg"]


def test_options_change_what_is_expected(run_module, nvidia_smi):
    nvidia_smi("h200")
    result = run_module("spark_gpu_info", {"required_compute_capability": "9.0", "min_driver_version": "570.0"})
    assert not result.get("failed"), result.get("msg")
    assert result["gpus"][0]["memory_total_mib"] == 143771


def test_a_bad_min_driver_version_is_named(run_module, nvidia_smi):
    nvidia_smi("gb10")
    result = run_module("spark_gpu_info", {"min_driver_version": "latest"})
    assert result["failed"] is True
    assert "min_driver_version='latest' is not a driver version" in result["msg"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_the_old_name_fails_at_once_naming_the_new_one(run_module, check_mode):
    # A playbook written before the rename, with the old module's options: no nvidia-smi is run, the task fails.
    result = run_module("spark_gpu", {"min_driver_version": "580.0"}, check_mode=check_mode)
    assert result["failed"] is True
    assert result["msg"] == "spark_gpu is now spark_gpu_info: rename the task's module"
    assert result["changed"] is False
