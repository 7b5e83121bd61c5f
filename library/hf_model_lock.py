#!/usr/bin/python
"""Ansible module hf_model_lock: the commit of every served model that follows a branch, resolved once and locked."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_lock
short_description: Lock the commit of every served model that names a branch instead of a commit
description:
  - For each entry of O(entries) (C(vllm_server_models) of every Spark of the run), reads its recipe from
    O(recipes_dir) with the entry's overrides. A model with an explicit C(hf_revision) commit is left as it is.
    One without follows a branch (C(hf_branch), default C(main)) - its commit comes from the lock file O(path), or,
    when the lock has none (or O(update) is set), from the Hub API at O(endpoint), once per repository and branch.
  - Writes the lock (YAML, REPO@BRANCH to commit, previous commit and time) only when an entry is new or moved, so
    a second run changes nothing; reports each move with the old and the new commit.
  - Measures each newly locked commit as M(hf_model_figures) does (config.json and the safetensors headers, never
    the weights) and keeps the architecture in the lock entry as C(figures), which the planner uses over the
    recipe's estimates. A model it cannot measure is locked without figures, with a warning.
  - Fails, before any host changes, when a model has no commit, no lock entry and the Hub cannot resolve it,
    naming the entry and the two fixes; and when the lock file is damaged, naming what is wrong.
  - The precedence (explicit commit, then the lock, then the Hub) lives in C(module_utils/model_lock.py).
  - Runs on the controller (C(delegate_to) localhost, C(run_once)), where the lock lives beside the inventory.
version_added: "0.4.0"
author: sparkfleet
options:
  entries:
    description:
      - The served-model entries, each with C(recipe) and any recipe overrides (C(hf_revision), C(hf_branch)).
      - One of O(entries) and O(by_host) is required.
    type: list
    elements: dict
  by_host:
    description:
      - The served-model entries of every Spark of the run, by host name, so that a message names the host and
        the entry's place in that host's list. One of O(entries) and O(by_host) is required.
    type: dict
  recipes_dir:
    description: The folder of recipes.
    type: path
    required: true
  path:
    description: The models lock file.
    type: path
    required: true
  endpoint:
    description: The Hugging Face Hub, or the mirror an air-gapped site runs.
    type: str
    default: https://huggingface.co
  token:
    description: A Hugging Face token, for gated or private repositories.
    type: str
    default: ""
  update:
    description: Resolve every branch again and move the lock to what it names now.
    type: bool
    default: false
  timeout_s:
    description: Seconds one Hub request may take.
    type: float
    default: 30
  name:
    description: How messages name the entries' variable.
    type: str
    default: vllm_server_models
attributes:
  check_mode:
    support: full
    details: Resolves what it must, writes nothing, and reports what it would change.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Lock the commit of every model that follows a branch
  hf_model_lock:
    by_host: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'vllm_server_models'))) }}"
    recipes_dir: "{{ playbook_dir }}/recipes"
    path: "{{ inventory_dir }}/models.lock.yml"
  delegate_to: localhost
  run_once: true
  register: lock
"""

RETURN = r"""
revisions:
  description: REPO@BRANCH to the commit every Spark of the run serves, for each model that follows a branch.
  returned: success
  type: dict
  sample: {"Qwen/Qwen3-0.6B@main": "c1899de289a04d12100db370d81485cdf75e47ca"}
resolved:
  description: One line per model that follows a branch - where its commit came from (the lock, or the Hub now).
  returned: success
  type: list
  elements: str
figures:
  description: REPO@BRANCH to the architecture measured at the locked commit, for each entry that has one.
  returned: success
  type: dict
moved:
  description: The entries whose commit is new or moved, each with C(key), C(old) (null when new) and C(new).
  returned: success
  type: list
  elements: dict
"""

import datetime
from pathlib import Path

import yaml
from ansible.module_utils.atomic_file import write_bytes_atomically
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hf_hub_api import Hub, HubError
from ansible.module_utils.hf_model_measure import measure
from ansible.module_utils.model_config_figures import FiguresError
from ansible.module_utils.model_lock import (
    HEADER,
    lock_key,
    lock_problems,
    locked_commits,
    locked_figures,
    moved_entry,
    wanted,
)
from ansible.module_utils.recipe_rules import RecipeError, apply_overrides, load_recipe
from ansible.module_utils.safetensors_header import HeaderError
from ansible.module_utils.served_models import entry_overrides


def labelled_entries(params: dict) -> list[tuple[str, dict]]:
    """(label, entry) for every entry: by host when the entries come by host."""
    if params["by_host"] is None:
        return [(f"{params['name']}[{index}]", entry) for index, entry in enumerate(params["entries"])]
    return [
        (f"{host}: {params['name']}[{index}]", entry)
        for host, entries in params["by_host"].items()
        for index, entry in enumerate(entries or [])
    ]


def followed(params: dict) -> dict[str, str]:
    """REPO@BRANCH -> the label of the first entry that follows it. An entry whose recipe cannot be read (or is
    not a mapping with a recipe name) is left to vllm_models, whose check names it in full."""
    keys: dict[str, str] = {}
    for where, entry in labelled_entries(params):
        if not isinstance(entry, dict) or not isinstance(entry.get("recipe"), str):
            continue
        label = f"{where} (recipe {entry['recipe']})"
        try:
            recipe = apply_overrides(load_recipe(entry["recipe"], params["recipes_dir"]), entry_overrides(entry))
        except RecipeError:
            continue
        follows = wanted(recipe)
        if follows is not None:
            keys.setdefault(lock_key(*follows), label)
    return keys


def measured(module: AnsibleModule, params: dict, repo: str, commit: str) -> dict | None:
    """The architecture hf_model_figures reads at `commit`, or None (with a warning) when it cannot."""
    hub = Hub(params["endpoint"], repo, commit, params["token"], params["timeout_s"])
    try:
        result, _ = measure(hub, "auto")
    except (HubError, FiguresError, HeaderError) as error:
        module.warn(f"{repo}@{commit} is locked without measured figures ({error}); the recipe's estimates stand")
        return None
    return result["architecture"]


def read_lock(module: AnsibleModule, path: Path) -> dict:
    try:
        lock = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, yaml.YAMLError) as error:
        module.fail_json(msg=f"the models lock {path} cannot be read: {error}; restore it from version control")
    problems = lock_problems(lock)
    if problems:
        module.fail_json(msg=f"the models lock {path}: " + "; ".join(problems), problems=problems)
    return lock or {}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "entries": {"type": "list", "elements": "dict"},
            "by_host": {"type": "dict"},
            "recipes_dir": {"type": "path", "required": True},
            "path": {"type": "path", "required": True},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token": {"type": "str", "default": "", "no_log": True},
            "update": {"type": "bool", "default": False},
            "timeout_s": {"type": "float", "default": 30},
            "name": {"type": "str", "default": "vllm_server_models"},
        },
        required_one_of=[("entries", "by_host")],
        mutually_exclusive=[("entries", "by_host")],
        supports_check_mode=True,
    )
    params = module.params
    if params["by_host"] is not None and not all(isinstance(v, list) for v in params["by_host"].values()):
        module.fail_json(msg=f"by_host: expected each host's {params['name']} as a list")
    path = Path(params["path"])
    keys = followed(params)
    lock = read_lock(module, path) if keys else {}
    locked = locked_commits(lock)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries = dict(lock.get("models") or {})
    revisions, resolved, moved, rewritten, problems = {}, [], [], [], []
    for key, label in keys.items():
        repo, _, branch = key.rpartition("@")
        if key in locked and not params["update"]:
            revisions[key] = locked[key]
            resolved.append(f"{key}: {locked[key]} (from the lock {path})")
            continue
        try:
            commit = Hub(params["endpoint"], repo, branch, params["token"], params["timeout_s"]).commit()
        except HubError as error:
            if key in locked:  # update asked for, but the Hub cannot answer: the lock keeps serving
                problems.append(f"{label}: vllm_server_models_update cannot move {key}: {error}")
            else:
                problems.append(
                    f"{label}: {repo} has no pinned commit and the models lock {path} has none for branch "
                    f"{branch!r}, and the Hub could not resolve it ({error}). Set hf_revision to a commit of {repo} "
                    f"in the entry (or the recipe), or let this controller reach the Hub once (or the site's mirror, "
                    f"vllm_server_hf_endpoint) to lock it"
                )
            continue
        revisions[key] = commit
        entry = moved_entry(entries.get(key), commit, now)
        if "figures" not in entry:
            figures = measured(module, params, repo, commit)
            if figures:
                entry["figures"] = figures
        if entry != entries.get(key):
            rewritten.append(key)
            entries[key] = entry
            if locked.get(key) != commit:
                moved.append({"key": key, "old": locked.get(key), "new": commit})
        old = f", moved from {locked[key]}" if key in locked and locked[key] != commit else ""
        resolved.append(f"{key}: {commit} (resolved on {params['endpoint']} now{old})")
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems)
    if rewritten and not module.check_mode:
        text = HEADER + yaml.safe_dump({"models": dict(sorted(entries.items()))}, sort_keys=False)
        write_bytes_atomically(path, text.encode(), mode=0o644, folder_mode=None)
    figures = {key: value for key, value in locked_figures({"models": entries}).items() if key in revisions}
    module.exit_json(changed=bool(rewritten), revisions=revisions, figures=figures, resolved=resolved, moved=moved)


if __name__ == "__main__":
    main()
