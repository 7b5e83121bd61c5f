#!/usr/bin/python
"""Ansible module vllm_units: which of a host's vLLM units (re)start, why and with whom."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_units
short_description: Decide which vLLM units (re)start, why and with whom
description:
  - Asks systemd about the unit of each model of O(models) in one C(systemctl show), reads each unit's last good
    configuration (C(<last_good>.json)), and decides for each unit whether it restarts with a new configuration
    (its files changed, O(written)), restarts because its pair partner does (O(partner_reconfigured)), is started
    (it does not run), or is left alone; with the reason, in words, and whether systemd must reload its files
    first.
  - The rules are in C(module_utils/unit_restarts.py), one function each, tested there.
  - Called once the unit files are written, and on a Spark of a pair once more when its partner has said what it
    restarts (O(partner_reconfigured)), after the memory check, so a partner whose start was refused never restarts
    this side.
  - Read-only; never reports a change. Runs on the host whose units it decides.
version_added: "0.4.0"
author: sparkfleet
options:
  models:
    description:
      - The host's served models (C(vllm_server_resolved.models)), each with its C(image) and C(image_shown) named by
        the filter C(vllm_unit_images) (filter_plugins/vllm_units.py).
    type: list
    elements: dict
    required: true
  written:
    description: For each unit, whether its unit file or secrets file changed in this run.
    type: dict
    default: {}
  partner_reconfigured:
    description: The units the host's pair partner restarts with a new configuration (its C(vllm_server_reconfigured)).
    type: list
    elements: str
    default: []
  partner:
    description: The pair partner's inventory name, for the reasons given.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Decide which units (re)start
  vllm_units:
    models: "{{ vllm_server_resolved.models | vllm_unit_images(vllm_server_image, vllm_image_id, vllm_image_pinned) }}"
    written: {vllm-qwen3-0-6b.service: true}
  register: plan
"""

RETURN = r"""
units:
  description:
    - Each model with C(restart), C(action) (V(restarted), V(started) or V(none)), C(why),
      C(daemon_reload), C(with_partner), C(enable) (enable at boot without a restart), C(unit_existed), C(running),
      C(failed) (failed for good, its restart budget spent).
  returned: always
  type: list
  elements: dict
reconfigured:
  description: The units restarted with a new configuration of this host's own (a pair partner restarts with them).
  returned: always
  type: list
  elements: str
endpoints:
  description:
    - The units that answer the API - served, kind (chat, embed or rerank), port, unit, recipe, url, hf_repo,
      hf_revision, image_shown, snapshot (the model's files on the host), memory (the plan's summary),
      max_model_len and prefix_caching.
  returned: always
  type: list
  elements: dict
volatile_keys:
  description: The keys of a unit left out of its last good configuration (they change without the configuration).
  returned: always
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.unit_restarts import (
    SHOWN_PROPERTIES,
    VOLATILE_KEYS,
    endpoints,
    parse_show,
    plan_units,
    reconfigured,
)


def read_last_good(path: str) -> dict | None:
    """A unit's last good configuration, or None when it has none (or it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "models": {"type": "list", "elements": "dict", "required": True},
            "written": {"type": "dict", "default": {}},
            "partner_reconfigured": {"type": "list", "elements": "str", "default": []},
            "partner": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    models = params["models"]
    names = [model["unit"] for model in models]
    shown = {}
    if names:
        argv = ["systemctl", "show", "--property=" + ",".join(SHOWN_PROPERTIES), *names]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"`{' '.join(argv)}` failed: {err.strip()}")
        shown = parse_show(out)
    units = plan_units(
        models,
        shown=shown,
        written={unit: module.boolean(changed) for unit, changed in params["written"].items()},
        last_good={model["unit"]: read_last_good(f"{model['last_good']}.json") for model in models},
        partner_reconfigured=params["partner_reconfigured"],
        partner=params["partner"],
    )
    module.exit_json(
        changed=False,
        units=units,
        reconfigured=reconfigured(units),
        endpoints=endpoints(units),
        volatile_keys=list(VOLATILE_KEYS),
    )


if __name__ == "__main__":
    main()
