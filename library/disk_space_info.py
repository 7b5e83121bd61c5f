#!/usr/bin/python
"""Ansible module disk_space_info: free space where sparkfleet will write, compared with what it needs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: disk_space_info
short_description: Measure free disk space for paths that may not exist yet, and name every shortfall
description:
  - For each entry of O(checks), measures the file system that holds the path (its nearest existing parent when
    the path does not exist yet) with statvfs, and reports a message for each one with less free space than
    needed.
  - Works on overlay and tmpfs file systems, which Ansible's mount facts leave out.
  - Read-only; never reports a change, never fails for a shortfall (the caller decides).
version_added: "0.1.0"
author: sparkfleet
options:
  checks:
    description: Paths and the free space each needs.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path.
        type: str
        required: true
      min_free_gib:
        description: Free space needed, in GiB.
        type: float
        required: true
  variable:
    description: Name of the inventory variable the checks came from, quoted in shortfall messages.
    type: str
    default: checks
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Measure room for the vLLM image and the weights
  disk_space_info:
    checks:
      - path: /var/lib/docker
        min_free_gib: 30
      - path: /var/lib/sparkfleet/models
        min_free_gib: 80
  register: room
"""

RETURN = r"""
filesystems:
  description: One measurement per check, in the order given.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /var/lib/sparkfleet/models
      measured_at: /var/lib
      free_bytes: 812345671680
      total_bytes: 3936818806784
shortfalls:
  description: One message per check without enough free space; empty when all fit.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.disk_space import free_space, shortfall


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "checks": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "str", "required": True},
                    "min_free_gib": {"type": "float", "required": True},
                },
            },
            "variable": {"type": "str", "default": "checks"},
        },
        supports_check_mode=True,
    )
    filesystems, shortfalls = [], []
    for check in module.params["checks"]:
        if not check["path"].startswith("/"):
            module.fail_json(
                msg=f"disk_space_info needs absolute paths; got {check['path']!r} in {module.params['variable']}."
            )
        measurement = free_space(check["path"])
        filesystems.append(measurement)
        message = shortfall(measurement, check["min_free_gib"], module.params["variable"])
        if message:
            shortfalls.append(message)
    module.exit_json(changed=False, filesystems=filesystems, shortfalls=shortfalls)


if __name__ == "__main__":
    main()
