#!/usr/bin/python
"""Ansible module spark_gpu: now spark_gpu_info; fails at once, naming the new name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spark_gpu
short_description: Renamed spark_gpu_info; fails at once, saying so (deprecated)
description:
  - This module is now M(spark_gpu_info), named as ansible-core names a read-only module.
  - It does nothing but fail with a message that names M(spark_gpu_info); rename the module of the task.
version_added: "0.1.0"
author: sparkfleet
deprecated:
  removed_at_date: "2027-06-01"
  why: Renamed to follow ansible-core's naming of read-only modules, whose names end in _info.
  alternative: Use spark_gpu_info, which takes the same options and returns the same values.
options:
  required_compute_capability:
    description: Accepted and ignored, so that a task written for M(spark_gpu) reaches the message.
    type: raw
  min_driver_version:
    description: Accepted and ignored, so that a task written for M(spark_gpu) reaches the message.
    type: raw
  nvidia_smi:
    description: Accepted and ignored, so that a task written for M(spark_gpu) reaches the message.
    type: raw
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Verify the GB10 GPU and the driver (formerly spark_gpu)
  spark_gpu_info:
  register: gpu
"""

RETURN = r"""
msg:
  description: That the module is now M(spark_gpu_info).
  returned: always
  type: str
  sample: "spark_gpu is now spark_gpu_info: rename the task's module"
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "required_compute_capability": {"type": "raw"},
            "min_driver_version": {"type": "raw"},
            "nvidia_smi": {"type": "raw"},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="spark_gpu is now spark_gpu_info: rename the task's module")


if __name__ == "__main__":
    main()
