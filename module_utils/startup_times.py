"""How long a vLLM unit took to start, phase by phase, and how that is kept and shown.

Every start of a unit is timed from the moment systemd began it (the unit left "inactive"):

- container: Docker started the container (docker inspect's State.StartedAt);
- weights_loaded: vLLM logged "Model loading took X GiB memory and Y seconds" (Y is the weight-load time), or, from
  engines whose model runner does not say it (the CPU engine's), the loader's "Loading weights took Y seconds";
- port_open: vLLM logged "Starting vLLM server on ...", right before its listener accepts connections (vLLM binds
  the port early, while the engine loads, but accepts nothing until then);
- healthy: the health gate saw /health answer 200 (probed every vllm_server_health_interval_s seconds);
- first_token: the first token of the first streamed request (the warm-up) came back; its time to first token is
  the startup TTFT (kernels compile on the first request).

The log lines are vLLM 0.33.0's (vllm/v1/worker/gpu_model_runner.py, model_executor/model_loader/default_loader.py,
entrypoints/launchers/api_server/entry.py).
library/vllm_startup_times.py measures a start; library/vllm_startup_record.py keeps the last good start and the
one before beside the unit's last good configuration, and writes them as node_exporter textfile metrics, which the
fleet_monitoring role's alert VllmStartSlower compares.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

PHASES = ("container", "weights_loaded", "port_open", "healthy", "first_token")
# The model runner's line first (weights and model together), else the loader's (weights alone).
WEIGHTS_LOADED = (
    re.compile(r"Model loading took [0-9.]+ GiB memory and (?P<seconds>[0-9.]+) seconds"),
    re.compile(r"Loading weights took (?P<seconds>[0-9.]+) seconds"),
)
PORT_OPEN = re.compile(r"Starting vLLM server on \S+")

# node_exporter's textfile collector reads *.prom files from this folder: the default of Debian's and Ubuntu's
# prometheus-node-exporter package (DGX OS is Ubuntu), which the fleet_monitoring role installs and leaves as is.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
METRIC_PREFIX = "sparkfleet_vllm_startup"


def docker_time(text: str) -> float | None:
    """Seconds since the epoch of Docker's RFC 3339 time with nanoseconds ("2026-12-04T02:11:18.123456789Z");
    None for Docker's zero time or anything else."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not found or found.group(1).startswith("0001-"):
        return None
    zone = "+00:00" if found.group(3) == "Z" else found.group(3)
    whole = datetime.fromisoformat(found.group(1) + zone).timestamp()
    return whole + float("0." + (found.group(2) or "0"))


def journal_entries(text: str) -> list[tuple[float, str]]:
    """(seconds since the epoch, message) of each entry of `journalctl -o json` output."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald gives a message that is not UTF-8 as a list of bytes
            message = bytes(message).decode("utf-8", "replace")
        if isinstance(message, str) and entry.get("__REALTIME_TIMESTAMP"):
            entries.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, message))
    return entries


def log_phases(entries: list[tuple[float, str]]) -> dict[str, float]:
    """The times (epoch seconds) of the phases vLLM's log tells, and the weight-load time it reports: the first
    line of each kind (of the weight lines, the first kind of WEIGHTS_LOADED that is there)."""
    found: dict[str, float] = {}
    loads: list[tuple[float, float] | None] = [None] * len(WEIGHTS_LOADED)
    for at, message in entries:
        for kind, pattern in enumerate(WEIGHTS_LOADED):
            loaded = pattern.search(message)
            if loaded and loads[kind] is None:
                loads[kind] = (at, float(loaded.group("seconds")))
        if PORT_OPEN.search(message) and "port_open" not in found:
            found["port_open"] = at
    load = next((seen for seen in loads if seen), None)
    if load:
        found["weights_loaded"], found["weight_load_s"] = load
    return found


def startup_times(started: float, moments: dict[str, float | None], weight_load_s: float | None,
                  ttft_s: float | None) -> dict:  # fmt: skip
    """A start's record: when it began, each phase as seconds since then (null when not seen), the weight-load
    time and the startup TTFT."""
    phases = {
        phase: (round(moments[phase] - started, 3) if moments.get(phase) is not None else None) for phase in PHASES
    }
    return {
        "started_at": round(started, 3),
        "phases_s": phases,
        "weight_load_s": None if weight_load_s is None else round(weight_load_s, 3),
        "startup_ttft_s": None if ttft_s is None else round(ttft_s, 3),
    }


def next_record(old_text: str | None, last: dict) -> dict:
    """The record kept beside the unit's last good files: this start as `last`, the last one before it as
    `previous` (none at a unit's first good start, or when the old record cannot be read)."""
    previous = None
    if old_text:
        try:
            previous = json.loads(old_text).get("last")
        except (ValueError, AttributeError):
            previous = None
    return {"last": last, "previous": previous}


def textfile_path(unit: str) -> str:
    """The unit's metrics file in node_exporter's textfile folder."""
    return f"{TEXTFILE_DIR}/sparkfleet-{unit.removesuffix('.service')}-startup.prom"


def _labels(unit: str, served: str, **more: str) -> str:
    pairs = {"unit": unit, "served_model_name": served, **more}
    # Prometheus' text format: a label value escapes backslash, double quote and newline.
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in pairs.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped.items()) + "}"


def textfile_metrics(record: dict, unit: str, served: str) -> str:
    """The record as node_exporter textfile metrics (Prometheus' text format): the last good start's phases, the
    previous one's, the weight-load time, the startup TTFT and when the start began."""
    families = [
        (f"{METRIC_PREFIX}_seconds", "Seconds from the unit's start to each phase of its last good start.", "last"),
        (f"{METRIC_PREFIX}_previous_seconds", "The same for the good start before it.", "previous"),
    ]
    lines = []
    for name, help_text, which in families:
        start = record.get(which)
        if not start:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for phase in PHASES:
            value = start["phases_s"].get(phase)
            if value is not None:
                lines.append(f"{name}{_labels(unit, served, phase=phase)} {value}")
    last = record["last"]
    singles = [
        ("weight_load_seconds", "Seconds vLLM reported loading the weights at the last good start.", "weight_load_s"),
        ("ttft_seconds", "Time to first token of the first request after the last good start.", "startup_ttft_s"),
        ("timestamp_seconds", "When the last good start began, in seconds since the epoch.", "started_at"),
    ]  # fmt: skip
    for suffix, help_text, key in singles:
        if last.get(key) is not None:
            name = f"{METRIC_PREFIX}_{suffix}"
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} gauge",
                f"{name}{_labels(unit, served)} {last[key]}",
            ]
    return "\n".join(lines) + "\n"


def summary(last: dict) -> str:
    """One line for the run summary."""
    phases = last["phases_s"]
    shown = [f"{phase.replace('_', ' ')} {phases[phase]:g} s" for phase in PHASES if phases.get(phase) is not None]
    extra = []
    if last.get("weight_load_s") is not None:
        extra.append(f"weights loaded in {last['weight_load_s']:g} s")
    if last.get("startup_ttft_s") is not None:
        extra.append(f"startup TTFT {last['startup_ttft_s']:g} s")
    return ", ".join(shown) + (f" ({', '.join(extra)})" if extra else "")
