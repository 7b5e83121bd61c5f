#!/usr/bin/python
"""Ansible module spark_status: a Spark at a glance, read from what the roles left on it; changes nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spark_status
short_description: Read a Spark's models, memory, GPU health and last starts, without touching anything
description:
  - Reads each vLLM unit's last good configuration and start in O(config_dir) (what the health gate keeps), the
    unit's state from systemd, MemTotal and MemAvailable from C(/proc/meminfo), and the GPU metrics collector's
    file O(gpu_metrics_file) (temperature, SM clock, power, the clock-event reasons that hold, the reading's age).
  - Reads what the vLLM guard kept of each unit between runs (C(<name>.exits.json) beside its last good files -
    unplanned exits with their exit, OOM kill, MemAvailable and last log lines, refused starts, failures for good)
    and systemd's restart count.
  - Returns them, and RV(lines), the status a person reads (module_utils/spark_status.py).
  - Never changes anything, never asks a model anything.
version_added: "0.4.0"
author: sparkfleet
options:
  config_dir:
    description: Where the vllm_server role keeps each unit's last good files.
    type: path
    default: /etc/sparkfleet/vllm
  gpu_metrics_file:
    description: The GPU metrics collector's textfile.
    type: path
    default: /var/lib/prometheus/node-exporter/sparkfleet-gpu.prom
  host:
    description: The name the lines give the Spark.
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read the Spark's status
  spark_status:
    host: "{{ inventory_hostname }}"
  register: status
"""

RETURN = r"""
models:
  description: Each model - served, port, unit, state (systemd's ActiveState/SubState), gpu_memory_utilization,
    started_at and healthy_after_s of its last good start, and C(guard) (what the vLLM guard kept between runs -
    restarts, unplanned_exits, oom_kills, refused_starts, failures, watch_restarts, last_event).
  returned: always
  type: list
  elements: dict
memory:
  description: MemTotal and MemAvailable in bytes.
  returned: always
  type: dict
gpu:
  description: C(gpus) (by GPU index - temperature_c, sm_clock_mhz, power_w, throttled_by where the GPU metrics file
    has them) and C(age_s) of the reading; {} without the file.
  returned: always
  type: dict
lines:
  description: The status as lines.
  returned: always
  type: list
  elements: str
"""

import json
import os
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.spark_status import gpu, guard_events, line, meminfo, model
from ansible.module_utils.vllm_guard import EXITS_SUFFIX

LAST_GOOD = ".last-good.json"


def read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def unit_state(module: AnsibleModule, unit: str) -> tuple[str, int]:
    """ActiveState/SubState of the unit, and systemd's automatic restarts since its last start by hand."""
    rc, out, _ = module.run_command(["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts"])
    shown = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
    states = [shown[key] for key in ("ActiveState", "SubState") if shown.get(key)]
    restarts = int(shown["NRestarts"]) if shown.get("NRestarts", "").isdigit() else 0
    return ("/".join(states) if states else "unknown"), restarts


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": "/etc/sparkfleet/vllm"},
            "gpu_metrics_file": {"type": "path", "default": "/var/lib/prometheus/node-exporter/sparkfleet-gpu.prom"},
            "host": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    folder = Path(params["config_dir"])
    if folder.exists() and not os.access(folder, os.R_OK | os.X_OK):
        module.fail_json(msg=f"cannot read {folder} (the vLLM units' last good files, root only): run with become (-b)")
    models = []
    for path in sorted(folder.glob("*" + LAST_GOOD)):
        text = read(path)
        if text is None:
            module.fail_json(msg=f"cannot read {path}: run with become (-b)")
        try:
            last_good = json.loads(text)
        except ValueError:
            continue
        startup_path = path.with_name(path.name.removesuffix(LAST_GOOD) + ".last-good.startup.json")
        try:
            startup = json.loads(read(startup_path) or "null")
        except ValueError:
            startup = None
        exits_path = path.with_name(path.name.removesuffix(LAST_GOOD) + EXITS_SUFFIX)
        try:
            exits = json.loads(read(exits_path) or "null")
        except ValueError:
            exits = None
        state, restarts = unit_state(module, str(last_good.get("unit", "")))
        models.append(model(last_good, startup, state, guard_events(exits, restarts)))
    memory = meminfo(read(Path("/proc/meminfo")) or "")
    gpu_found = gpu(read(Path(params["gpu_metrics_file"])))
    module.exit_json(
        changed=False,
        models=models,
        memory=memory,
        gpu=gpu_found,
        lines=line(params["host"], models, memory, gpu_found),
    )


if __name__ == "__main__":
    main()
