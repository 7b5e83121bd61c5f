#!/usr/bin/python
"""Ansible module vllm_endpoint_probe: one look at a vLLM unit and its /health endpoint (a heartbeat)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_endpoint_probe
short_description: Probe a vLLM endpoint's /health once, and say whether its systemd unit has crashed
description:
  - Sends one C(GET /health) to O(url) and reads the state of O(unit) from systemd.
  - Meant for a retry loop (C(until) on C(healthy) or C(crashed)). Each retry is one heartbeat line while a
    Spark loads weights for minutes, and a crash ends the wait at once instead of at the timeout.
  - C(crashed) is true when the unit failed, is waiting to be restarted after a failure (probe more often
    than the unit's C(RestartSec) to see it), or is not running at all (the guard refused its start - its memory
    check is the unit's C(ExecCondition)); C(journal) then holds its last log lines.
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  url:
    description: Base URL of the endpoint, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  unit:
    description: The systemd unit that runs the endpoint.
    type: str
    required: true
  timeout_s:
    description: Seconds to wait for the HTTP answer.
    type: float
    default: 5
  journal_lines:
    description: Log lines of the unit returned when it crashed.
    type: int
    default: 20
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait for the endpoint, one heartbeat every 10 seconds, for up to 40 minutes
  vllm_endpoint_probe:
    url: http://127.0.0.1:8000
    unit: vllm-nemotron-3-super.service
  register: probe
  until: probe.healthy or probe.crashed
  retries: 240
  delay: 10
"""

RETURN = r"""
healthy:
  description: C(/health) answered 200.
  returned: always
  type: bool
status:
  description: HTTP status of C(/health), or null when nothing answered.
  returned: always
  type: int
crashed:
  description: The unit failed, crashed and waits to be restarted, or is not running (the guard refused its start).
  returned: always
  type: bool
active_state:
  description: systemd ActiveState of the unit (active, activating, failed...).
  returned: always
  type: str
sub_state:
  description: systemd SubState of the unit (running, auto-restart...).
  returned: always
  type: str
restarts:
  description: systemd NRestarts of the unit (counts since the unit was loaded, not since its last start).
  returned: always
  type: int
journal:
  description: The unit's last log lines when it crashed; empty otherwise.
  returned: always
  type: list
  elements: str
"""

import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule


def health_status(url: str, timeout_s: float) -> int | None:
    """HTTP status of GET <url>/health, or None when the port does not answer (vLLM is still loading)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


def unit_state(module: AnsibleModule, unit: str) -> dict[str, str]:
    """ActiveState, SubState, NRestarts and Result of a unit, from `systemctl show`."""
    argv = ["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts,Result"]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "timeout_s": {"type": "float", "default": 5},
            "journal_lines": {"type": "int", "default": 20},
        },
        supports_check_mode=True,
    )
    params = module.params
    status = health_status(params["url"], params["timeout_s"])
    state = unit_state(module, params["unit"])
    restarts = int(state.get("NRestarts") or 0)
    # NRestarts survives a manual restart, so it cannot tell a new crash from an old one; the states can.
    # Inactive after a start: the guard refused it (module_utils/vllm_guard.py: ExecCondition), or it stopped.
    crashed = state.get("ActiveState") in ("failed", "inactive") or state.get("SubState") == "auto-restart"
    journal: list[str] = []
    if crashed:
        argv = ["journalctl", "--unit", params["unit"], "--lines", str(params["journal_lines"]), "--output", "cat"]
        journal = module.run_command(argv)[1].splitlines()
    module.exit_json(
        changed=False,
        healthy=status == 200,
        status=status,
        crashed=crashed,
        active_state=state.get("ActiveState", ""),
        sub_state=state.get("SubState", ""),
        restarts=restarts,
        journal=journal,
    )


if __name__ == "__main__":
    main()
