"""The fabric's bandwidth gate (module_utils/nccl_bandwidth.py): real nccl-tests outputs recorded on GB10 pairs
and elsewhere parse to their published figures, and the verdict against NVIDIA's 21.875 GB/s names the likely
causes; the gate's own script (roles/spark_fabric/files/allreduce_bench.py), run as two real torch.distributed
ranks on loopback, prints what the same parser reads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from nccl_bandwidth import DEFAULT_MIN_BUSBW_GBS, judge, parse, textfile_metrics

RECORDED = ROOT / "tests" / "fixtures" / "recorded" / "nccl-tests"
SCRIPT = ROOT / "roles" / "spark_fabric" / "files" / "allreduce_bench.py"
ENGINE_PYTHON = ROOT / ".cache" / "fixtures" / "vllm-engine" / "bin" / "python"


def recorded(name: str) -> dict:
    return parse((RECORDED / name).read_text(encoding="utf-8"))


def test_a_gb10_pairs_all_reduce_rows_are_read_column_by_column():
    result = recorded("gb10-pair-all-reduce-first-rows.txt")
    assert result["collective"] == "all_reduce_perf"
    assert [row["size"] for row in result["rows"]] == [8192, 16384, 32768, 65536]
    assert result["rows"][0]["busbw"] == [0.29, 0.29] and result["rows"][3]["busbw"] == [0.97, 1.01]
    assert result["largest"] == {"size": 65536, "busbw": 0.99} and result["wrong"] == 0
    assert result["average_busbw"] is None  # cut before its footer


def test_nvidias_16g_all_gather_at_mtu_1500_falls_short_of_nvidias_threshold():
    result = recorded("gb10-pair-all-gather-16g-mtu1500.txt")
    assert result["collective"] == "all_gather_perf"
    assert result["largest"] == {"size": 16 << 30, "busbw": 19.945}
    verdict = judge(result, DEFAULT_MIN_BUSBW_GBS, "pair_a")
    assert not verdict["passed"] and verdict["busbw"] == 19.945
    message = verdict["message"]
    assert message.startswith("group pair_a: bus bandwidth 19.945 GB/s at 16 GiB, below the 21.875 GB/s")
    assert "spark_fabric_min_busbw_gbs" in message and "NCCL_IB_HCA" in message and "MTU 1500" in message


def test_the_footers_average_is_read_with_its_trailing_space_and_under_mpiruns_tags():
    result = recorded("rccl-all-reduce-footer.txt")
    assert result["average_busbw"] == 142.652
    assert result["largest"] == {"size": 17179869184, "busbw": 361.075}
    assert judge(result, DEFAULT_MIN_BUSBW_GBS, "g")["passed"]
    assert recorded("mpirun-tagged-footer.txt")["average_busbw"] == 92.3405


def test_wrong_values_or_no_rows_never_pass():
    row = "    33554432       8388608     float     sum      -1   2000.0   16.78   33.55       3"
    result = parse(row)
    assert result["wrong"] == 3
    verdict = judge(result, DEFAULT_MIN_BUSBW_GBS, "g")
    assert not verdict["passed"] and "3 wrong values" in verdict["message"]
    nothing = judge(parse("NCCL WARN NET/IB : No device found.\n"), DEFAULT_MIN_BUSBW_GBS, "g")
    assert not nothing["passed"] and "no result row" in nothing["message"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


STANDIN_TORCH = ROOT / "tests" / "standins" / "vllm" / "torch-standin"
RUNS = {
    # The real torch (the engine fixture's), over gloo on the CPU: what the script asks of torch exists and works.
    "real-torch-gloo": ([str(ENGINE_PYTHON)], ["--backend", "gloo"], {}),
    # The stand-in image's stand-in torch, as the simulated pair runs it (backend nccl): the same output.
    "standin-torch": ([sys.executable], ["--backend", "nccl"], {"PYTHONPATH": str(STANDIN_TORCH)}),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_the_gates_script_run_by_two_ranks_prints_what_the_parser_reads(run):
    python, backend, extra_env = RUNS[run]
    if not Path(python[0]).exists():
        pytest.skip("the engine fixture (tests/run-all.sh setup) holds the real torch")
    port = str(_free_port())
    argv = [*python, str(SCRIPT), *backend, "--min-bytes", str(1 << 20)]
    argv += ["--max-bytes", str(4 << 20), "--iters", "3", "--warmup", "1", "--timeout-s", "120"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", GLOO_SOCKET_IFNAME="lo", **extra_env)
    ranks = [
        subprocess.Popen(
            argv, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    result = parse(outputs[0])
    assert result["collective"] == "all_reduce_perf"
    assert [row["size"] for row in result["rows"]] == [1 << 20, 2 << 20, 4 << 20]
    assert result["wrong"] == 0 and all(row["busbw"][0] > 0 for row in result["rows"])
    mean = sum(row["busbw"][0] for row in result["rows"]) / 3
    assert result["average_busbw"] == pytest.approx(mean, rel=0.01, abs=0.01)
    assert outputs[1].strip() == ""  # only rank 0 reports


def test_the_result_is_exported_as_metrics_promtool_reads():
    text = textfile_metrics('pair "a"', 23.74, 21.875, True, 1764000000.4)
    assert 'sparkfleet_fabric_busbw_gbs{group="pair \\"a\\""} 23.74' in text
    assert 'sparkfleet_fabric_bandwidth_passed{group="pair \\"a\\""} 1' in text
    assert 'sparkfleet_fabric_bandwidth_timestamp_seconds{group="pair \\"a\\""} 1764000000' in text
    # A test that printed no row: no bandwidth series, and not passed.
    failed = textfile_metrics("p", None, 21.875, False, 0)
    assert "sparkfleet_fabric_busbw_gbs{" not in failed and 'sparkfleet_fabric_bandwidth_passed{group="p"} 0' in failed
    if shutil.which("promtool"):
        for metrics in (text, failed):
            checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True)
            assert checked.returncode == 0, checked.stdout + checked.stderr
