#!/usr/bin/python
"""Ansible module vllm_models: every model one host serves, resolved once, for every later role to read."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_models
short_description: Resolve every model a host serves, once, into the names, paths, command line and memory plan
description:
  - For each entry of O(models) (C(vllm_server_models)), reads its recipe from O(recipes_dir), lays the entry's
    overrides over it, checks it against the schema and the C(vllm serve) flags in O(flags_file), and returns
    everything the roles need about it - serve arguments, environment, snapshot path, unit, container and
    secrets file names, URL, and for a model of two Sparks its pair arguments from O(fabric).
  - Plans the unified memory of all the host's models together (their C(gpu_memory_utilization) shares add up)
    and fails when the plan could freeze the Spark, unless O(i_accept_freeze_risk).
  - Fails listing every problem at once, each naming the inventory variable and the fix, before any host changes.
  - Read-only; meant to run on the controller (C(delegate_to) localhost), where the recipes live, once per host in
    preflight. roles/vllm_server publishes its result as the fact C(vllm_server_resolved).
version_added: "0.2.0"
author: sparkfleet
options:
  models:
    description:
      - The host's C(vllm_server_models) - each a mapping with C(recipe), C(port) and recipe overrides.
      - C(profile) (V(speed), V(users) or V(safe); C(profile_context) for V(users)) derives the planned values, the
        KV cache dtype and speculation from the seed's decision table (module_utils/profiles.py); RV(notes) says
        what each profile chose, why, the single-stream decode ceiling and the published figure. An entry with a
        profile leaves the values the profile chooses to it; V(users) shares the host with its other models (it
        takes what their shares leave).
    type: list
    elements: dict
    required: true
  recipes_dir:
    description: The folder of recipes (one YAML file per model).
    type: path
    required: true
  flags_file:
    description:
      - The C(vllm serve) flag list every recipe flag must be on.
      - Default C(vllm-serve-flags.txt) in O(recipes_dir).
    type: path
  listen_address:
    description: The address the endpoints listen on (C(vllm_server_listen_address)).
    type: str
    required: true
  data_dir:
    description: The host folder of the Hugging Face cache and vLLM's caches (C(vllm_server_data_dir)).
    type: str
    required: true
  config_dir:
    description: The host folder of the secrets files and last good configurations (C(vllm_server_config_dir)).
    type: str
    required: true
  fabric:
    description: The host's pair settings (fact C(spark_fabric_node) from roles/spark_fabric); empty when in no pair.
    type: dict
    default: {}
  host:
    description: The host's inventory name (the head of its single-Spark models).
    type: str
    required: true
  keyed:
    description:
      - Whether the endpoints have an API key (C(vllm_server_api_key) set).
      - A keyed unit loads sparkfleet's key guard, which asks for the key on every path but C(/health), C(/ping),
        C(/version) and C(/metrics) (module_utils/key_guard.py).
    type: bool
    default: false
  key_guard_version:
    description:
      - The key guard's version, the first 12 hex digits of its SHA-256; each version has a folder of its own.
      - Required with O(keyed).
    type: str
    default: ""
  memory_total_bytes:
    description: The host's unified memory (C(spark_preflight_memory.mem_total_bytes)).
    type: int
    required: true
  os_reserve_min_gib:
    description: Least memory left outside the models' shares for the OS, in GiB.
    type: float
    default: 8.0
  max_gpu_memory_utilization:
    description: Highest share one model, and all the host's models together, may take.
    type: float
    default: 0.87
  overhead_gib:
    description: Memory in a model's share that is neither weights nor KV cache, in GiB.
    type: float
    default: 2.0
  i_accept_freeze_risk:
    description: Return a plan that does not fit, with a warning, instead of failing.
    type: bool
    default: false
  revisions:
    description:
      - The models lock's commits, REPO@BRANCH to commit (RV(hf_model_lock.revisions)), for the entries whose recipe
        names no commit of its own and follows a branch (C(hf_branch), default C(main)).
    type: dict
    default: {}
  figures:
    description:
      - The models lock's measured architectures, REPO@BRANCH to the block (RV(hf_model_lock.figures)). For an
        entry that follows that branch, the measured values of the keys its recipe states replace the recipe's
        estimates (the entry's own C(architecture) keys still win), and RV(notes) says where weight_bytes differ.
    type: dict
    default: {}
  speculation:
    description:
      - Serve each recipe's speculative decoding (its C(speculative) block). With C(false) the block is left out
        of the command line, the memory plan and the snapshots to fetch (C(vllm_server_speculation)).
    type: bool
    default: true
  name:
    description: The inventory variable O(models) came from, for messages.
    type: str
    default: vllm_server_models
  guard:
    description:
      - The settings of the guard that checks every start of the units between runs (module_utils/vllm_guard.py),
        returned in RV(guard.config) for the host's configuration file.
    type: dict
    default: {}
    suboptions:
      margin_gib:
        description: Memory that must stay free after a unit took its share, in GiB (vllm_server_start_margin_gib).
        type: float
        default: 3.0
      drop_caches:
        description: Whether the page cache is dropped before each check (vllm_server_drop_caches).
        type: bool
        default: true
      memory_wait_s:
        description: How long a start waits for the memory to come back before it is refused, in seconds.
        type: int
        default: 180
      queue_wait_s:
        description: How long a start waits for the other models of the host that are still loading, in seconds.
        type: int
        default: 2400
      watch_period_s:
        description: Seconds between two probes of the runtime watch (vllm_server_watch_period_s).
        type: int
        default: 60
      watch_deadline_s:
        description: Seconds the runtime watch's probe waits for its answer (vllm_server_watch_deadline_s).
        type: int
        default: 30
      watch_failures:
        description: Failed probes in a row after which the watch restarts the model (vllm_server_watch_failures).
        type: int
        default: 2
"""

EXAMPLES = r"""
- name: Resolve the models this host serves
  vllm_models:
    models: "{{ vllm_server_models }}"
    recipes_dir: "{{ vllm_server_recipes_dir }}"
    listen_address: "{{ vllm_server_listen_address }}"
    data_dir: "{{ vllm_server_data_dir }}"
    config_dir: "{{ vllm_server_config_dir }}"
    fabric: "{{ spark_fabric_node | default({}) }}"
    host: "{{ inventory_hostname }}"
    memory_total_bytes: "{{ spark_preflight_memory.mem_total_bytes }}"
  delegate_to: localhost
  register: resolved
"""

RETURN = r"""
guard:
  description:
    - Where the guard lives on the host (C(dir), C(command), C(files), C(failed_unit), C(config_name),
      C(metrics_file)) and C(config), the host's guard configuration (the units in their start order, each with
      its planned share, exits file and health URL).
  returned: success
  type: dict
models:
  description: One entry per served model, in the order of O(models).
  returned: success
  type: list
  elements: dict
  contains:
    served: {description: The served model name., type: str}
    recipe: {description: The recipe's name., type: str}
    settings: {description: The recipe with the entry's overrides, checked., type: dict}
    hf_repo: {description: The Hub repository., type: str}
    hf_revision: {description: The pinned commit., type: str}
    snapshot: {description: The snapshot folder on the host., type: str}
    unit: {description: The systemd unit name., type: str}
    container: {description: The container name., type: str}
    secrets_file: {description: The root-only file of the container's secrets., type: str}
    last_good: {description: Path prefix of the last configuration that passed the health gate., type: str}
    port: {description: The port it answers on., type: int}
    url: {description: Where it answers, as seen from the host itself., type: str}
    recipe_image: {description: The recipe's own image, or "" for the host's default., type: str}
    gpu_memory_utilization: {description: Its share of the unified memory., type: float}
    plan: {description: Its memory plan (module vllm_memory_plan's fields)., type: dict}
    multinode: {description: Whether it runs on the two Sparks of a pair., type: bool}
    rank: {description: This host's node rank (0 on a single Spark and on a pair's head)., type: int}
    api: {description: Whether this host answers its API (a pair's worker does not)., type: bool}
    pair: {description: The pair's group, or ""., type: str}
    head: {description: The host that answers its API., type: str}
    serve_args: {description: The arguments after C(vllm serve), without --host and --port., type: list}
    env: {description: The container's environment (no secrets)., type: dict}
    docker_args: {description: Extra C(docker run) arguments (RDMA devices on a pair)., type: list}
    volumes: {description: The container's C(--volume) values., type: list}
  sample: [{served: qwen3-0.6b, unit: vllm-qwen3-0.6b.service, port: 8000, url: "http://127.0.0.1:8000"}]
snapshots:
  description: The snapshots to fetch, each once, as C(hf_repo) and C(hf_revision).
  returned: success
  type: list
  elements: dict
cache_dirs:
  description: The host folders mounted into every vLLM container.
  returned: success
  type: list
  elements: str
hf_cache_dir:
  description: The Hugging Face cache folder on the host.
  returned: success
  type: str
  sample: /var/lib/sparkfleet/huggingface/hub
loopback:
  description: Whether the endpoints listen on loopback only.
  returned: success
  type: bool
key_guard:
  description:
    - Where the role installs sparkfleet's key guard (C(folder), C(file)) for keyed units; empty with no key.
  returned: success
  type: dict
memory:
  description:
    - The host's memory plan - C(fits), C(reasons), C(summary), C(gpu_memory_utilization_total),
      C(os_reserve_gib).
  returned: success
  type: dict
notes:
  description:
    - Where the plan uses figures measured at a locked commit over a recipe's estimate that differs, what each
      entry's profile chose and why, and, for a model on a group of Sparks that one Spark holds alone, the other
      choice with its published figures (module_utils/topology.py).
  returned: success
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils import key_guard, profiles, topology, vllm_guard
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.memory_plan import host_plan
from ansible.module_utils.model_lock import measured_architecture
from ansible.module_utils.recipe_rules import (
    RecipeError,
    apply_overrides,
    checked_recipe,
    container_env,
    load_recipe,
    serve_args,
)
from ansible.module_utils.served_models import (
    cache_dirs,
    duplicate_unit_problems,
    entry_overrides,
    hf_cache_dir,
    is_loopback,
    resolve_model,
    snapshots,
)
from ansible.module_utils.vllm_flags import load_flag_list

PLANNER_SETTINGS = ("overhead_gib", "os_reserve_min_gib", "max_gpu_memory_utilization")


def measured_overrides(entry: dict, overrides: dict, params: dict, label: str) -> tuple[dict, list[str]]:
    """The entry's overrides with the models lock's measured architecture beneath them (the entry's own keys win),
    and the notes where the measurement departs from the recipe's estimate."""
    if not params["figures"]:
        return overrides, []
    try:
        recipe = apply_overrides(load_recipe(entry.get("recipe"), params["recipes_dir"]), overrides)
    except RecipeError:
        return overrides, []  # checked_recipe names it
    measured, notes = measured_architecture(recipe, params["figures"], label, overrides.get("architecture"))
    return (apply_overrides({"architecture": measured}, overrides) if measured else overrides), notes


def checked_recipes(params: dict, flag_specs: dict) -> tuple[list[tuple[str, dict, dict]], list[str], list[str]]:
    """(the entry's name, entry, recipe with overrides) for each entry, every problem found, and the notes on
    measured figures."""
    checked, problems, notes = [], [], []
    for index, entry in enumerate(params["models"]):
        label = f"{params['name']}[{index}] (recipe {entry.get('recipe')})"
        overrides = entry_overrides(entry)
        overrides, measured_notes = measured_overrides(entry, overrides, params, label)
        notes += measured_notes
        recipe, found = checked_recipe(
            entry.get("recipe"),
            params["recipes_dir"],
            overrides,
            flag_specs,
            label,
            speculation=params["speculation"],
            revisions=params["revisions"],
        )
        problems += found
        found = profiles.entry_problems(entry, label, recipe)
        problems += found
        if recipe is not None and not found:
            checked.append((f"{params['name']}[{index}]", entry, recipe, label))
    profiled, profile_notes = profiles.profiles_for_host(
        [(entry, recipe) for _, entry, recipe, _ in checked],
        memory_total_bytes=params["memory_total_bytes"],
        settings={key: params[key] for key in PLANNER_SETTINGS},
        labels=[label for *_, label in checked],
    )
    notes += profile_notes
    return (
        [(name, entry, recipe) for (name, entry, _, _), recipe in zip(checked, profiled, strict=True)],
        problems,
        notes,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "models": {"type": "list", "elements": "dict", "required": True},
            "recipes_dir": {"type": "path", "required": True},
            "flags_file": {"type": "path"},
            "listen_address": {"type": "str", "required": True},
            "data_dir": {"type": "str", "required": True},
            "config_dir": {"type": "str", "required": True},
            "fabric": {"type": "dict", "default": {}},
            "host": {"type": "str", "required": True},
            "keyed": {"type": "bool", "default": False},
            "key_guard_version": {"type": "str", "default": ""},
            "memory_total_bytes": {"type": "int", "required": True},
            "os_reserve_min_gib": {"type": "float", "default": 8.0},
            "max_gpu_memory_utilization": {"type": "float", "default": 0.87},
            "overhead_gib": {"type": "float", "default": 2.0},
            "i_accept_freeze_risk": {"type": "bool", "default": False},
            "speculation": {"type": "bool", "default": True},
            "revisions": {"type": "dict", "default": {}},
            "figures": {"type": "dict", "default": {}},
            "name": {"type": "str", "default": "vllm_server_models"},
            "guard": {
                "type": "dict",
                "default": {},
                "options": {
                    "margin_gib": {"type": "float", "default": 3.0},
                    "drop_caches": {"type": "bool", "default": True},
                    "memory_wait_s": {"type": "int", "default": 180},
                    "queue_wait_s": {"type": "int", "default": 2400},
                    "watch_period_s": {"type": "int", "default": 60},
                    "watch_deadline_s": {"type": "int", "default": 30},
                    "watch_failures": {"type": "int", "default": 2},
                },
            },
        },
        supports_check_mode=True,
    )
    params = module.params
    flags_file = params["flags_file"] or str(Path(params["recipes_dir"]) / "vllm-serve-flags.txt")
    try:
        flag_specs = load_flag_list(flags_file)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"{params['name']}: the flag list {flags_file} cannot be read: {error}")
    if params["keyed"] and (problem := key_guard.version_problem(params["key_guard_version"])):
        module.fail_json(msg=f"{params['name']}: {problem}")
    checked, problems, notes = checked_recipes(params, flag_specs)
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems)

    settings = {key: params[key] for key in PLANNER_SETTINGS}
    memory, problems = host_plan(
        [(name, recipe) for name, _, recipe in checked],
        memory_total_bytes=params["memory_total_bytes"],
        settings=settings,
    )
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems, memory=memory)
    # A model on a group that one Spark could hold: the other choice, with its published figures.
    for name, _, recipe in checked:
        note = topology.advice(name, recipe, memory_total_bytes=params["memory_total_bytes"], settings=settings)
        notes += [note] if note else []

    models = [
        resolve_model(
            recipe=recipe,
            port=entry["port"],
            serve_args=serve_args(recipe, flag_specs),
            env=container_env(recipe),
            plan=plan,
            listen_address=params["listen_address"],
            data_dir=params["data_dir"],
            config_dir=params["config_dir"],
            fabric=params["fabric"],
            host=params["host"],
            keyed=params["keyed"],
            key_guard_version=params["key_guard_version"],
        )
        for (_, entry, recipe), plan in zip(checked, memory["results"], strict=True)
    ]
    problems = duplicate_unit_problems(models, params["name"])
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems)

    result = {
        "changed": False,
        "models": models,
        "snapshots": snapshots(models),
        "hf_cache_dir": hf_cache_dir(params["data_dir"]),
        "cache_dirs": cache_dirs(params["data_dir"]),
        "listen_address": params["listen_address"],
        "loopback": is_loopback(params["listen_address"]),
        # Where the role installs the key guard the units load; "" with no key (module_utils/key_guard.py).
        "key_guard": {
            "folder": key_guard.host_folder(params["config_dir"], params["key_guard_version"]),
            "file": key_guard.FILE,
        }
        if params["keyed"]
        else {},
        "memory": {key: value for key, value in memory.items() if key != "results"},
        "notes": notes,
        # The guard every start between runs goes through (module_utils/vllm_guard.py): where it lives on the
        # host, and its configuration there (the models in their start order, with their planned shares).
        "guard": {**vllm_guard.paths(), "config": vllm_guard.host_config(models, params["guard"], params["name"])},
    }
    if not memory["fits"]:
        message = ". ".join(memory["reasons"]) + "."
        if not params["i_accept_freeze_risk"]:
            module.fail_json(msg=message, **result)
        module.warn(
            "i_accept_freeze_risk is set, so this plan is returned although it does not fit: the DGX Spark may "
            f"run out of unified memory and freeze until power-cycled. {message}"
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
