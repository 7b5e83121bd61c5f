#!/usr/bin/env python3
"""The GB10's own health as node_exporter textfile metrics: temperature, power, clocks, utilization, the clock-event
(throttle) reasons and the GPU memory each process holds on the unified pool, read with nvidia-smi (standard
library only; no listener of its own: node_exporter's textfile collector publishes the file).

    gpu_metrics.py --textfile /var/lib/prometheus/node-exporter/sparkfleet-gpu.prom --interval 15
    gpu_metrics.py --textfile FILE --once        # one reading, then exit (what the tests run)

Field names and units are nvidia-smi's (`nvidia-smi --help-query-gpu`, `--help-query-compute-apps`, driver 580):
values come as `--format=csv,noheader,nounits` prints them, and a value nvidia-smi cannot read on this GPU is
bracketed (`[N/A]`, `[Not Supported]`): its series is left out, not written as 0. On a GB10 the framebuffer
fields (memory.total/used) are `[N/A]` (unified memory; NVIDIA's DGX Spark known issues), while temperature,
power draw, SM clock, utilization and the per-process memory read. A field this driver does not know
(`Field "X" is not a valid field to query.`, exit 2) is dropped and the query asked again without it.

Each reading is written beside the file and renamed over it, so node_exporter never reads half a file; the file
ends with the time of the reading (sparkfleet_gpu_metrics_timestamp_seconds), which an alert watches for a reading
gone stale.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time

PREFIX = "sparkfleet_gpu"
# (nvidia-smi field, metric name, help, unit scale): each read per GPU, labelled gpu (index) and name.
GPU_FIELDS = (
    ("temperature.gpu", "temperature_celsius", "GPU core temperature (temperature.gpu).", 1.0),
    ("power.draw", "power_draw_watts", "Average power draw over one second (power.draw).", 1.0),
    ("enforced.power.limit", "power_limit_watts", "The power ceiling the driver enforces (enforced.power.limit).", 1.0),
    ("clocks.current.sm", "sm_clock_hertz", "Current SM clock (clocks.current.sm).", 1e6),
    ("clocks.max.sm", "sm_clock_max_hertz", "Maximum SM clock (clocks.max.sm).", 1e6),
    ("clocks.current.memory", "memory_clock_hertz", "Current memory clock (clocks.current.memory).", 1e6),
    ("utilization.gpu", "utilization_ratio", "Share of the last sample period a kernel ran (utilization.gpu).", 0.01),
)
# Read beside them: which GPU (labels; uuid ties a process to its GPU) and its performance state (P0 most to P12
# least).
LABEL_FIELDS = ("index", "name", "uuid")
PSTATE_FIELD = "pstate"
# The clock-event (throttle) reasons: "Active" or "Not Active" each (nvidia-smi --help-query-gpu,
# clocks_event_reasons.*; clocks_throttle_reasons.* before driver 535).
REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)
REASON_FIELD = "clocks_event_reasons.{}"
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
MIB = 1024 * 1024


class ReadError(Exception):
    """nvidia-smi could not be run or answered with an error: no reading this time."""


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ReadError(f"{argv[0]}: {error}") from None


def query(nvidia_smi: str, option: str, fields: list[str], timeout: float) -> tuple[list[str], list[list[str]]]:
    """(the fields this driver answered, one row of values per GPU or process): a field it does not know is
    dropped and the query asked again."""
    fields = list(fields)
    while fields:
        done = run([nvidia_smi, f"{option}={','.join(fields)}", "--format=csv,noheader,nounits"], timeout)
        unknown = INVALID_FIELD.search(done.stdout + done.stderr)
        if done.returncode != 0 and unknown and unknown.group(1) in fields:
            fields.remove(unknown.group(1))
            continue
        if done.returncode != 0:
            raise ReadError(
                f"{nvidia_smi} {option}: exit {done.returncode}: {(done.stdout + done.stderr).strip()[:200]}"
            )
        rows = [[value.strip() for value in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
        return fields, [row for row in rows if len(row) == len(fields)]
    return [], []


def number(text: str) -> float | None:
    """A value as nvidia-smi prints it with nounits; None for a bracketed one ([N/A], [Not Supported], ...)."""
    if not text or text.startswith("["):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def sample(value: float) -> str:
    """A sample value, exact to the byte for memory sizes (12 significant digits)."""
    return format(value, ".12g")


def label_value(text: str) -> str:
    """Prometheus' text format: a label value escapes backslash, double quote and newline."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def gpu_lines(fields: list[str], rows: list[list[str]]) -> list[str]:
    names = {field: (metric, help_text, scale) for field, metric, help_text, scale in GPU_FIELDS}
    series: dict[str, list[str]] = {}
    helps: dict[str, str] = {}
    for row in rows:
        values = dict(zip(fields, row, strict=True))
        labels = f'gpu="{label_value(values.get("index", "0"))}",name="{label_value(values.get("name", ""))}"'
        for field, (metric, help_text, scale) in names.items():
            value = number(values.get(field, ""))
            if value is not None:
                helps[metric] = help_text
                series.setdefault(metric, []).append(f"{PREFIX}_{metric}{{{labels}}} {sample(value * scale)}")
        pstate = values.get(PSTATE_FIELD, "")
        if re.fullmatch(r"P\d+", pstate):
            helps["performance_state"] = "Performance state, P0 (most) to P12 (least) (pstate)."
            series.setdefault("performance_state", []).append(f"{PREFIX}_performance_state{{{labels}}} {pstate[1:]}")
        for reason in REASONS:
            state = values.get(REASON_FIELD.format(reason), "")
            if state in ("Active", "Not Active"):
                helps["clock_event_reason"] = (
                    "1 while the reason holds the clocks down (clocks_event_reasons.*; all 0: as high as they go)."
                )
                series.setdefault("clock_event_reason", []).append(
                    f'{PREFIX}_clock_event_reason{{{labels},reason="{reason}"}} {1 if state == "Active" else 0}'
                )
    lines = []
    for metric, samples in series.items():
        lines += [f"# HELP {PREFIX}_{metric} {helps[metric]}", f"# TYPE {PREFIX}_{metric} gauge", *samples]
    return lines


def app_lines(fields: list[str], rows: list[list[str]], index_of: dict[str, str]) -> list[str]:
    """The GPU memory each process holds on each GPU (used_memory, MiB): on a GB10 the one view of who holds the
    shared pool. index_of maps a GPU's uuid to its index, the gpu label of every series."""
    if "used_memory" not in fields or "pid" not in fields:
        return []
    lines = [
        f"# HELP {PREFIX}_process_memory_bytes GPU memory a process holds on the pool (used_memory).",
        f"# TYPE {PREFIX}_process_memory_bytes gauge",
    ]
    for row in rows:
        values = dict(zip(fields, row, strict=True))
        used = number(values["used_memory"])
        if used is None:
            continue
        process = os.path.basename(values.get("process_name", ""))
        gpu = index_of.get(values.get("gpu_uuid", ""), values.get("gpu_uuid", ""))
        labels = f'gpu="{label_value(gpu)}",pid="{label_value(values["pid"])}",process="{label_value(process)}"'
        lines.append(f"{PREFIX}_process_memory_bytes{{{labels}}} {sample(used * MIB)}")
    return lines


def reading(nvidia_smi: str, timeout: float, known: dict[str, list[str]]) -> str:
    """One reading as Prometheus text (raises ReadError when nvidia-smi gives nothing). known holds the fields this
    driver answered, per query, so that the fields it does not know are dropped once, not at every reading."""
    wanted = [*LABEL_FIELDS, *(field for field, *_ in GPU_FIELDS), PSTATE_FIELD]
    wanted += [REASON_FIELD.format(reason) for reason in REASONS]
    fields, rows = query(nvidia_smi, "--query-gpu", known.get("gpu", wanted), timeout)
    if not rows:
        raise ReadError(f"{nvidia_smi} --query-gpu answered no GPU")
    known["gpu"] = fields
    lines = gpu_lines(fields, rows)
    index_of = {values["uuid"]: values["index"] for values in (dict(zip(fields, row, strict=True)) for row in rows)
                if "uuid" in values and "index" in values}  # fmt: skip
    # The GPU readings stand without the per-process view when it cannot be read.
    with contextlib.suppress(ReadError):
        app_fields, app_rows = query(nvidia_smi, "--query-compute-apps", known.get("apps", list(APP_FIELDS)), timeout)
        known["apps"] = app_fields
        lines += app_lines(app_fields, app_rows, index_of)
    lines += [
        f"# HELP {PREFIX}_metrics_timestamp_seconds When this reading was taken.",
        f"# TYPE {PREFIX}_metrics_timestamp_seconds gauge",
        f"{PREFIX}_metrics_timestamp_seconds {time.time():.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".sparkfleet-gpu.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        # Read by node_exporter (user prometheus): world-readable, like every textfile metric; no secret in it.
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--textfile", required=True, help="the .prom file node_exporter's textfile collector reads")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between readings")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to run")
    parser.add_argument("--once", action="store_true", help="one reading, then exit (1 when it failed)")
    args = parser.parse_args(argv)
    timeout = max(5.0, args.interval)
    known: dict[str, list[str]] = {}
    while True:
        started = time.monotonic()
        try:
            write_atomically(args.textfile, reading(args.nvidia_smi, timeout, known))
        except ReadError as error:
            # The file keeps its last reading; its timestamp ages, which the stale-metrics alert sees.
            print(f"sparkfleet_gpu_metrics: {error}", file=sys.stderr, flush=True)
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
