#!/usr/bin/python
"""Ansible module vllm_image_lock: read the image lock file (the digest each image reference is pinned to), check
its shape, and return the pin of one reference. Run in preflight, so a damaged lock stops the run before any
host changes instead of silently counting as "not pinned"."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_image_lock
short_description: Read and check the vLLM image lock file and return one reference's pin
description:
  - Reads O(path) (YAML written by the vllm_image role; a missing or empty file means nothing is pinned yet) and
    checks every entry's shape. A file that is not YAML, or an entry of the wrong shape, fails naming O(name), the
    entry and what to do; it is never read as "not pinned", which would move the fleet to whatever the tag points
    at now.
  - Read-only; run it on the controller (C(delegate_to) localhost), where the lock lives next to the inventory.
version_added: "0.1.0"
author: sparkfleet
options:
  path:
    description: The lock file.
    type: path
    required: true
  ref:
    description: The image reference whose pin to return (C(vllm_image_ref)).
    type: str
    required: true
  name:
    description: How messages name the file's variable.
    type: str
    default: vllm_image_lock_file
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Validate | Read and check the image lock
  vllm_image_lock:
    path: "{{ vllm_image_lock_file }}"
    ref: "{{ vllm_image_ref }}"
  delegate_to: localhost
  register: lock
"""

RETURN = r"""
lock:
  description: The whole lock, a mapping C(images) of reference to entry; empty when there is no file yet.
  type: dict
  returned: success
locked:
  description: The entry of O(ref) (digest, image_id, previous_digest, pinned_at), or empty when it has none.
  type: dict
  returned: success
"""

import datetime
import re

import yaml
from ansible.module_utils.basic import AnsibleModule

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# What the vllm_image role writes for each reference (tasks/lock_write.yml): a digest or an image ID can be null
# (a host that loaded an archive has no registry digest).
ENTRY_KEYS = {"digest": DIGEST, "image_id": DIGEST, "previous_digest": DIGEST, "pinned_at": None}
FIX = "restore it from version control, or remove the entry (or the file) to pin the reference afresh"


def entry_problems(ref: object, entry: object) -> list[str]:
    where = f"images[{ref!r}]"
    if not isinstance(entry, dict):
        return [f"{where} is {type(entry).__name__}, expected a mapping of {', '.join(ENTRY_KEYS)}"]
    problems = [f"{where}.{key} is not a key of a pin" for key in entry if key not in ENTRY_KEYS]
    for key, pattern in ENTRY_KEYS.items():
        value = entry.get(key)
        if value is None:
            continue
        if pattern is None:  # a time: text, or a date YAML read as one
            if not isinstance(value, (str, datetime.date)):
                problems.append(f"{where}.{key} is {value!r}, expected a time such as 2026-12-01T10:00:00Z")
            continue
        if not isinstance(value, str) or not pattern.match(value):
            problems.append(f"{where}.{key} is {value!r}, expected sha256:<64 hex digits> or null")
    if not entry.get("digest") and not entry.get("image_id"):
        problems.append(f"{where} pins nothing (no digest and no image_id)")
    return problems


def lock_problems(lock: object) -> list[str]:
    if lock is None:
        return []
    if not isinstance(lock, dict):
        return [f"the file holds {type(lock).__name__}, expected a mapping with the key 'images'"]
    problems = [f"{key!r} is not a key of the lock (only 'images')" for key in lock if key != "images"]
    images = lock.get("images") or {}
    if not isinstance(images, dict):
        return [*problems, f"images is {type(images).__name__}, expected a mapping of image reference to pin"]
    for ref, entry in images.items():
        problems += entry_problems(ref, entry)
    return problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "ref": {"type": "str", "required": True},
            "name": {"type": "str", "default": "vllm_image_lock_file"},
        },
        supports_check_mode=True,
    )
    path, name = module.params["path"], module.params["name"]
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        module.exit_json(changed=False, lock={}, locked={})
    except OSError as error:
        module.fail_json(msg=f"{name} ({path}) cannot be read: {error.strerror}")
    try:
        lock = yaml.safe_load(text)
    except yaml.YAMLError as error:
        module.fail_json(msg=f"{name} ({path}) is not YAML ({error}): {FIX}.")
    problems = lock_problems(lock)
    if problems:
        module.fail_json(msg=f"{name} ({path}): " + "; ".join(problems) + f". Nothing was changed: {FIX}.")
    lock = lock or {}
    module.exit_json(changed=False, lock=lock, locked=(lock.get("images") or {}).get(module.params["ref"]) or {})


if __name__ == "__main__":
    main()
