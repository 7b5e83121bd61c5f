"""The same stack on every Spark: what preflight gathers from each host (NVIDIA driver, kernel, DGX OS release, the
vLLM image it will run, the host's own NCCL) and the one rule for judging a fleet by it.

- The two Sparks of a pair run one model together: a difference in what they share (PAIR_FIXES) stops the run,
  naming both values (a pair on two drivers, kernels, OS releases or images fails in ways that look like network
  faults). The NCCL the pair uses is the image's own (a pip wheel inside it), so the image digest stands for it; the
  host's libnccl2 is compared for the fleet, and binds a pair that mounts it (spark_fabric_nccl_library: host;
  host_nccl_problems, which roles/spark_fabric applies).
- Sparks that serve alone may differ: the run goes on with a warning that lists each group of Sparks per value.
- Known-bad versions (KNOWN_BAD, each with its source) refuse or warn as their source warrants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# What is compared, in the order messages list it: key -> how a person reads it.
KEYS = {
    "driver": "NVIDIA driver",
    "kernel": "kernel",
    "dgx_os": "DGX OS release",
    "image": "vLLM image",
    "host_nccl": "host libnccl2 version",
}
# What the two Sparks of a pair must share, and how to bring them together.
PAIR_FIXES = {
    "driver": "bring them to one version",
    "kernel": "bring them to one version",
    "dgx_os": "bring them to one version",
    "image": "set one vllm_image_ref for both (in the pair's group_vars), and let the lock pin it once",
}
# Known-bad versions: (key, regular expression the value matches, "refuse" or "warn", why, source).
KNOWN_BAD = (
    (
        "driver",
        r"590\.",
        "warn",
        "driver 590.x has a CUDA-graph capture deadlock on the GB10's unified memory; recipes need the 580 series",
        "eugr/spark-vllm-docker README, changelog 2026-03-12 (a community recipe note, not an NVIDIA advisory)",
    ),
)
UNKNOWN = "unknown"


def dgx_release(text: str | None) -> str:
    """The DGX OS release /etc/dgx-release names: its last DGX_OTA_VERSION (each update appends one), else the
    factory DGX_SWBUILD_VERSION; "none" without the file (not DGX OS). Nothing else of the file is read (it holds
    the serial number)."""
    if text is None:
        return "none"
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(DGX_OTA_VERSION|DGX_SWBUILD_VERSION)\s*=\s*(.*?)\s*$", line)
        if match:
            values[match.group(1)] = match.group(2).strip("\"'")
    return values.get("DGX_OTA_VERSION") or values.get("DGX_SWBUILD_VERSION") or UNKNOWN


def _groups(stacks: Mapping[str, Mapping[str, str]], key: str) -> dict[str, list[str]]:
    """value -> the hosts that have it, hosts sorted."""
    found: dict[str, list[str]] = {}
    for host in sorted(stacks):
        found.setdefault(str(stacks[host].get(key) or UNKNOWN), []).append(host)
    return found


def _listed(groups: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in sorted(groups.items()))


def pairs(pair_of: Mapping[str, Mapping | None]) -> dict[str, list[str]]:
    """pair group -> its hosts, from host -> its pair ({group, ...}, or {} for a Spark that serves alone)."""
    found: dict[str, list[str]] = {}
    for host in sorted(pair_of):
        group = (pair_of[host] or {}).get("group")
        if group:
            found.setdefault(str(group), []).append(str(host))
    return found


def judge(stacks: Mapping[str, Mapping[str, str]], pairs: Mapping[str, list[str]]) -> tuple[list[str], list[str]]:
    """(problems that stop the run, warnings) for the hosts' stacks (host -> {key: value} for KEYS) and the
    pairs (pair -> its two hosts)."""
    problems, warnings = [], []
    for pair, hosts in sorted(pairs.items()):
        present = [host for host in hosts if host in stacks]
        for key, fix in PAIR_FIXES.items():
            label = KEYS[key]
            groups = _groups({host: stacks[host] for host in present}, key)
            if len(groups) > 1:
                problems.append(
                    f"pair {pair}: its Sparks run different {label}s ({_listed(groups)}); a group serves one model "
                    f"together, so every Spark of it must run the same {label}: {fix}"
                )
    for key, label in KEYS.items():
        groups = _groups(stacks, key)
        if len(groups) > 1:
            warnings.append(f"the fleet runs {len(groups)} {label}s: {_listed(groups)}")
    for key, pattern, verdict, why, source in KNOWN_BAD:
        hosts = [host for host in sorted(stacks) if re.match(pattern, str(stacks[host].get(key) or ""))]
        if hosts:
            values = sorted({str(stacks[host][key]) for host in hosts})
            line = f"{KEYS[key]} {', '.join(values)} on {', '.join(hosts)}: {why} ({source})"
            (problems if verdict == "refuse" else warnings).append(line)
    return problems, warnings


def host_nccl_problems(stacks: Mapping[str, Mapping[str, str]], pair: str) -> list[str]:
    """What stops a pair that loads the host's NCCL (spark_fabric_nccl_library: host) from its Sparks' stacks
    (host -> {host_nccl, ...}): a Spark without libnccl2, or two builds."""
    problems = []
    missing = [host for host in sorted(stacks) if str(stacks[host].get("host_nccl") or "none") in ("none", UNKNOWN)]
    if missing:
        problems.append(f"{', '.join(missing)} has no libnccl2 package (install DGX OS's libnccl2)")
    groups = _groups(stacks, "host_nccl")
    if len(groups) > 1 and not missing:
        problems.append(
            f"pair {pair}: its Sparks run different {KEYS['host_nccl']}s ({_listed(groups)}); bring all of them to one "
            "libnccl2 (apt)"
        )
    return problems
