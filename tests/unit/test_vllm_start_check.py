"""The start check (module_utils/vllm_start_check.py): right before vLLM units (re)start, is the memory their shares
need free on the host now? Its arithmetic step by step, and library/vllm_start_memory run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import vllm_start_check as start
from spark_gpu import parse_meminfo


def meminfo(total_kb: int, free_kb: int, available_kb: int) -> str:
    """A /proc/meminfo text in the kernel's format (the lines the check reads, and a few around them)."""
    return (
        f"MemTotal:       {total_kb} kB\nMemFree:        {free_kb} kB\nMemAvailable:   {available_kb} kB\n"
        f"Buffers:           52340 kB\nCached:         {max(0, available_kb - free_kb)} kB\n"
        "SwapCached:            0 kB\n"
        "SwapTotal:       16777212 kB\nSwapFree:        16777212 kB\n"
    )


# A Spark (MemTotal 127,601,400 kB) with a vLLM at 0.80 running: 19 GiB available, of which 10 GiB page cache.
SPARK_BUSY_MEMINFO = meminfo(127_601_400, 9 * 2**20, 19 * 2**20)
# The same Spark with nothing running.
SPARK_IDLE_MEMINFO = meminfo(127_601_400, 120_000_000, 123_518_800)


def memory_of(text: str) -> dict[str, int]:
    """What the module reads: MemTotal and MemAvailable (module_utils/spark_gpu.py's parse_meminfo), and MemFree."""
    return {**parse_meminfo(text), "mem_free_bytes": start.mem_free_bytes(text)}


def test_a_new_model_that_does_not_find_its_share_free_is_refused():
    units = [
        start.StartUnit("vllm_server_models[0]", "vllm-nemotron.service", 0.80, restart=False, running=True),
        start.StartUnit("vllm_server_models[1]", "vllm-qwen.service", 0.40, restart=True, running=False),
    ]
    check = start.start_check(memory_of(SPARK_BUSY_MEMINFO), units, margin_gib=3.0, use_available=True)
    assert not check.fits
    (reason,) = check.reasons
    for fragment in (
        "vllm-qwen.service (vllm_server_models[1], gpu_memory_utilization 0.40 = 48.7 GiB of 121.7 GiB)",
        "19.0 GiB is free now (MemAvailable)",
        "Nothing was restarted",
        "lower vllm_server_models[1].gpu_memory_utilization to 0.13 or less",  # (19 - 3) / 121.7
        "vllm_server_start_margin_gib",
    ):
        assert fragment in reason, (fragment, reason)


def test_a_restarted_unit_counts_the_share_it_frees_when_it_stops():
    # Nemotron restarts with a new configuration at its running 0.80: its own 97.3 GiB comes back first.
    restarted = start.StartUnit(
        "vllm_server_models[0]", "vllm-nemotron.service", 0.80, running=True, running_utilization=0.80
    )
    check = start.start_check(memory_of(SPARK_BUSY_MEMINFO), [restarted], margin_gib=3.0, use_available=True)
    assert check.fits, check.reasons
    assert check.freed_bytes == pytest.approx(0.80 * 127_601_400 * 1024)


@pytest.mark.parametrize(
    ("running_utilization", "fragment"),
    [
        (0.50, "vllm-nemotron.service frees 60.8 GiB when it stops"),  # it frees its running share, not the new one
        (None, "no last good record (counted as freeing nothing)"),
    ],
    ids=["raising-its-share", "unknown-running-share"],
)
def test_a_restarted_unit_frees_only_the_share_it_runs_with(running_utilization, fragment):
    restarted = start.StartUnit(
        "vllm_server_models[0]", "vllm-nemotron.service", 0.80, running=True, running_utilization=running_utilization
    )
    check = start.start_check(memory_of(SPARK_BUSY_MEMINFO), [restarted], margin_gib=3.0, use_available=True)
    assert not check.fits
    assert fragment in check.reasons[0]


def test_without_dropping_the_page_cache_only_mem_free_counts():
    # 12.2 GiB (0.10) + 3 GiB margin: within MemAvailable (19 GiB), not within MemFree (9 GiB), which is what vLLM
    # sees when the page cache stays (vllm#48140).
    unit = start.StartUnit("vllm_server_models[0]", "vllm-small.service", 0.10)
    memory = memory_of(SPARK_BUSY_MEMINFO)
    assert start.start_check(memory, [unit], margin_gib=3.0, use_available=True).fits
    check = start.start_check(memory, [unit], margin_gib=3.0, use_available=False)
    assert not check.fits and "MemFree" in check.reasons[0]


def test_each_restart_in_turn_must_fit_not_only_the_sum():
    # [0] grows from 0.30 to 0.50 and restarts first, while [1] (0.40 -> 0.20) still holds its share.
    units = [
        start.StartUnit("vllm_server_models[0]", "vllm-a.service", 0.50, running=True, running_utilization=0.30),
        start.StartUnit("vllm_server_models[1]", "vllm-b.service", 0.20, running=True, running_utilization=0.40),
    ]
    check = start.start_check(memory_of(SPARK_BUSY_MEMINFO), units, margin_gib=3.0, use_available=True)
    assert not check.fits
    assert check.reasons[0].startswith("not enough free memory to (re)start vllm-a.service (vllm_server_models[0]")
    assert len(check.steps) == 2


def test_units_that_do_not_restart_need_nothing():
    unit = start.StartUnit("vllm_server_models[0]", "vllm-nemotron.service", 0.80, restart=False, running=True)
    check = start.start_check(memory_of(SPARK_BUSY_MEMINFO), [unit], margin_gib=3.0, use_available=True)
    assert check.fits and check.steps == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"serve_args": ["m", "--gpu-memory-utilization", "0.8", "--max-model-len", "4096"]}', 0.8),
        ('{"serve_args": ["m", "--gpu-memory-utilization=0.45"]}', 0.45),
        ('{"serve_args": ["m"]}', None),
        ('{"serve_args": ["m", "--gpu-memory-utilization", "lots"]}', None),
        ("not json", None),
    ],
    ids=["flag-and-value", "flag=value", "absent", "not-a-number", "not-json"],
)
def test_running_utilization_is_read_from_the_last_good_serve_args(text, expected):
    assert start.running_utilization(text) == expected


@pytest.mark.parametrize(
    ("drop_caches", "check_mode", "restart", "expected"),
    [(True, False, True, True), (True, True, True, False), (False, False, True, False), (True, False, False, False)],
    ids=["drops", "check-mode", "not-asked", "nothing-restarts"],
)
def test_the_page_cache_is_dropped_only_for_real_restarts(drop_caches, check_mode, restart, expected):
    units = [start.StartUnit("vllm_server_models[0]", "vllm-a.service", 0.4, restart=restart)]
    assert start.should_drop_caches(drop_caches, check_mode, units) is expected


@pytest.fixture
def host_files(tmp_path: Path):
    """A recorded /proc/meminfo and a stand-in drop_caches knob, for the module to read and write."""

    def make(text: str) -> dict[str, str]:
        (tmp_path / "meminfo").write_text(text, encoding="ascii")
        (tmp_path / "drop_caches").write_text("", encoding="ascii")
        return {"meminfo_path": str(tmp_path / "meminfo"), "drop_caches_path": str(tmp_path / "drop_caches")}

    return make


def test_start_module_in_check_mode_does_not_drop_the_page_cache(run_module, host_files):
    paths = host_files(SPARK_IDLE_MEMINFO)
    args = {"units": [{"unit": "vllm-qwen.service", "gpu_memory_utilization": 0.4}], **paths}
    checked = run_module("vllm_start_memory", args, check_mode=True)
    assert not checked.get("failed"), checked.get("msg")
    assert checked["caches_dropped"] is False and checked["fits"] is True and checked["changed"] is False
    assert Path(paths["drop_caches_path"]).read_text(encoding="ascii") == ""
    applied = run_module("vllm_start_memory", args)
    assert applied["caches_dropped"] is True and applied["changed"] is False
    assert Path(paths["drop_caches_path"]).read_text(encoding="ascii") == "3\n"


def test_start_module_refuses_short_memory_and_counts_a_restarted_units_last_good_share(
    run_module, host_files, tmp_path
):
    paths = host_files(SPARK_BUSY_MEMINFO)
    last_good = tmp_path / "nemotron.last-good"
    last_good.with_suffix(".last-good.json").write_text(
        json.dumps({"serve_args": ["m", "--gpu-memory-utilization", "0.8"]}), encoding="utf-8"
    )
    nemotron = {"unit": "vllm-nemotron.service", "gpu_memory_utilization": 0.8, "last_good": str(last_good)}
    qwen = {"unit": "vllm-qwen.service", "gpu_memory_utilization": 0.4}
    running = ["vllm-nemotron.service"]
    refused = run_module(
        "vllm_start_memory",
        {"units": [{**nemotron, "restart": False}, qwen], "running": running, **paths},
        check_mode=True,
    )
    assert refused["failed"] is True and refused["fits"] is False
    assert "vllm-qwen.service (vllm_server_models[1]" in refused["msg"]
    assert "vllm_server_models[1].gpu_memory_utilization" in refused["msg"]
    accepted = run_module("vllm_start_memory", {"units": [nemotron], "running": running, **paths}, check_mode=True)
    assert not accepted.get("failed"), accepted.get("msg")
    assert accepted["freed_gib"] == pytest.approx(0.8 * 121.69, abs=0.05)
