"""Plain functions behind library/'s GPU module (this file's name plus _info): query nvidia-smi, parse what it
prints, judge the result.

Nothing here imports Ansible, so pytest calls these functions directly on recorded outputs of real machines.
"""

from __future__ import annotations

import csv
import io
import re

# What we ask nvidia-smi for, in this order. `compute_cap` needs driver >= 510 (470 rejects the field).
QUERY_FIELDS = ("index", "name", "compute_cap", "driver_version", "uuid", "memory.total")

# nvidia-smi prints these where the driver has no value; a GB10 says [N/A] for every memory field because
# its memory is the unified LPDDR5X pool the CPU shares (read /proc/meminfo instead).
_MISSING_VALUES = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}

# Exit codes documented in `man nvidia-smi` (RETURN VALUE).
_EXIT_MEANINGS = {
    2: "a field or argument nvidia-smi does not know (drivers older than 510 do not know compute_cap)",
    3: "the requested operation is not available on this GPU",
    6: "no NVIDIA GPU was found",
    9: "the NVIDIA driver is not loaded",
    12: "the NVML shared library could not be found or loaded",
    14: "the infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
}

# Known names for the messages; any other compute capability is described by its sm_ number alone.
_KNOWN_GPUS = {"12.1": "the DGX Spark's NVIDIA GB10"}


class GpuQueryError(Exception):
    """nvidia-smi ran but did not give a usable answer."""


def query_argv(nvidia_smi: str) -> list[str]:
    """The argv that asks nvidia-smi for every field the module reports."""
    return [nvidia_smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]


def describe_capability(compute_capability: str) -> str:
    """'12.1' -> 'compute capability 12.1 (sm_121, the DGX Spark's NVIDIA GB10)'."""
    sm = "sm_" + compute_capability.replace(".", "")
    known = _KNOWN_GPUS.get(compute_capability)
    return (
        f"compute capability {compute_capability} ({sm}, {known})"
        if known
        else f"compute capability {compute_capability} ({sm})"
    )


def explain_failure(rc: int, stdout: str, stderr: str) -> str:
    """One sentence on why nvidia-smi failed, quoting what it said."""
    said = " ".join((stdout + " " + stderr).split()) or "nothing"
    meaning = _EXIT_MEANINGS.get(rc, "an unexpected error")
    return f"nvidia-smi exited with code {rc} ({meaning}); it said: {said}"


def _value(raw: str) -> str | None:
    raw = raw.strip()
    return None if raw in _MISSING_VALUES else raw


def _int_or_none(raw: str | None) -> int | None:
    if raw is None:
        return None
    match = re.match(r"^(\d+)", raw)
    return int(match.group(1)) if match else None


def parse_query_output(stdout: str) -> list[dict]:
    """Parse `--format=csv,noheader,nounits` output of QUERY_FIELDS into one dict per GPU.

    Memory is in MiB (nounits); fields the driver cannot report become None.
    """
    gpus = []
    for row in csv.reader(io.StringIO(stdout), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(QUERY_FIELDS):
            raise GpuQueryError(
                f"nvidia-smi printed a line with {len(row)} fields where {len(QUERY_FIELDS)} were asked for: "
                f"{','.join(row)!r}"
            )
        values = dict(zip(QUERY_FIELDS, (_value(cell) for cell in row), strict=True))
        gpus.append(
            {
                "index": _int_or_none(values["index"]),
                "name": values["name"],
                "compute_capability": values["compute_cap"],
                "driver_version": values["driver_version"],
                "uuid": values["uuid"],
                "memory_total_mib": _int_or_none(values["memory.total"]),
            }
        )
    return gpus


def version_tuple(version: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5). Raises ValueError for anything that is not dotted numbers."""
    if not re.fullmatch(r"\d+(\.\d+)*", version.strip()):
        raise ValueError(f"not a dotted version number: {version!r}")
    return tuple(int(part) for part in version.strip().split("."))


def find_problems(gpus: list[dict], required_capability: str, min_driver: str) -> list[str]:
    """Everything that keeps these GPUs from being what sparkfleet needs; empty when they are."""
    expected = describe_capability(required_capability)
    if not gpus:
        return [f"nvidia-smi listed no GPU; expected one with {expected}"]
    problems = []
    for gpu in gpus:
        label = f"GPU {gpu['index']} ({gpu['name']})"
        if gpu["compute_capability"] != required_capability:
            found = gpu["compute_capability"] or "an unknown compute capability"
            problems.append(f"{label} has compute capability {found}; expected {expected}")
        driver = gpu["driver_version"]
        try:
            too_old = driver is None or version_tuple(driver) < version_tuple(min_driver)
        except ValueError:
            too_old = True
        if too_old:
            problems.append(
                f"{label} runs NVIDIA driver {driver or 'of unknown version'}; expected {min_driver} or newer "
                "(update the driver, e.g. through DGX OS updates)"
            )
    return problems


MEMINFO = "/proc/meminfo"


def read_meminfo(path: str = MEMINFO) -> dict[str, int]:
    """The host's unified-memory figures (parse_meminfo) read from /proc/meminfo: the one reader of
    library/'s GPU module and of vllm_memory_plan. OSError or ValueError when it cannot be read."""
    with open(path, encoding="ascii") as handle:
        return parse_meminfo(handle.read())


def parse_meminfo(text: str) -> dict[str, int]:
    """The unified-memory figures of /proc/meminfo, in bytes (the kernel prints kB = KiB)."""
    wanted = {
        "MemTotal": "mem_total_bytes",
        "MemAvailable": "mem_available_bytes",
        "SwapTotal": "swap_total_bytes",
        "SwapFree": "swap_free_bytes",
    }
    figures = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            figures[wanted[key]] = int(rest.split()[0]) * 1024
    missing = sorted(name for key, name in wanted.items() if name not in figures)
    if missing:
        raise ValueError(f"/proc/meminfo lacks {', '.join(missing)}")
    return figures
