#!/usr/bin/python
"""Ansible module input_check: every inventory value that reaches a file or a command line, checked against what
it may be (module_utils/input_rules.py), before any host is changed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: input_check
short_description: Check inventory values against what they may be (image, address, path, name, URL, ...)
description:
  - Checks each entry of O(values) against the rule of its O(values[].kind) (module_utils/input_rules.py) and
    fails listing every bad value at once, each with the variable's name, the value, what it may be and the fix.
  - Secrets go in O(secrets), which Ansible keeps out of every log; a message names the variable and never
    shows the value.
  - Read-only; run it on the controller (C(delegate_to) localhost) in preflight, before any host changes.
version_added: "0.1.0"
author: sparkfleet
options:
  values:
    description: The values to check.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: How the message names the value (the inventory variable, e.g. C(vllm_server_models[0].port)).
        type: str
        required: true
      value:
        description: The value.
        type: raw
      kind:
        description: The rule (one of C(module_utils/input_rules.KINDS)), or C(integer) with O(values[].min) and
          O(values[].max).
        type: str
        required: true
        choices: [text, image, address, host, network, port, path, served_name, folder_name, hf_repo, hf_commit,
                  hf_revision, duration, url, key_url, integer]
      optional:
        description: An empty string (or null) is allowed and means "not set".
        type: bool
        default: false
      min:
        description: The least value of an C(integer).
        type: int
      max:
        description: The greatest value of an C(integer).
        type: int
      fix:
        description: What to do, appended to the message (default the rule's own example).
        type: str
  secrets:
    description: Secrets by variable name (API keys, tokens); checked as C(secret), never shown.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Validate | Check every value that reaches a file or a command line
  input_check:
    values:
      - {name: vllm_server_image, value: "{{ vllm_server_image }}", kind: image, optional: true}
      - {name: vllm_server_stop_timeout_s, value: "{{ vllm_server_stop_timeout_s }}", kind: integer, min: 1}
    secrets:
      vllm_server_api_key: "{{ vllm_server_api_key }}"
  delegate_to: localhost
"""

RETURN = r"""
checked:
  description: How many values were checked.
  type: int
  returned: always
problems:
  description: One line per bad value (also in msg).
  type: list
  elements: str
  returned: failure
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.input_rules import KINDS, secret

# A templated number arrives as text: ASCII digits only (str.isdigit also takes "²", which int() refuses).
WHOLE_NUMBER = re.compile(r"^-?[0-9]+$")

# How a message shows a bad value: whole, unless long; control characters escaped by repr.
SHOWN_MAX = 120


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX] + "...'"


def integer_problem(value: object, least: int | None, most: int | None) -> str | None:
    if isinstance(value, bool):
        return "is not a whole number"
    if isinstance(value, str) and WHOLE_NUMBER.match(value):
        value = int(value)
    if not isinstance(value, int):
        return "is not a whole number"
    if least is not None and value < least:
        return f"is less than {least}"
    if most is not None and value > most:
        return f"is more than {most}"
    return None


def value_problem(entry: dict) -> str | None:
    value, kind = entry["value"], entry["kind"]
    if entry["optional"] and value in ("", None):
        return None
    if kind == "integer":
        return integer_problem(value, entry.get("min"), entry.get("max"))
    if kind == "port" and isinstance(value, str) and WHOLE_NUMBER.match(value):
        value = int(value)  # a templated number arrives as text
    return KINDS[kind](value)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "values": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "value": {"type": "raw"},
                    "kind": {"type": "str", "required": True, "choices": [*KINDS, "integer"]},
                    "optional": {"type": "bool", "default": False},
                    "min": {"type": "int"},
                    "max": {"type": "int"},
                    "fix": {"type": "str"},
                },
            },
            "secrets": {"type": "dict", "default": {}, "no_log": True},
        },
        supports_check_mode=True,
    )
    problems = []
    for entry in module.params["values"]:
        found = value_problem(entry)
        if found:
            line = f"{entry['name']}={shown(entry['value'])} {found}"
            problems.append(f"{line}: {entry['fix']}" if entry.get("fix") else line)
    for name, value in module.params["secrets"].items():
        found = value not in ("", None) and secret(value)
        if found:
            # The value stays out: Ansible masks it anyway, and a message must not depend on that.
            problems.append(f"{name} (value hidden) {found}: set it again as one word, e.g. from Ansible Vault")
    checked = len(module.params["values"]) + len(module.params["secrets"])
    if problems:
        module.fail_json(msg="Bad input, nothing was changed:\n- " + "\n- ".join(problems), problems=problems)
    module.exit_json(changed=False, checked=checked)


if __name__ == "__main__":
    main()
