#!/usr/bin/python
"""Ansible module vllm_recipe: a model recipe with its overrides applied, checked, and rendered for `vllm serve`."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_recipe
short_description: Load a model recipe, apply overrides, check it against the pinned vLLM's flags, render it
description:
  - Reads O(recipe) from O(recipes_dir) (one YAML file per model, schema in recipes/README.md), lays
    O(overrides) over it (mappings merge key by key), and checks the result against the schema and against
    the C(vllm serve) flag list in O(flags_file).
  - Fails listing every problem at once, each naming O(label) and the fix, so a typo in a flag stops the run
    before any host is changed instead of after a long weight load.
  - Read-only; meant to run on the controller (with C(delegate_to) localhost), where the recipes live.
version_added: "0.1.0"
author: sparkfleet
options:
  recipe:
    description: Name of the recipe (the file name without C(.yml)).
    type: str
    required: true
  recipes_dir:
    description: The folder of recipes.
    type: path
    required: true
  overrides:
    description: Recipe keys to replace; mappings (C(serve_flags), C(env), C(architecture)) merge key by key.
    type: dict
    default: {}
  flags_file:
    description: The C(vllm serve) flag list of the pinned vLLM (C(--FLAG KIND) lines). Default
      C(vllm-serve-flags.txt) in O(recipes_dir).
    type: path
  label:
    description: How messages name the recipe, e.g. the inventory variable it came from.
    type: str
    default: recipe
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the recipe of the first served model
  vllm_recipe:
    recipe: nemotron-3-super-120b-a12b-nvfp4
    recipes_dir: "{{ playbook_dir }}/recipes"
    overrides:
      max_model_len: 65536
    label: vllm_server_models[0]
  delegate_to: localhost
  register: model
"""

RETURN = r"""
recipe:
  description: The recipe with the overrides applied.
  returned: success
  type: dict
serve_args:
  description: Arguments after C(vllm serve), model first; C(--host) and C(--port) are left to the caller.
  returned: success
  type: list
  elements: str
  sample: [nvidia/Llama-3.3-70B-Instruct-NVFP4, --revision, 0123…, --served-model-name, llama-3.3-70b]
env:
  description: The container environment the recipe asks for, as text.
  returned: success
  type: dict
problems:
  description: Every problem found; empty on success.
  returned: always
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.recipe_rules import checked_recipe, container_env, serve_args
from ansible.module_utils.vllm_flags import load_flag_list


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "recipe": {"type": "str", "required": True},
            "recipes_dir": {"type": "path", "required": True},
            "overrides": {"type": "dict", "default": {}},
            "flags_file": {"type": "path"},
            "label": {"type": "str", "default": "recipe"},
        },
        supports_check_mode=True,
    )
    params = module.params
    label = params["label"]
    flags_file = params["flags_file"] or str(Path(params["recipes_dir"]) / "vllm-serve-flags.txt")
    try:
        flag_specs = load_flag_list(flags_file)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"{label}: {error}", problems=[str(error)])
    recipe, problems = checked_recipe(params["recipe"], params["recipes_dir"], params["overrides"], flag_specs, label)
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems)
    module.exit_json(
        changed=False,
        recipe=recipe,
        serve_args=serve_args(recipe, flag_specs),
        env=container_env(recipe),
        problems=[],
    )


if __name__ == "__main__":
    main()
