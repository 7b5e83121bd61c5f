#!/usr/bin/python
"""Ansible module fabric_link: now fabric_link_info; fails at once, naming the new name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_link
short_description: Renamed fabric_link_info; fails at once, saying so (deprecated)
description:
  - This module is now M(fabric_link_info), named as ansible-core names a read-only module.
  - It does nothing but fail with a message that names M(fabric_link_info); rename the module of the task.
version_added: "0.1.0"
author: sparkfleet
deprecated:
  removed_at_date: "2027-06-01"
  why: Renamed to follow ansible-core's naming of read-only modules, whose names end in _info.
  alternative: Use fabric_link_info, which takes the same options and returns the same values.
options:
  interfaces:
    description: Accepted and ignored, so that a task written for M(fabric_link) reaches the message.
    type: raw
  speed_mbps:
    description: Accepted and ignored, so that a task written for M(fabric_link) reaches the message.
    type: raw
  mtu:
    description: Accepted and ignored, so that a task written for M(fabric_link) reaches the message.
    type: raw
  peer_addresses:
    description: Accepted and ignored, so that a task written for M(fabric_link) reaches the message.
    type: raw
  ping_count:
    description: Accepted and ignored, so that a task written for M(fabric_link) reaches the message.
    type: raw
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check both halves of the fabric link (formerly fabric_link)
  fabric_link_info:
    interfaces: [enp1s0f1np1, enP2p1s0f1np1]
  register: link
"""

RETURN = r"""
msg:
  description: That the module is now M(fabric_link_info).
  returned: always
  type: str
  sample: "fabric_link is now fabric_link_info: rename the task's module"
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interfaces": {"type": "raw"},
            "speed_mbps": {"type": "raw"},
            "mtu": {"type": "raw"},
            "peer_addresses": {"type": "raw"},
            "ping_count": {"type": "raw"},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="fabric_link is now fabric_link_info: rename the task's module")


if __name__ == "__main__":
    main()
