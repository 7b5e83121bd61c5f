"""Plain functions behind the vllm_start_memory module: right before vLLM units (re)start, is the memory their
shares need free on the host now?

vLLM refuses to start unless the free memory at start is at least ceil(gpu_memory_utilization x total)
(v1/worker/utils.py request_memory). On an integrated GPU vLLM 0.33 reads "free" as psutil's available memory,
MemAvailable, and names the DGX Spark (utils/mem_utils.py MemorySnapshot.measure); earlier releases read
cudaMemGetInfo, close to MemFree (vllm#48140). This check is stricter than 0.33 when the page cache is not dropped:
it then counts MemFree, because MemAvailable includes page cache the kernel must first reclaim, and reclaiming it
under the weight load's pressure is where a Spark freezes (spark-facts.md). The units restart one after another in
the order of vllm_server_models, and each one's start check can run before the next one has stopped, so every
step must fit on its own:

  free + (what the units restarted so far free when they stop) >= (their shares) + margin

free is MemAvailable after dropping the page cache when the unit drops it too (vllm_server_drop_caches; in check
mode MemAvailable estimates what that drop frees), else MemFree. A running unit frees the share of the
configuration it runs: that of its last good configuration (the role's <unit>.last-good.json, written when that
configuration passed the health gate), never the share of the new one, which may be larger; a running unit with
no last good configuration is counted as freeing nothing. What all of them free is at most what is in use now.

The shares themselves come from the memory plan (module_utils/memory_plan.py, in preflight); this file only
compares them with the memory of the moment. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.memory_units import GIB, gib_text, hundredths
from ansible.module_utils.spark_gpu import parse_meminfo

UTILIZATION_FLAG = "--gpu-memory-utilization"


@dataclass(frozen=True)
class StartUnit:
    """One queued unit: its label (e.g. vllm_server_models[1]), its systemd unit, the share its new configuration
    takes, whether it is about to (re)start, whether it runs now and the share of the configuration it runs."""

    name: str
    unit: str
    gpu_memory_utilization: float
    restart: bool = True
    running: bool = False
    running_utilization: float | None = None


@dataclass(frozen=True)
class StartCheck:
    """The memory figures of the check, in bytes, and why the restarts must not happen (empty when they may)."""

    memory_total_bytes: int
    free_bytes: int
    free_source: str
    freed_bytes: float
    needed_bytes: float
    margin_bytes: float
    steps: tuple[dict[str, Any], ...]
    reasons: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.reasons


def mem_free_bytes(meminfo_text: str) -> int:
    """MemFree of a /proc/meminfo text, in bytes (the kernel prints kB = KiB). Raises ValueError when absent."""
    for line in meminfo_text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemFree" and rest.split():
            return int(rest.split()[0]) * 1024
    raise ValueError("/proc/meminfo lacks MemFree")


def memory_figures(meminfo_text: str) -> dict[str, int]:
    """What start_check reads of /proc/meminfo: the planner's figures (MemTotal, MemAvailable, swap) and MemFree."""
    return {**parse_meminfo(meminfo_text), "mem_free_bytes": mem_free_bytes(meminfo_text)}


def utilization_of_serve_args(serve_args: object) -> float | None:
    """The --gpu-memory-utilization of a `vllm serve` argument list; None when it is not there or not a number."""
    if not isinstance(serve_args, list):
        return None
    for position, arg in enumerate(serve_args):
        value = None
        if arg == UTILIZATION_FLAG and position + 1 < len(serve_args):
            value = serve_args[position + 1]
        elif isinstance(arg, str) and arg.startswith(UTILIZATION_FLAG + "="):
            value = arg.partition("=")[2]
        if value is not None:
            try:
                number = float(value)
            except (TypeError, ValueError):
                return None
            return number if 0 < number <= 1 else None
    return None


def running_utilization(last_good_json: str) -> float | None:
    """The gpu_memory_utilization of a last good configuration (the JSON the role keeps: serve_args, ...)."""
    try:
        configuration = json.loads(last_good_json)
    except ValueError:
        return None
    if not isinstance(configuration, Mapping):
        return None
    return utilization_of_serve_args(configuration.get("serve_args"))


def should_drop_caches(drop_caches: bool, check_mode: bool, units: list[StartUnit]) -> bool:
    """Drop the page cache only when asked, for real (not in check mode), and when a unit is about to start."""
    return drop_caches and not check_mode and any(unit.restart for unit in units)


def start_check(
    memory: Mapping[str, int],
    units: list[StartUnit],
    *,
    margin_gib: float,
    use_available: bool,
) -> StartCheck:
    """Whether the units about to (re)start find the memory their vLLMs need, step by step in their order.
    `memory` holds mem_total_bytes, mem_available_bytes and mem_free_bytes; `use_available` says that the page
    cache is (or will be) dropped before each start, so MemAvailable is what vLLM finds free, else MemFree."""
    total = memory["mem_total_bytes"]
    free = memory["mem_available_bytes"] if use_available else memory["mem_free_bytes"]
    free_source = (
        "MemAvailable"
        if use_available
        else "MemFree (the page cache is not dropped; stricter than vLLM's MemAvailable)"
    )
    in_use = max(0, total - free)
    margin = margin_gib * GIB
    freed = needed = 0.0
    steps = []
    exact: list[tuple[float, float]] = []  # (share, frees) of each step, in bytes
    reasons: list[str] = []
    restarting = [unit for unit in units if unit.restart]
    for unit in restarting:
        frees = 0.0
        if unit.running and unit.running_utilization is not None:
            frees = min(unit.running_utilization * total, in_use - freed)
        share = unit.gpu_memory_utilization * total
        exact.append((share, frees))
        freed += frees
        needed += share
        step = {
            "name": unit.name,
            "unit": unit.unit,
            "gpu_memory_utilization": unit.gpu_memory_utilization,
            "share_gib": round(share / GIB, 2),
            "running": unit.running,
            "frees_gib": round(frees / GIB, 2),
        }
        steps.append(step)
        if not reasons and free + freed < needed + margin:
            reasons.append(_start_reason(total, restarting, exact, free, free_source, freed, needed, margin))
    return StartCheck(
        memory_total_bytes=total,
        free_bytes=free,
        free_source=free_source,
        freed_bytes=freed,
        needed_bytes=needed,
        margin_bytes=margin,
        steps=tuple(steps),
        reasons=tuple(reasons),
    )


def _start_reason(
    total: int,
    restarting: list[StartUnit],
    exact: list[tuple[float, float]],
    free: float,
    free_source: str,
    freed: float,
    needed: float,
    margin: float,
) -> str:
    """Why the last of the steps in `exact` does not fit, and what to lower."""
    unit = restarting[len(exact) - 1]
    share = exact[-1][0]
    found = (
        f"not enough free memory to (re)start {unit.unit} ({unit.name}, gpu_memory_utilization "
        f"{unit.gpu_memory_utilization:.2f} = {gib_text(share)} of {gib_text(total)}): {gib_text(free)} is free now "
        f"({free_source})"
    )
    steps = list(zip(restarting, exact, strict=False))
    frees = [f"{u.unit} frees {gib_text(gives)} when it stops" for u, (_, gives) in steps if gives > 0]
    if frees:
        found += ", " + ", ".join(frees)
    unknown = [u.unit for u, _ in steps if u.running and u.running_utilization is None]
    if unknown:
        found += f", {', '.join(unknown)} runs a configuration with no last good record (counted as freeing nothing)"
    before = [f"{u.unit} takes {gib_text(takes)} first" for u, (takes, _) in steps[:-1]]
    if before:
        found += ", " + ", ".join(before)
    found += f"; it needs {gib_text(share)} plus the margin {gib_text(margin)} (vllm_server_start_margin_gib)"
    why = (
        "vLLM refuses to start with less free memory than gpu_memory_utilization x total (vllm#48140), and a Spark "
        "whose memory runs out can freeze. Nothing was restarted: the running units keep their previous configuration "
        "(the new unit files are written and would apply at their next restart or at boot)"
    )
    room = free + freed - (needed - share) - margin
    fix = hundredths(max(0.0, room) / total, up=False)
    fixes = []
    if fix > 0:
        fixes.append(f"lower {unit.name}.gpu_memory_utilization to {fix:.2f} or less")
    fixes.append("free memory on the host (`free -g` shows it; stop what else uses it)")
    fixes.append(f"lower vllm_server_start_margin_gib ({margin / GIB:.1f})")
    return f"{found}. {why}. Then {', or '.join(fixes)}, and run again"
