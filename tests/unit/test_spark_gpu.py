"""Parsing and judging nvidia-smi's answers, on outputs recorded from real machines."""

import pytest
from spark_gpu import (
    QUERY_FIELDS,
    GpuQueryError,
    describe_capability,
    explain_failure,
    find_problems,
    parse_meminfo,
    parse_query_output,
    query_argv,
    version_tuple,
)

GB10 = "0, NVIDIA GB10, 12.1, 580.95.05, GPU-5c3ad9f2-8e1b-4f7a-9d2c-1b6e0f4a7c31, [N/A]\n"
H200 = "0, NVIDIA H200, 9.0, 570.133.20, GPU-0b9b7e2e-3c55-7d1e-2a6f-8f1d4c2e9a10, 143771\n"
TWO_A100 = (
    "0, NVIDIA A100-SXM4-80GB, 8.0, 550.54.15, GPU-aaaaaaaa-0000-0000-0000-000000000000, 81920\n"
    "1, NVIDIA A100-SXM4-80GB, 8.0, 550.54.15, GPU-bbbbbbbb-0000-0000-0000-000000000000, 81920\n"
)

# A GB10 on a DGX Spark (MemTotal as published: 127,601,400 kB).
SPARK_MEMINFO = """MemTotal:       127601400 kB
MemFree:        120000000 kB
MemAvailable:   123518800 kB
Buffers:           12345 kB
SwapTotal:       16777212 kB
SwapFree:        16777212 kB
"""


def test_query_asks_for_every_reported_field_without_units():
    argv = query_argv("/usr/bin/nvidia-smi")
    assert argv == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,name,compute_cap,driver_version,uuid,memory.total",
        "--format=csv,noheader,nounits",
    ]
    assert len(QUERY_FIELDS) == 6


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            GB10,
            [
                {
                    "index": 0,
                    "name": "NVIDIA GB10",
                    "compute_capability": "12.1",
                    "driver_version": "580.95.05",
                    "uuid": "GPU-5c3ad9f2-8e1b-4f7a-9d2c-1b6e0f4a7c31",
                    "memory_total_mib": None,
                }
            ],
        ),
        (
            H200,
            [
                {
                    "index": 0,
                    "name": "NVIDIA H200",
                    "compute_capability": "9.0",
                    "driver_version": "570.133.20",
                    "uuid": "GPU-0b9b7e2e-3c55-7d1e-2a6f-8f1d4c2e9a10",
                    "memory_total_mib": 143771,
                }
            ],
        ),
        ("", []),
        ("\n\n", []),
    ],
    ids=["gb10", "h200", "empty", "blank-lines"],
)
def test_parse_query_output(output, expected):
    assert parse_query_output(output) == expected


def test_parse_two_gpus_keeps_their_order():
    gpus = parse_query_output(TWO_A100)
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert [gpu["uuid"][:12] for gpu in gpus] == ["GPU-aaaaaaaa", "GPU-bbbbbbbb"]


@pytest.mark.parametrize("value", ["[N/A]", "[Not Supported]", "N/A"])
def test_missing_memory_becomes_none(value):
    gpus = parse_query_output(f"0, NVIDIA GB10, 12.1, 580.95.05, GPU-x, {value}\n")
    assert gpus[0]["memory_total_mib"] is None


def test_a_line_with_the_wrong_number_of_fields_is_an_error():
    with pytest.raises(GpuQueryError, match="3 fields where 6 were asked for"):
        parse_query_output("0, NVIDIA GB10, 12.1\n")


@pytest.mark.parametrize(
    ("output", "capability", "min_driver", "expected"),
    [
        (GB10, "12.1", "580.95.05", []),
        (GB10, "12.1", "580.0", []),
        (
            H200,
            "12.1",
            "580.95.05",
            [
                "GPU 0 (NVIDIA H200) has compute capability 9.0; expected compute capability 12.1 "
                "(sm_121, the DGX Spark's NVIDIA GB10)",
                "GPU 0 (NVIDIA H200) runs NVIDIA driver 570.133.20; expected 580.95.05 or newer "
                "(update the driver, e.g. through DGX OS updates)",
            ],
        ),
        (
            GB10,
            "12.1",
            "580.126.09",
            [
                "GPU 0 (NVIDIA GB10) runs NVIDIA driver 580.95.05; expected 580.126.09 or newer "
                "(update the driver, e.g. through DGX OS updates)"
            ],
        ),
        (H200, "9.0", "570", []),
        (
            "",
            "12.1",
            "580.95.05",
            [
                "nvidia-smi listed no GPU; expected one with compute capability 12.1 "
                "(sm_121, the DGX Spark's NVIDIA GB10)"
            ],
        ),
    ],
    ids=["gb10-ok", "gb10-older-minimum", "h200-on-spark", "gb10-driver-too-old", "h200-when-asked", "no-gpu"],
)
def test_find_problems(output, capability, min_driver, expected):
    assert find_problems(parse_query_output(output), capability, min_driver) == expected


def test_driver_versions_compare_numerically_not_as_text():
    # As text "580.95.05" > "580.126.09"; as numbers it is older.
    assert version_tuple("580.95.05") < version_tuple("580.126.09")
    assert version_tuple("580") < version_tuple("580.0.1")
    with pytest.raises(ValueError):
        version_tuple("580.x")


@pytest.mark.parametrize(
    ("rc", "stdout", "meaning"),
    [
        (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "driver is not loaded"),
        (6, "No devices were found", "no NVIDIA GPU was found"),
        (2, 'Field "compute_cap" is not a valid field to query.', "older than 510 do not know compute_cap"),
        (255, "", "an unexpected error"),
    ],
)
def test_explain_failure_quotes_nvidia_smi(rc, stdout, meaning):
    explanation = explain_failure(rc, stdout, "")
    assert f"exited with code {rc}" in explanation
    assert meaning in explanation
    assert (stdout or "nothing") in explanation


def test_describe_capability():
    assert describe_capability("12.1") == "compute capability 12.1 (sm_121, the DGX Spark's NVIDIA GB10)"
    assert describe_capability("9.0") == "compute capability 9.0 (sm_90)"


def test_parse_meminfo_in_bytes():
    assert parse_meminfo(SPARK_MEMINFO) == {
        "mem_total_bytes": 127601400 * 1024,
        "mem_available_bytes": 123518800 * 1024,
        "swap_total_bytes": 16777212 * 1024,
        "swap_free_bytes": 16777212 * 1024,
    }


def test_parse_meminfo_names_what_is_missing():
    with pytest.raises(ValueError, match="mem_available_bytes"):
        parse_meminfo("MemTotal: 1 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
