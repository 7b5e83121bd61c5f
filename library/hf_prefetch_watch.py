#!/usr/bin/python
"""Ansible module hf_prefetch_watch: wait a while for a running hf_prefetch and say how far it has come."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_prefetch_watch
short_description: Report the progress of a background hf_prefetch, once per interval
description:
  - Reads the progress record that M(hf_prefetch) rewrites about once a second, waiting up to O(wait_seconds) for
    the job to end, and returns one line for a person. The line gives bytes done of the total, files, elapsed
    time, rate and the time left.
  - Loop it, together with M(ansible.builtin.async_status), while an async M(hf_prefetch) runs, so a 70 GB
    download is never a silent task.
version_added: "0.1.0"
author: sparkfleet
options:
  status_file:
    description: The O(hf_prefetch#module:status_file) of the job to watch.
    type: path
    default: /run/sparkfleet/hf-prefetch.json
  wait_seconds:
    description: Longest wait for the job to end before reporting; V(0) reads once.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details: Reads only.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Weights | Wait for the next progress report
  hf_prefetch_watch:
    status_file: /run/sparkfleet/hf-prefetch-qwen.json
    wait_seconds: 30
  register: watch
"""

RETURN = r"""
done:
  description: True when the job has ended (state V(done) or V(failed)).
  returned: always
  type: bool
state:
  description: V(resolving), V(downloading), V(verifying), V(done) or V(failed); null before the job wrote anything.
  returned: always
  type: str
progress:
  description: The record as M(hf_prefetch) wrote it.
  returned: always
  type: dict
message:
  description: One line on the job's progress, for a person.
  returned: always
  type: str
  sample: "Qwen/Qwen3-0.6B@c1899de: downloading 3.1 GB of 10.4 GB (2 of 5 files) after 4m10s, 12.5 MB/s,
    about 9m45s left"
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hf_snapshot import progress_message, read_status_file
from ansible.module_utils.status_watch import wait_for_end


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "status_file": {"type": "path", "default": "/run/sparkfleet/hf-prefetch.json"},
            "wait_seconds": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    wait_seconds = module.params["wait_seconds"]
    if wait_seconds < 0:
        module.fail_json(msg=f"wait_seconds={wait_seconds} is negative; give 0 (read once) or more seconds.")

    def read() -> dict | None:
        try:
            return read_status_file(module.params["status_file"])
        except (OSError, ValueError) as error:
            module.fail_json(msg=f"Could not read the prefetch's status file: {error}", changed=False, done=False)

    record = wait_for_end(read, wait_seconds)
    state = record["state"] if record else None
    module.exit_json(
        changed=False,
        done=state in ("done", "failed"),
        state=state,
        progress=record,
        message=progress_message(record, time.time()),
    )


if __name__ == "__main__":
    main()
