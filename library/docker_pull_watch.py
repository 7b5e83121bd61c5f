#!/usr/bin/python
"""Ansible module docker_pull_watch: wait a while for a docker_pull running in the background, and say how far
it has come."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: docker_pull_watch
short_description: Wait up to some seconds for a background docker_pull and describe its progress in one line
description:
  - "Reads the status file that M(docker_pull) rewrites while it pulls, once a second, until the pull is over
    (state V(done) or V(failed)) or O(wait_seconds) have passed, and returns the progress and a sentence such as
    \"vllm/vllm-openai@sha256:abc…: 3.1 of about 10.4 GB, 12 of 31 layers, after 4m10s, 12.5 MB/s, about 9m
    left\" (the real one puts the layers in parentheses)."
  - The total is an estimate - the sizes the pull has told so far, plus the average of those for each layer
    whose size it has not told yet - and the time left comes from the average rate so far. Early in a pull the
    sentence says C(estimating) instead.
  - A failed pull is not a failure of this module - it returns C(state=failed) and the error, and the
    caller collects the pull's real result with M(ansible.builtin.async_status).
  - With no status file yet, returns C(done=false) and C(waiting for the pull to start).
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  status_file:
    description:
      - The status file of the M(docker_pull) task to watch (its O(docker_pull#module:status_file)).
    type: path
    default: /run/sparkfleet/docker-pull.json
  wait_seconds:
    description:
      - Longest time to wait for the pull to end before returning the progress so far. V(0) reads once.
      - Keep it well under the connection's timeouts; 30 s gives a line of progress every 30 s.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - module: docker_pull
"""

EXAMPLES = r"""
# watch.yml, included by the file that started docker_pull with async and poll: 0; it includes itself again
# until the pull has ended, then that file collects the result with ansible.builtin.async_status.
- name: Image | Wait for the pull's progress
  docker_pull_watch:
    status_file: /run/sparkfleet/docker-pull.json
    wait_seconds: 30
  register: image_pull_watch

- name: Image | Show the pull's progress
  ansible.builtin.debug:
    msg: "{{ image_pull_watch.message }}"

- name: Image | Keep watching
  ansible.builtin.include_tasks: watch.yml
  when: not image_pull_watch.done
"""

RETURN = r"""
done:
  description: Whether the pull has ended, in success or failure.
  returned: always
  type: bool
  sample: false
state:
  description: V(pulling), V(done) or V(failed); null while there is no status file yet.
  returned: always
  type: str
  sample: pulling
progress:
  description: The status file's record (its keys are listed under the status_file option of M(docker_pull));
    null while there is none.
  returned: always
  type: dict
  sample:
    state: pulling
    image: vllm/vllm-openai@sha256:abc0123456789abc0123456789abc0123456789abc0123456789abc0123456789
    started: 1764474452.1
    updated: 1764474702.1
    layers_total: 31
    layers_done: 12
    layers_present: 0
    layers_downloaded: 13
    layers_size_known: 15
    bytes_done: 3100000000
    bytes_total_known: 5032000000
    digest: null
    outcome: null
    error: null
message:
  description: One line on the pull's progress, for a person.
  returned: always
  type: str
  sample: "vllm/vllm-openai@sha256:abc0123456789…: 3.1 of about 10.4 GB (12 of 31 layers) after 4m10s, 12.5 MB/s,
    about 9m left"
error:
  description: The pull's error, as the registry or Docker put it; null unless state is failed.
  returned: always
  type: str
  sample: "manifest for vllm/vllm-openai:nope not found: manifest unknown: manifest unknown"
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.pull_progress import progress_message, read_status_file
from ansible.module_utils.status_watch import wait_for_end


def read(module: AnsibleModule) -> dict | None:
    try:
        return read_status_file(module.params["status_file"])
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"Could not read the pull's status file: {error}", changed=False, done=False)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "status_file": {"type": "path", "default": "/run/sparkfleet/docker-pull.json"},
            "wait_seconds": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    wait_seconds = module.params["wait_seconds"]
    if wait_seconds < 0:
        module.fail_json(msg=f"wait_seconds={wait_seconds} is negative; give 0 (read once) or more seconds.")
    record = wait_for_end(lambda: read(module), wait_seconds)
    state = record["state"] if record else None
    module.exit_json(
        changed=False,
        done=state in ("done", "failed"),
        state=state,
        progress=record,
        message=progress_message(record, time.time()),
        error=record.get("error") if record else None,
    )


if __name__ == "__main__":
    main()
