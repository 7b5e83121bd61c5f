#!/usr/bin/python
"""Ansible module job_watch: wait a while for a docker_pull or hf_prefetch running in the background, and say how
far it has come."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_watch
short_description: Wait up to some seconds for a background docker_pull or hf_prefetch and describe its progress
description:
  - "Reads the status file that M(docker_pull) (O(kind=pull)) or M(hf_prefetch) (O(kind=fetch)) rewrites about
    once a second while it runs in the background (C(async), C(poll: 0)), until the job is over or O(wait_seconds)
    have passed, and returns one line for a person (RV(message)) with bytes done of the (estimated) total, layers
    or files, the time so far, the rate and the time left."
  - "Meant to be retried until RV(done): one task with C(until: result is failed or result.done), C(delay: 0) and
    C(retries) sized from the job's timeout divided by O(wait_seconds). Each round then takes one interval, and
    the play prints one C(FAILED - RETRYING) line per interval, with the retries left, and the module's action
    plugin (action_plugins/job_watch.py) prints RV(message) of each round on the controller. No task includes
    itself."
  - The job is over when its status file says V(done) or V(failed), or when O(job_file) says the job's process
    has ended (it was killed at its C(async) timeout, or died before writing its end). Then the module returns at
    once.
  - A failed job is not a failure of this module. It returns RV(done) and the job's error, and the caller
    collects the job's real result with M(ansible.builtin.async_status).
  - With no status file yet, returns C(done=false) and C(waiting for the pull to start) (or C(prefetch)).
  - Read-only; never reports a change.
version_added: "0.3.0"
author: sparkfleet
options:
  kind:
    description:
      - What the job is, which says how its status file reads. V(pull) for M(docker_pull), V(fetch) for
        M(hf_prefetch).
    type: str
    required: true
    choices: [pull, fetch]
  status_file:
    description:
      - The status file of the job to watch, the O(docker_pull#module:status_file) of M(docker_pull) or the
        O(hf_prefetch#module:status_file) of M(hf_prefetch) that started it.
    type: path
    required: true
  job_file:
    description:
      - "The async job's results file, C(results_file) in what the task that started the job (C(async), C(poll: 0))
        registered. When it holds the job's result, the job has ended whatever its status file says."
      - Without it, only the status file says when the job is over.
    type: path
  wait_seconds:
    description:
      - Longest time to wait for the job to end before returning the progress so far. V(0) reads once.
      - Keep it well under the connection's timeouts; 30 s gives a line of progress every 30 s.
    type: int
    default: 30
  started:
    description:
      - When the job started, in epoch seconds. With it, a round waits a twentieth of the time since then when
        that is longer than O(wait_seconds). A day-long download then reports every minute once it has run for 20
        minutes, every 10 minutes once it has run for 3 hours and 20 minutes.
    type: float
attributes:
  check_mode:
    support: full
    details: Reads only.
  diff_mode:
    support: none
notes:
  - Run it with the same C(become) as the job, so that it can read the job's files.
seealso:
  - module: docker_pull
  - module: hf_prefetch
  - module: ansible.builtin.async_status
"""

EXAMPLES = r"""
- name: Image | Start pulling the image
  docker_pull:
    name: vllm/vllm-openai
    reference: sha256:6f0a1c0f5e7b4d2a9c8e3b1d0f2a4c6e8b0d2f4a6c8e0b2d4f6a8c0e2b4d6f8a
    status_file: /run/sparkfleet/pull-1.json
  async: 14400
  poll: 0
  register: image_pull_job

# One round per 30 s until the pull ends: each prints its progress line (action_plugins/job_watch.py).
- name: Image | Wait for the pull, reporting every 30 s
  job_watch:
    kind: pull
    status_file: /run/sparkfleet/pull-1.json
    job_file: "{{ image_pull_job.results_file }}"
    wait_seconds: 30
  register: image_pull_watch
  until: image_pull_watch is failed or image_pull_watch.done
  retries: "{{ (14400 + 60) // 30 + 1 }}"
  delay: 0

- name: Image | Say how the pull ended
  ansible.builtin.debug:
    msg: "{{ image_pull_watch.message }}"

- name: Image | Collect the pull's result
  ansible.builtin.async_status:
    jid: "{{ image_pull_job.ansible_job_id }}"
  register: image_pull
  until: image_pull.finished
  retries: 60
  delay: 2

# A long download: the wait grows with the time already spent.
- name: Weights | Wait for the fetch, reporting every 30 s or more
  job_watch:
    kind: fetch
    status_file: /run/sparkfleet/hf-prefetch-qwen.json
    job_file: "{{ weights_job.results_file }}"
    wait_seconds: 30
    started: "{{ weights_started }}"
  register: weights_watch
  until: weights_watch is failed or weights_watch.done
  retries: "{{ (86400 + 60) // 30 + 1 }}"
  delay: 0
"""

RETURN = r"""
done:
  description: Whether the job has ended, in success or failure (its status file says so, or O(job_file) does).
  returned: always
  type: bool
  sample: false
state:
  description:
    - The status file's state; null while there is no status file yet.
    - V(pulling), V(done) or V(failed) for a pull; V(resolving), V(downloading), V(verifying), V(done) or
      V(failed) for a fetch.
  returned: always
  type: str
  sample: pulling
message:
  description: One line on the job's progress, or on how it ended, for a person.
  returned: always
  type: str
  sample: "vllm/vllm-openai@sha256:abc0123456789…: 3.1 of about 10.4 GB (12 of 31 layers) after 4m10s, 12.5 MB/s,
    about 9m left"
error:
  description: Why the job failed, in its own words; null unless it failed.
  returned: always
  type: str
  sample: "manifest for vllm/vllm-openai:nope not found: manifest unknown: manifest unknown"
job_ended:
  description: Whether O(job_file) says the job's process has ended; false without O(job_file).
  returned: always
  type: bool
  sample: false
waited_at_most:
  description: The wait of this round, in seconds (O(wait_seconds), or longer with O(started)).
  returned: always
  type: float
  sample: 30.0
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hf_snapshot import progress_message as fetch_message
from ansible.module_utils.hf_snapshot import read_status_file as read_fetch_status
from ansible.module_utils.pull_progress import progress_message as pull_message
from ansible.module_utils.pull_progress import read_status_file as read_pull_status
from ansible.module_utils.status_watch import END_STATES, job_result, wait_for_end, wait_seconds_for

# kind -> (how its status file reads, the line it makes, the job in words)
KINDS = {
    "pull": (read_pull_status, pull_message, "pull"),
    "fetch": (read_fetch_status, fetch_message, "prefetch"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "required": True, "choices": sorted(KINDS)},
            "status_file": {"type": "path", "required": True},
            "job_file": {"type": "path"},
            "wait_seconds": {"type": "int", "default": 30},
            "started": {"type": "float"},
        },
        supports_check_mode=True,
    )
    params = module.params
    read_status_file, progress_message, job = KINDS[params["kind"]]
    if params["wait_seconds"] < 0:
        module.fail_json(msg=f"wait_seconds={params['wait_seconds']} is negative; give 0 (read once) or more seconds.")

    def read() -> dict | None:
        try:
            return read_status_file(params["status_file"])
        except (OSError, ValueError) as error:
            module.fail_json(msg=f"Could not read the {job}'s status file: {error}", changed=False, done=False)

    wait = wait_seconds_for(params["wait_seconds"], params["started"], time.time())
    record, ended = wait_for_end(read, wait, lambda: job_result(params["job_file"]))
    state = record["state"] if record else None
    message = progress_message(record, time.time())
    error = record.get("error") if state == "failed" else None
    if ended is not None and state not in END_STATES:
        # Killed at its async timeout, or died before it could write its end: its result says why.
        error = str(ended.get("msg") or "no message") if ended.get("failed") else None
        message = f"{message}; then the {job}'s process ended" + (f": {error}" if error else "")
    module.exit_json(
        changed=False,
        done=state in END_STATES or ended is not None,
        state=state,
        message=message,
        error=error,
        job_ended=ended is not None,
        waited_at_most=float(wait),
    )


if __name__ == "__main__":
    main()
