#!/usr/bin/python
"""Ansible module vllm_start_memory: before vLLM units restart, is the memory they need free on this host now?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_start_memory
short_description: Check, right before vLLM units (re)start, that the unified memory they need is free now
description:
  - vLLM refuses to start unless the free memory at its start is at least C(--gpu-memory-utilization) x total, and
    on a DGX Spark (GB10) "free" is close to MemFree, so the page cache counts as used (vllm#48140). The memory
    planner (M(vllm_memory_plan)) checks the flags against MemTotal; this module checks them against what is free
    on the host at this moment, before anything is restarted, so that a change that cannot start leaves the
    previous configuration running.
  - Drops the page cache first (C(sync), then V(3) into V(/proc/sys/vm/drop_caches)) when O(drop_caches) is true,
    a unit is about to start and not in check mode. A host that forbids the write (a container) is tolerated, as
    the unit's own C(ExecStartPre=-) tolerates it.
  - The units of O(units) with O(units[].restart) restart one after another in their order, and each one's start
    check can run before the next one has stopped, so every step must fit -- free + what the units restarted so
    far free when they stop >= their shares + O(margin_gib). Free is MemAvailable when the page cache is dropped
    before each start (after this module's drop; in check mode MemAvailable estimates what the drop frees), else
    MemFree.
  - A running unit frees the share of the configuration it runs, read from its last good configuration
    (O(units[].last_good)C(.json), whose C(serve_args) hold C(--gpu-memory-utilization)); without that record it
    is counted as freeing nothing. All of them together free at most the memory in use now (MemTotal minus free).
  - Fails, naming the unit, the inventory variable (see O(name)) and what to lower, when a step does not fit.
  - Reports no change; dropping the page cache changes no configuration (RV(caches_dropped) says it happened).
version_added: "0.1.0"
author: sparkfleet
options:
  units:
    description: The host's queued vLLM units, in the order they restart (the order of vllm_server_models).
    type: list
    elements: dict
    required: true
    suboptions:
      unit:
        description: The systemd unit, e.g. V(vllm-qwen3-0-6b.service).
        type: str
        required: true
      gpu_memory_utilization:
        description: The utilization of the configuration about to start (its planned share of MemTotal).
        type: float
        required: true
      restart:
        description: Whether the unit is about to be (re)started; units that are not only keep what they hold.
        type: bool
        default: true
      last_good:
        description:
          - Path prefix of the unit's last good configuration; V(<last_good>.json) is read for the C(serve_args)
            of the configuration that runs now.
        type: path
  running:
    description: The units running now (e.g. from M(ansible.builtin.service_facts)); others free nothing.
    type: list
    elements: str
    default: []
  margin_gib:
    description: Memory that must stay free after the vLLMs took their shares, in GiB (keep MemAvailable above
      2-3 GB on a Spark).
    type: float
    default: 3.0
  drop_caches:
    description: Whether the page cache is dropped before vLLM starts (here, and by the unit's C(ExecStartPre)).
    type: bool
    default: true
  name:
    description: The inventory variable that lists the models, for messages; unit i is labelled V(<name>[i]).
    type: str
    default: vllm_server_models
  meminfo_path:
    description: Where to read MemTotal, MemAvailable and MemFree (for tests; the host's is V(/proc/meminfo)).
    type: path
    default: /proc/meminfo
  drop_caches_path:
    description: The kernel's page-cache knob (for tests; the host's is V(/proc/sys/vm/drop_caches)).
    type: path
    default: /proc/sys/vm/drop_caches
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - The planned share is O(units[].gpu_memory_utilization) x MemTotal, the MemTotal the planner reads from the same
    V(/proc/meminfo).
  - A pair's partner restart (a running unit restarted with an unchanged configuration) frees the share it then
    takes again, so it changes no step.
"""

EXAMPLES = r"""
- name: Check that the memory for the units about to restart is free
  vllm_start_memory:
    units:
      - unit: vllm-nemotron-3-super.service
        gpu_memory_utilization: 0.80
        restart: true
        last_good: /etc/sparkfleet/vllm/nemotron-3-super.last-good
      - unit: vllm-qwen3-6-35b.service
        gpu_memory_utilization: 0.05
        restart: false
    running: [vllm-nemotron-3-super.service, vllm-qwen3-6-35b.service]
    margin_gib: 3
    drop_caches: true
"""

RETURN = r"""
fits:
  description: Whether every unit about to (re)start finds the memory it needs.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why not, naming the unit, the variable and what to lower; empty when it fits.
  returned: always
  type: list
  elements: str
  sample: []
summary:
  description: One human line with the figures.
  returned: always
  type: str
caches_dropped:
  description: Whether this run dropped the page cache (never in check mode).
  returned: always
  type: bool
  sample: true
memory_total_gib:
  description: MemTotal, in GiB.
  returned: always
  type: float
  sample: 121.69
free_gib:
  description: The memory counted as free now (see RV(free_source)), in GiB.
  returned: always
  type: float
  sample: 112.4
free_source:
  description: Which /proc/meminfo figure RV(free_gib) is.
  returned: always
  type: str
  sample: MemAvailable
freed_gib:
  description: What the running units about to restart free when they stop, in GiB.
  returned: always
  type: float
  sample: 97.35
needed_gib:
  description: The shares of the units about to (re)start together, without the margin, in GiB.
  returned: always
  type: float
  sample: 97.35
margin_gib:
  description: The margin asked for, in GiB.
  returned: always
  type: float
  sample: 3.0
steps:
  description: The units about to (re)start, in order, with C(name), C(unit), C(gpu_memory_utilization),
    C(share_gib), C(running) and C(frees_gib).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vllm_start_check import (
    GIB,
    StartUnit,
    memory_figures,
    running_utilization,
    should_drop_caches,
    start_check,
)


def read_memory(module: AnsibleModule) -> dict[str, int]:
    """MemTotal and MemAvailable (the planner's reader) and MemFree, in bytes."""
    path = module.params["meminfo_path"]
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read()
        return memory_figures(text)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"Could not read the host's memory from {path}: {error}.", fits=False, reasons=[])


def drop_page_cache(path: str) -> bool:
    """sync, then drop the page cache; False where the host forbids it (a container), as ExecStartPre=- allows."""
    os.sync()
    try:
        with open(path, "w", encoding="ascii") as knob:
            knob.write("3\n")
    except OSError:
        return False
    return True


def read_running_utilization(last_good: str | None) -> float | None:
    if not last_good:
        return None
    try:
        with open(f"{last_good}.json", encoding="utf-8") as handle:
            return running_utilization(handle.read())
    except (OSError, UnicodeDecodeError):
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "unit": {"type": "str", "required": True},
                    "gpu_memory_utilization": {"type": "float", "required": True},
                    "restart": {"type": "bool", "default": True},
                    "last_good": {"type": "path"},
                },
            },
            "running": {"type": "list", "elements": "str", "default": []},
            "margin_gib": {"type": "float", "default": 3.0},
            "drop_caches": {"type": "bool", "default": True},
            "name": {"type": "str", "default": "vllm_server_models"},
            "meminfo_path": {"type": "path", "default": "/proc/meminfo"},
            "drop_caches_path": {"type": "path", "default": "/proc/sys/vm/drop_caches"},
        },
        supports_check_mode=True,
    )
    params = module.params
    running = set(params["running"])
    units = [
        StartUnit(
            name=f"{params['name']}[{index}]",
            unit=entry["unit"],
            gpu_memory_utilization=entry["gpu_memory_utilization"],
            restart=entry["restart"],
            running=entry["unit"] in running,
            running_utilization=(
                read_running_utilization(entry["last_good"]) if entry["restart"] and entry["unit"] in running else None
            ),
        )
        for index, entry in enumerate(params["units"])
    ]
    dropped = False
    if should_drop_caches(params["drop_caches"], module.check_mode, units):
        dropped = drop_page_cache(params["drop_caches_path"])
    memory = read_memory(module)
    check = start_check(memory, units, margin_gib=params["margin_gib"], use_available=params["drop_caches"])
    restarting = [step["unit"] for step in check.steps]
    summary = (
        f"{', '.join(restarting) or 'no unit'} to (re)start: {check.free_bytes / GIB:,.1f} GiB free "
        f"({check.free_source}{', page cache dropped' if dropped else ''}) + {check.freed_bytes / GIB:,.1f} GiB "
        f"freed by the restarted units, for {check.needed_bytes / GIB:,.1f} GiB of shares + "
        f"{check.margin_bytes / GIB:,.1f} GiB margin: {'fits' if check.fits else 'DOES NOT FIT'}"
    )
    result = {
        "changed": False,
        "fits": check.fits,
        "reasons": list(check.reasons),
        "summary": summary,
        "caches_dropped": dropped,
        "memory_total_gib": round(check.memory_total_bytes / GIB, 2),
        "free_gib": round(check.free_bytes / GIB, 2),
        "free_source": check.free_source,
        "freed_gib": round(check.freed_bytes / GIB, 2),
        "needed_gib": round(check.needed_bytes / GIB, 2),
        "margin_gib": round(check.margin_bytes / GIB, 2),
        "steps": list(check.steps),
    }
    if not check.fits:
        module.fail_json(msg=" ".join(check.reasons), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
