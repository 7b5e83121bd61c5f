"""The fabric's bandwidth gate: read a collective's benchmark output and judge a group of Sparks by it.

The output is NVIDIA's nccl-tests format (NVIDIA/nccl-tests src/util.cu), which the gate's own script
(roles/spark_fabric/files/allreduce_bench.py, run inside the pinned vLLM image) prints as well:

- one row per message size: `size count type redop root`, then `time algbw busbw #wrong` for the out-of-place run
  and again for the in-place one (the gate's script measures in place only: one group);
- the footer `# Avg bus bandwidth    : 142.652`, the mean bus bandwidth over every row and placement;
- under `mpirun --tag-output` every line starts with `[1,0]<stdout>:`.

Bus bandwidth (busbw) is the collective's data rate scaled to what each link carried (all-reduce: algbw * 2(n-1)/n;
all-gather: algbw * (n-1)/n), so runs of either collective compare with one threshold. NVIDIA's multi-Spark setup
script compares the average of a single 16 GiB size with 21.875 GB/s (175 Gb/s; 10 GB/s for a three-Spark ring):
the gate judges the largest size measured, the nearest to that run (a sweep's small sizes are latency-bound).
"""

from __future__ import annotations

import re

# NVIDIA/dgx-spark-playbooks, nvidia/multi-sparks-through-switch/assets/spark_cluster_setup/spark_cluster_setup.py:
# MIN_NCCL_TEST_BW = 21.875 # 175 Gbps
DEFAULT_MIN_BUSBW_GBS = 21.875
TAG = re.compile(r"^\[\d+,\d+\]<\w+>:")
AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+(?:[eE][-+]?\d+)?)")
COLLECTIVE = re.compile(r"^#\s*Collective test (?:starting|concluded):\s*(\S+)")
# Why a group falls short, most likely first (each with its source).
LIKELY_CAUSES = (
    "NCCL uses one half of the ConnectX-7 port: each half is its own PCIe Gen5 x4 device of about 100 Gb/s, and only "
    "both in NCCL_IB_HCA (spark_fabric_hcas) reach the port's 200 Gb/s (98 to 161 Gb/s measured; "
    "NVIDIA/dgx-spark-playbooks#102)",
    "the halves run at MTU 1500 or differ between the Sparks (jumbo frames gave about 5 %; a mismatch stalls)",
    "a development NCCL build: 3.04 GB/s until NCCL was rebuilt from its release tag v2.28.9-1, then 23.74 GB/s "
    "(NVIDIA/dgx-spark-playbooks#103); try the other spark_fabric_nccl_library",
    "other GPU work on a Spark of the group during the test",
)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _row(words: list[str]) -> dict | None:
    """One size's row: `size count type redop root` and one or two `time algbw busbw #wrong` groups."""
    if len(words) not in (9, 13) or not words[0].isdigit() or not words[1].isdigit():
        return None
    groups = [words[5 + 4 * index : 9 + 4 * index] for index in range((len(words) - 5) // 4)]
    busbws = [_number(group[2]) for group in groups]
    wrongs = [group[3] for group in groups]
    if None in busbws or not all(wrong.isdigit() or wrong == "N/A" for wrong in wrongs):
        return None
    return {
        "size": int(words[0]),
        "type": words[2],
        "busbw": busbws,
        "wrong": sum(int(wrong) for wrong in wrongs if wrong.isdigit()),
    }


def parse(text: str) -> dict:
    """What a run printed: {collective, rows: [{size, type, busbw: [per placement], wrong}], average_busbw (the
    footer's, else None), largest: {size, busbw} (the mean over placements of the largest size), wrong (rows'
    sum)}."""
    rows, average, collective = [], None, None
    for raw in text.splitlines():
        line = TAG.sub("", raw).strip()
        if line.startswith("#"):
            found = AVERAGE.match(line)
            if found:
                average = float(found.group(1))
            found = COLLECTIVE.match(line)
            if found:
                collective = found.group(1)
            continue
        row = _row(line.split())
        if row:
            rows.append(row)
    largest = None
    if rows:
        top = max(row["size"] for row in rows)
        values = [value for row in rows if row["size"] == top for value in row["busbw"]]
        largest = {"size": top, "busbw": round(sum(values) / len(values), 3)}
    return {
        "collective": collective,
        "rows": rows,
        "average_busbw": average,
        "largest": largest,
        "wrong": sum(row["wrong"] for row in rows),
    }


def judge(result: dict, min_busbw_gbs: float, group: str) -> dict:
    """{passed, busbw, message} for GROUP's run (parse's result) against the threshold in GB/s."""
    largest = result.get("largest")
    if not largest:
        return {
            "passed": False,
            "busbw": None,
            "message": f"group {group}: the bandwidth test printed no result row",
        }
    busbw, size = largest["busbw"], _size(largest["size"])
    if result["wrong"]:
        return {
            "passed": False,
            "busbw": busbw,
            "message": f"group {group}: the bandwidth test found {result['wrong']} wrong values: a Spark of the group "
            "computes or moves data wrongly; do not serve on it until a rerun is clean",
        }
    if busbw < min_busbw_gbs:
        causes = "; ".join(f"({index}) {cause}" for index, cause in enumerate(LIKELY_CAUSES, start=1))
        return {
            "passed": False,
            "busbw": busbw,
            "message": f"group {group}: bus bandwidth {busbw:g} GB/s at {size}, below the {min_busbw_gbs:g} GB/s the "
            f"group needs (spark_fabric_min_busbw_gbs); likely causes: {causes}",
        }
    return {
        "passed": True,
        "busbw": busbw,
        "message": f"group {group}: bus bandwidth {busbw:g} GB/s at {size} (at least {min_busbw_gbs:g} GB/s)",
    }


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def textfile_metrics(group: str, busbw: float | None, min_busbw_gbs: float, passed: bool, measured_at: float) -> str:
    """The group's last bandwidth test as node_exporter textfile metrics (Prometheus' text format)."""
    label = str(group).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines = [
        "# HELP sparkfleet_fabric_busbw_gbs Bus bandwidth of the group's last all-reduce test (GB/s, largest size).",
        "# TYPE sparkfleet_fabric_busbw_gbs gauge",
    ]
    if busbw is not None:
        lines.append(f'sparkfleet_fabric_busbw_gbs{{group="{label}"}} {float(busbw):g}')
    lines += [
        "# HELP sparkfleet_fabric_min_busbw_gbs The bus bandwidth the group needs (spark_fabric_min_busbw_gbs).",
        "# TYPE sparkfleet_fabric_min_busbw_gbs gauge",
        f'sparkfleet_fabric_min_busbw_gbs{{group="{label}"}} {float(min_busbw_gbs):g}',
        "# HELP sparkfleet_fabric_bandwidth_passed 1 when the group's last test reached the bandwidth it needs.",
        "# TYPE sparkfleet_fabric_bandwidth_passed gauge",
        f'sparkfleet_fabric_bandwidth_passed{{group="{label}"}} {1 if passed else 0}',
        "# HELP sparkfleet_fabric_bandwidth_timestamp_seconds When the group's bandwidth was last measured.",
        "# TYPE sparkfleet_fabric_bandwidth_timestamp_seconds gauge",
        f'sparkfleet_fabric_bandwidth_timestamp_seconds{{group="{label}"}} {float(measured_at):.0f}',
    ]
    return "\n".join(lines) + "\n"
