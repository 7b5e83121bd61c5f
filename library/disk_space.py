#!/usr/bin/python
"""Ansible module disk_space: now disk_space_info; fails at once, naming the new name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: disk_space
short_description: Renamed disk_space_info; fails at once, saying so (deprecated)
description:
  - This module is now M(disk_space_info), named as ansible-core names a read-only module.
  - It does nothing but fail with a message that names M(disk_space_info); rename the module of the task.
version_added: "0.1.0"
author: sparkfleet
deprecated:
  removed_at_date: "2027-06-01"
  why: Renamed to follow ansible-core's naming of read-only modules, whose names end in _info.
  alternative: Use disk_space_info, which takes the same options and returns the same values.
options:
  checks:
    description: Accepted and ignored, so that a task written for M(disk_space) reaches the message.
    type: raw
  variable:
    description: Accepted and ignored, so that a task written for M(disk_space) reaches the message.
    type: raw
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Measure room for the weights (formerly disk_space)
  disk_space_info:
    checks:
      - path: /var/lib/sparkfleet/models
        min_free_gib: 80
  register: room
"""

RETURN = r"""
msg:
  description: That the module is now M(disk_space_info).
  returned: always
  type: str
  sample: "disk_space is now disk_space_info: rename the task's module"
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "raw"},
            "variable": {"type": "raw"},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="disk_space is now disk_space_info: rename the task's module")


if __name__ == "__main__":
    main()
