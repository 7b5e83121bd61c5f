#!/usr/bin/python
"""Ansible module vllm_memory_plan: will a vLLM recipe fit a DGX Spark's unified memory? Refuse it if not."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_memory_plan
short_description: Plan a vLLM recipe's use of a DGX Spark's unified memory, and refuse flags that could freeze it
description:
  - On a DGX Spark the GPU shares one 128 GB LPDDR5X pool with the CPU, so C(--gpu-memory-utilization) is a fraction
    of the memory the OS, Docker and the page cache also need. When the pool runs out the whole machine can freeze
    and need a power cycle, and a hung box cannot report it.
  - Computes, per node, the weights, the KV cache bytes per token and the tokens the KV cache holds, the memory left
    for the OS, and the bandwidth bound on decode speed, from a recipe (see recipes/README.md) and any overrides.
  - Fails, naming the variable (see O(name)) and a value that would work, when the weights and overhead do not fit
    vLLM's share, when the KV cache cannot hold one O(max_model_len) sequence, when the utilization is above
    O(max_gpu_memory_utilization) or leaves less than O(os_reserve_min_gib), and for nonsense input (every problem
    at once). O(i_accept_freeze_risk) turns the memory refusals (not the nonsense ones) into a warning.
  - The recipe, with the overrides laid over it, is checked by the recipe rules for the keys the planner reads
    (C(plan_problems) in module_utils/recipe_rules.py, the same rules a recipe file meets), not by rules of its own.
  - With O(tensor_parallel_size) N in the recipe each of N Sparks holds 1/N of the weights and of the KV heads;
    every figure is per node.
  - With O(models), plans every model of the host in one call. C(--gpu-memory-utilization) is per vLLM instance,
    so the models' shares add up; besides each model's own plan, the sum of their utilizations must stay within
    O(max_gpu_memory_utilization) and leave O(os_reserve_min_gib). A refusal names every model with its
    utilization and says which value to lower to what.
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  recipe:
    description:
      - A recipe name, read from V(<recipes_dir>/<name>.yml), or a mapping with the keys of a recipe file.
      - The planner reads C(gpu_memory_utilization), C(max_model_len), C(max_num_seqs), C(kv_cache_dtype),
        C(tensor_parallel_size), C(env.VLLM_ALLOW_LONG_MAX_MODEL_LEN), C(architecture.*),
        C(serve_flags.max-num-batched-tokens), C(serve_flags.async-scheduling) and C(measured.decode_tok_s).
      - Exactly one of O(recipe) and O(models) is required.
    type: raw
  models:
    description:
      - Every model this host serves, planned together; RV(results) holds their plans in the same order.
      - The overrides O(gpu_memory_utilization), O(max_model_len), O(max_num_seqs) and O(kv_cache_dtype) of the
        top level apply to O(recipe) only; give them per entry here.
    type: list
    elements: dict
    suboptions:
      recipe:
        description: A recipe name or a mapping of recipe keys, as O(recipe).
        type: raw
        required: true
      name:
        description: Label for messages; default V(<name>[<index>]), e.g. V(vllm_server_models[1]).
        type: str
      gpu_memory_utilization:
        description: Overrides the recipe's fraction of the shared memory pool.
        type: float
      max_model_len:
        description: Overrides the recipe's longest context, in tokens.
        type: int
      max_num_seqs:
        description: Overrides the recipe's number of concurrent sequences.
        type: int
      kv_cache_dtype:
        description: Overrides the recipe's KV cache dtype.
        type: str
  recipes_dir:
    description: Directory of the recipe files; required when a recipe is given by name.
    type: path
  gpu_memory_utilization:
    description: Overrides the recipe's fraction of the shared memory pool that vLLM may take.
    type: float
  max_model_len:
    description: Overrides the recipe's longest context, in tokens.
    type: int
  max_num_seqs:
    description: Overrides the recipe's number of concurrent sequences.
    type: int
  kv_cache_dtype:
    description: Overrides the recipe's KV cache dtype (V(auto) means the model's dtype).
    type: str
  memory_total_bytes:
    description: The host's memory, in bytes. Default is MemTotal from /proc/meminfo of the host the module runs on.
    type: int
  overhead_gib:
    description: Memory inside vLLM's share that is neither weights nor KV cache (CUDA context, activation peak,
      CUDA graphs), in GiB.
    type: float
    default: 2.0
  os_reserve_min_gib:
    description: Least memory left outside vLLM's share for the OS, Docker and the page cache, in GiB.
    type: float
    default: 8.0
  max_gpu_memory_utilization:
    description:
      - Highest gpu_memory_utilization allowed on a Spark, for one model and for the sum of a host's models.
      - The default, the top of the community's 0.80-0.87 guard, leaves 15.8 GiB of a Spark's 121.7 GiB to the
        OS, Docker and vLLM's own host-side memory; vLLM starts only with utilization x total free (vllm#48140).
    type: float
    default: 0.87
  bandwidth_gb_s:
    description: Memory bandwidth in GB/s, for the decode-speed bound (a Spark's LPDDR5X gives 273).
    type: float
    default: 273.0
  i_accept_freeze_risk:
    description:
      - Return a plan that does not fit instead of failing, with a warning. The Spark may freeze when it runs.
      - Nonsense input fails regardless.
    type: bool
    default: false
  name:
    description:
      - Label for messages, normally the inventory variable the recipe came from (e.g. V(vllm_server_models[0])),
        so that refusals name what to change.
      - With O(models), the variable that lists them (e.g. V(vllm_server_models)); entry i is labelled V(<name>[i]).
    type: str
    default: recipe
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - vLLM schedules by active context, so O(max_num_seqs) above RV(max_full_length_seqs) is not refused; the summary
    says so.
  - O(max_model_len) above C(architecture.max_context) is refused unless the recipe's C(env) sets
    C(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), as vLLM itself does.
"""

EXAMPLES = r"""
- name: Plan every model of the host together (their shares of the pool add up)
  vllm_memory_plan:
    models:
      - recipe: nemotron-3-super-120b-a12b-nvfp4
      - recipe: qwen3.6-35b-a3b-nvfp4
        max_model_len: 65536
    recipes_dir: "{{ playbook_dir }}/../recipes"
    name: vllm_server_models
  register: memory_plans
  # memory_plans.results[1].summary is the plan of vllm_server_models[1]

- name: Plan the model's memory before (re)starting vLLM
  vllm_memory_plan:
    recipe: nemotron-3-super-120b-a12b-nvfp4
    recipes_dir: "{{ playbook_dir }}/../recipes"
    max_model_len: 65536
    name: vllm_server_models[0]
  register: memory_plan

- name: Plan a recipe given inline, on a host whose memory is known
  vllm_memory_plan:
    recipe: "{{ lookup('ansible.builtin.file', 'recipes/llama-3.3-70b-instruct-nvfp4.yml') | from_yaml }}"
    memory_total_bytes: 130663833600
  delegate_to: localhost

- name: Run a plan that does not fit anyway (the Spark may freeze)
  vllm_memory_plan:
    recipe: my-experiment
    recipes_dir: /opt/sparkfleet/recipes
    gpu_memory_utilization: 0.95
    i_accept_freeze_risk: true
"""

RETURN = r"""
fits:
  description: Whether the flags fit the node's memory safely (with O(models), every model and their sum).
  returned: always
  type: bool
  sample: true
reasons:
  description:
    - Why the flags do not fit, each naming a variable and a value that would work; empty when they fit.
    - With O(models), every model's reasons, then the reason their sum does not fit.
  returned: always
  type: list
  elements: str
  sample: []
summary:
  description: One human line with the plan's figures (with O(models), the host's sum).
  returned: always
  type: str
results:
  description:
    - One plan per entry of O(models), in their order, each with the keys returned for O(recipe) (RV(fits),
      RV(reasons) and RV(summary) of that model alone) and its C(name).
    - The shape a looped task registers, so C(register.results[i]) reads the plan of entry i.
  returned: when O(models) is given
  type: list
  elements: dict
gpu_memory_utilization_total:
  description: The sum of the models' gpu_memory_utilization.
  returned: when O(models) is given
  type: float
  sample: 0.85
weights_gib:
  description: Weight memory on each node, in GiB.
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 74.51
kv_bytes_per_token:
  description: KV cache bytes per token on each node, over the full-attention layers (the KV rules of
    module_utils/model_config_figures.py, the ones hf_model_figures measures with).
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 8192
kv_bytes_per_sequence:
  description:
    - KV cache bytes one max_model_len sequence takes on each node, in vLLM 0.33's blocks (module_utils/
      kv_cache_pages.py) - its full-attention tokens, its sliding-window layers' window and in-flight tokens, and a
      hybrid model's Mamba states (each padded to one attention page, 3 per layer with prefix caching).
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 1073741824
kv_capacity_tokens:
  description:
    - vLLM's "KV cache size" in tokens as its start log prints it - RV(max_concurrency) x max_model_len, not the
      longest single sequence (that is RV(longest_sequence_tokens)).
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 3530123
max_full_length_seqs:
  description: How many max_model_len sequences the KV cache holds at once (its blocks, less vLLM's null block).
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 26
max_concurrency:
  description: vLLM's logged "Maximum concurrency for max_model_len tokens per request" (blocks / blocks per request).
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 26.93
longest_sequence_tokens:
  description: The longest single sequence the KV cache admits, at most max_model_len.
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 131072
block_size:
  description: vLLM's KV cache block size in tokens (16; a hybrid model's is raised until a page holds a Mamba state).
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 16
os_reserve_gib:
  description: Memory left outside vLLM's share (with O(models), outside all of them), in GiB.
  returned: always
  type: float
  sample: 18.25
decode_bound_tok_s:
  description: Upper bound on decode tokens/s for one sequence (bandwidth / active weight bytes per node).
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 40.4
measured_decode_tok_s:
  description: The recipe's published decode tokens/s, or null.
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 23.2
pool_gib:
  description: vLLM's share of the node's memory (ceil(MemTotal x gpu_memory_utilization)), in GiB.
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 103.44
kv_cache_gib:
  description:
    - The KV budget as vLLM computes it - its share less the non-KV memory (the weights and O(overhead_gib), an
      estimate of the activation peak and CUDA-graph memory vLLM measures at start), in GiB.
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 26.93
memory_total_gib:
  description: The node's memory, in GiB.
  returned: always
  type: float
  sample: 121.69
tensor_parallel_size:
  description: Number of nodes that share the model.
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 1
gpu_memory_utilization:
  description: The utilization planned (the recipe's, or its override).
  returned: when O(recipe) is given (per model in RV(results))
  type: float
  sample: 0.85
max_model_len:
  description: The context length planned.
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 131072
max_num_seqs:
  description: The concurrency planned.
  returned: when O(recipe) is given (per model in RV(results))
  type: int
  sample: 4
kv_cache_dtype:
  description: The KV cache dtype planned, as vLLM's flag takes it.
  returned: when O(recipe) is given (per model in RV(results))
  type: str
  sample: auto
prefix_caching:
  description: Whether the server caches prefixes (vLLM's default; off with C(enable-prefix-caching) false).
  returned: when O(recipe) is given (per model in RV(results))
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.memory_plan import (
    DEFAULT_MAX_GPU_MEMORY_UTILIZATION,
    OVERRIDABLE,
    as_dict,
    build_inputs,
    host_plan,
    plan,
    unplanned_dict,
)
from ansible.module_utils.recipe_rules import read_recipe
from ansible.module_utils.spark_gpu import MEMINFO, read_meminfo


def read_mem_total(module: AnsibleModule) -> int:
    try:
        return read_meminfo()["mem_total_bytes"]
    except (OSError, ValueError) as error:
        module.fail_json(
            msg=f"Could not read MemTotal from {MEMINFO}: {error}; pass memory_total_bytes.",
            **unplanned_dict([]),
        )


def fail_unplanned(module: AnsibleModule, problems: list[str], **extra: object) -> None:
    result = unplanned_dict(problems)
    result.update(extra)
    module.fail_json(msg=". ".join(problems) + ".", **result)


def settings(params: dict) -> dict:
    """The planner settings shared by every model."""
    return {
        "overhead_gib": params["overhead_gib"],
        "os_reserve_min_gib": params["os_reserve_min_gib"],
        "max_gpu_memory_utilization": params["max_gpu_memory_utilization"],
        "bandwidth_gb_s": params["bandwidth_gb_s"],
    }


def recipe_name(recipe: object) -> str | None:
    """The recipe's own name, for messages: the file name it was given by, or its `name` key."""
    if isinstance(recipe, str):
        return recipe
    name = recipe.get("name") if isinstance(recipe, dict) else None
    return name if isinstance(name, str) else None


def finish(module: AnsibleModule, result: dict) -> None:
    """Fail a plan that does not fit, or return it with a warning when the freeze risk is accepted."""
    if not result["fits"]:
        message = ". ".join(result["reasons"]) + "."
        if not module.params["i_accept_freeze_risk"]:
            module.fail_json(msg=message, changed=False, **result)
        module.warn(
            f"i_accept_freeze_risk is set, so this plan is returned although it does not fit: the DGX Spark may "
            f"run out of unified memory and freeze until power-cycled. {message}"
        )
    module.exit_json(changed=False, **result)


def plan_one(module: AnsibleModule, memory_total: int) -> None:
    params = module.params
    recipe, problems = read_recipe(params["recipe"], params["recipes_dir"], params["name"])
    if problems:
        fail_unplanned(module, problems)
    inputs, problems = build_inputs(
        recipe,
        {key: params[key] for key in OVERRIDABLE},
        memory_total_bytes=memory_total,
        name=params["name"],
        **settings(params),
    )
    if problems:
        fail_unplanned(module, problems)
    finish(module, as_dict(plan(inputs)))


def plan_host(module: AnsibleModule, memory_total: int) -> None:
    """Every model of the host: each one's own plan, then the sum of their shares (module_utils' host_plan)."""
    params = module.params
    entries, names, problems = [], [], []
    for index, entry in enumerate(params["models"]):
        label = entry["name"] or f"{params['name']}[{index}]"
        recipe, found = read_recipe(entry["recipe"], params["recipes_dir"], label)
        if found:
            problems += found
            continue
        recipe.update({key: entry[key] for key in OVERRIDABLE if entry[key] is not None})
        entries.append((label, recipe))
        names.append(recipe_name(entry["recipe"]) or recipe_name(recipe))
    if problems:
        fail_unplanned(module, problems, results=[{**unplanned_dict(problems)}])
    result, problems = host_plan(entries, memory_total_bytes=memory_total, settings=settings(params), names=names)
    if problems:
        fail_unplanned(module, problems, results=result["results"])
    finish(module, result)


def main() -> None:
    overrides = {
        "gpu_memory_utilization": {"type": "float"},
        "max_model_len": {"type": "int"},
        "max_num_seqs": {"type": "int"},
        "kv_cache_dtype": {"type": "str"},
    }
    module = AnsibleModule(
        argument_spec={
            "recipe": {"type": "raw"},
            "models": {
                "type": "list",
                "elements": "dict",
                "options": {"recipe": {"type": "raw", "required": True}, "name": {"type": "str"}, **overrides},
            },
            "recipes_dir": {"type": "path"},
            **overrides,
            "memory_total_bytes": {"type": "int"},
            "overhead_gib": {"type": "float", "default": 2.0},
            "os_reserve_min_gib": {"type": "float", "default": 8.0},
            "max_gpu_memory_utilization": {"type": "float", "default": DEFAULT_MAX_GPU_MEMORY_UTILIZATION},
            "bandwidth_gb_s": {"type": "float", "default": 273.0},
            "i_accept_freeze_risk": {"type": "bool", "default": False},
            "name": {"type": "str", "default": "recipe"},
        },
        required_one_of=[("recipe", "models")],
        mutually_exclusive=[("recipe", "models")],
        supports_check_mode=True,
    )
    memory_total = module.params["memory_total_bytes"]
    if memory_total is None:
        memory_total = read_mem_total(module)
    if module.params["models"] is not None:
        plan_host(module, memory_total)
    plan_one(module, memory_total)


if __name__ == "__main__":
    main()
