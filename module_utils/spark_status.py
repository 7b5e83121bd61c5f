"""A Spark at a glance (status.yml, library/spark_status): its models and their state, the unified memory free and
what the plan reserves, the GPU's temperature, clock and throttling, each model's last start. Everything is read
from what the roles leave on the Spark; nothing is changed or asked of a model.

- The models: each vLLM unit's last good configuration (<config_dir>/<name>.last-good.json, written by the health
  gate: served name, port, unit, its gpu_memory_utilization), its last good start (<name>.last-good.startup.json),
  and what the guard kept between runs (<name>.exits.json: unplanned exits, refused starts, failures for good; with
  systemd's restart count).
- The memory: /proc/meminfo's MemTotal and MemAvailable; reserved is the sum of the models' shares of MemTotal.
- The GPU: the GPU metrics collector's textfile (fleet_monitoring_gpu_metrics), read as Prometheus text.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

GIB = 1024**3
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def meminfo(text: str) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (/proc/meminfo gives kB)."""
    found = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable") and rest.split():
            found[key] = int(rest.split()[0]) * 1024
    return found


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample of a Prometheus text file."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            try:
                value = float(match["value"])
            except ValueError:
                continue
            found.append((match["name"], dict(LABEL.findall(match["labels"] or "")), value))
    return found


def gpu(text: str | None, now: float | None = None) -> dict:
    """What the GPU metrics file says, per GPU index: temperature (C), SM clock (MHz), power (W), the clock-event
    reasons that hold; and the reading's age (s). {} without the file."""
    if text is None:
        return {}
    found: dict = {"gpus": {}}
    for name, labels, value in samples(text):
        reading = found["gpus"].setdefault(labels.get("gpu", "0"), {"throttled_by": []}) if "gpu" in labels else None
        if name == "sparkfleet_gpu_temperature_celsius":
            reading["temperature_c"] = value
        elif name == "sparkfleet_gpu_sm_clock_hertz":
            reading["sm_clock_mhz"] = round(value / 1e6)
        elif name == "sparkfleet_gpu_power_draw_watts":
            reading["power_w"] = value
        elif name == "sparkfleet_gpu_clock_event_reason" and value == 1 and labels.get("reason") != "gpu_idle":
            reading["throttled_by"].append(labels.get("reason", "?"))
        elif name == "sparkfleet_gpu_metrics_timestamp_seconds":
            found["age_s"] = round((now if now is not None else time.time()) - value)
    found["gpus"] = {
        index: reading for index, reading in found["gpus"].items() if len(reading) > 1 or reading["throttled_by"]
    }
    return found


def running(entry: Mapping) -> bool:
    """Whether a model's unit runs (or is starting): only those hold their share of the pool."""
    return str(entry.get("state", "")).startswith(("active", "activating", "reloading"))


def guard_events(exits: Mapping | None, restarts: int) -> dict:
    """What the guard kept of a unit between runs (module_utils/vllm_guard.py: its exits file): the restarts systemd
    made since its last start by hand, the counts, and the newest record."""
    exits = exits or {}
    records = exits.get("records") or []
    return {
        "restarts": restarts,
        "unplanned_exits": int(exits.get("unplanned_exits_total") or 0),
        "oom_kills": int(exits.get("oom_kills_total") or 0),
        "refused_starts": int(exits.get("refused_starts_total") or 0),
        "failures": int(exits.get("failures_total") or 0),
        "watch_restarts": int(exits.get("watch_restarts_total") or 0),
        "last_event": records[-1] if records else None,
    }


def event_text(event: Mapping) -> str:
    """The newest record of a unit, as a person reads it."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(event.get("timestamp", 0)))
    if event.get("kind") == "exit":
        parts = [event.get("exit", "?")]
        if event.get("watch"):
            parts.append(f"killed by the runtime watch ({str(event['watch'])[:200]})")
        if event.get("oom_kill"):
            parts.append("OOM kill")
        parts.append(f"{event.get('mem_available_gib', 0):g} GiB available")
        last = [text for text in event.get("last_lines") or [] if text.strip()]
        if last:
            parts.append(f"last line: {last[-1].strip()[:160]}")
        return f"last unplanned exit {when}: " + ", ".join(parts)
    if event.get("kind") == "refused":
        return f"start refused {when}: " + str(event.get("reason", "")).removeprefix("sparkfleet-vllm-guard: ")[:240]
    return f"{when}: " + str(event.get("reason", "failed"))


def model(last_good: Mapping, startup: Mapping | None, state: str, events: Mapping | None = None) -> dict:
    """One model: served name, port, unit, its state and share, its last good start, the guard's records."""
    last = (startup or {}).get("last") or {}
    return {
        "guard": dict(events or guard_events(None, 0)),
        "served": last_good.get("served", "?"),
        "port": last_good.get("port"),
        "unit": last_good.get("unit", "?"),
        "state": state,
        "gpu_memory_utilization": last_good.get("gpu_memory_utilization") or 0,
        "started_at": last.get("started_at"),
        "healthy_after_s": (last.get("phases_s") or {}).get("healthy"),
    }


def line(host: str, models: list[dict], memory: Mapping[str, int], gpu_found: Mapping) -> list[str]:
    """The status of one Spark as a few lines a person reads."""
    total, available = memory.get("MemTotal", 0), memory.get("MemAvailable", 0)
    serving = [entry for entry in models if running(entry)]
    reserved = sum(entry["gpu_memory_utilization"] for entry in serving) * total
    lines = [
        f"{host}: memory {available / GIB:.1f} of {total / GIB:.1f} GiB available, {reserved / GIB:.1f} GiB "
        f"reserved by the plan ({len(serving)} model{'s' if len(serving) != 1 else ''} running)"
    ]
    for index, reading in sorted((gpu_found or {}).get("gpus", {}).items()):
        parts = []
        if "temperature_c" in reading:
            parts.append(f"{reading['temperature_c']:g} C")
        if "sm_clock_mhz" in reading:
            parts.append(f"SM clock {reading['sm_clock_mhz']} MHz")
        if "power_w" in reading:
            parts.append(f"{reading['power_w']:g} W")
        parts.append(
            "throttled by " + ", ".join(reading["throttled_by"]) if reading["throttled_by"] else "not throttled"
        )
        if "age_s" in gpu_found:
            parts.append(f"read {gpu_found['age_s']} s ago")
        lines.append(f"  GPU {index}: " + ", ".join(parts))
    if not (gpu_found or {}).get("gpus"):
        lines.append("  GPU: no metrics file (fleet_monitoring_gpu_metrics off, or no monitoring group)")
    for entry in models:
        start = (
            f", last good start {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(entry['started_at']))} "
            f"(healthy after {entry['healthy_after_s']:g} s)"
            if entry["started_at"] and entry["healthy_after_s"] is not None
            else ""
        )
        share = f"{entry['gpu_memory_utilization']:.2f} of the pool" if running(entry) else "not running, not counted"
        lines.append(f"  {entry['served']} on port {entry['port']}: {entry['state']} ({entry['unit']}), {share}{start}")
        events = entry.get("guard") or {}
        counts = [
            f"{events.get(key, 0)} {what}"
            for key, what in (
                ("restarts", "restarts since its last start by hand"),
                ("unplanned_exits", "unplanned exits"),
                ("oom_kills", "OOM kills"),
                ("watch_restarts", "restarts by the runtime watch"),
                ("refused_starts", "refused starts"),
                ("failures", "failures for good"),
            )
            if events.get(key)
        ]
        if counts:
            newest = f"; {event_text(events['last_event'])}" if events.get("last_event") else ""
            lines.append(f"    between runs: {', '.join(counts)}{newest}")
    return lines
