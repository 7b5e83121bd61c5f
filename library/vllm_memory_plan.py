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
  - With O(tensor_parallel_size) N in the recipe each of N Sparks holds 1/N of the weights and of the KV heads;
    every figure is per node.
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  recipe:
    description:
      - A recipe name, read from V(<recipes_dir>/<name>.yml), or a mapping with the keys of a recipe file.
      - The planner reads C(gpu_memory_utilization), C(max_model_len), C(max_num_seqs), C(kv_cache_dtype),
        C(tensor_parallel_size), C(env.VLLM_ALLOW_LONG_MAX_MODEL_LEN), C(architecture.*) and
        C(measured.decode_tok_s).
    type: raw
    required: true
  recipes_dir:
    description: Directory of the recipe files; required when O(recipe) is a name.
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
    description: Highest gpu_memory_utilization allowed on a Spark.
    type: float
    default: 0.90
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
    description: Label for messages, normally the inventory variable the recipe came from (e.g.
      V(vllm_server_models[0])), so that refusals name what to change.
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
  description: Whether the flags fit the node's memory safely.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why the flags do not fit, each naming a variable and a value that would work; empty when they fit.
  returned: always
  type: list
  elements: str
  sample: []
summary:
  description: One human line with the plan's figures.
  returned: always
  type: str
weights_gib:
  description: Weight memory on each node, in GiB.
  returned: always
  type: float
  sample: 74.51
kv_bytes_per_token:
  description: KV cache bytes per token on each node.
  returned: always
  type: int
  sample: 8192
kv_capacity_tokens:
  description: Tokens the KV cache holds on each node.
  returned: always
  type: int
  sample: 3530123
max_full_length_seqs:
  description: How many max_model_len sequences the KV cache holds at once.
  returned: always
  type: int
  sample: 26
os_reserve_gib:
  description: Memory left outside vLLM's share, in GiB.
  returned: always
  type: float
  sample: 18.25
decode_bound_tok_s:
  description: Upper bound on decode tokens/s for one sequence (bandwidth / active weight bytes per node).
  returned: always
  type: float
  sample: 40.4
measured_decode_tok_s:
  description: The recipe's published decode tokens/s, or null.
  returned: always
  type: float
  sample: 23.2
pool_gib:
  description: vLLM's share of the node's memory (MemTotal x gpu_memory_utilization), in GiB.
  returned: always
  type: float
  sample: 103.44
kv_cache_gib:
  description: What is left of vLLM's share for the KV cache, in GiB.
  returned: always
  type: float
  sample: 26.93
memory_total_gib:
  description: The node's memory, in GiB.
  returned: always
  type: float
  sample: 121.69
tensor_parallel_size:
  description: Number of nodes that share the model.
  returned: always
  type: int
  sample: 1
gpu_memory_utilization:
  description: The utilization planned (the recipe's, or its override).
  returned: always
  type: float
  sample: 0.85
max_model_len:
  description: The context length planned.
  returned: always
  type: int
  sample: 131072
max_num_seqs:
  description: The concurrency planned.
  returned: always
  type: int
  sample: 4
kv_cache_dtype:
  description: The KV cache dtype planned, as vLLM's flag takes it.
  returned: always
  type: str
  sample: auto
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.spark_gpu_info import parse_meminfo
from ansible.module_utils.vllm_memory_plan import (
    OVERRIDABLE,
    as_dict,
    build_inputs,
    load_recipe,
    plan,
    unplanned_dict,
)

MEMINFO = "/proc/meminfo"


def read_mem_total(module: AnsibleModule) -> int:
    try:
        with open(MEMINFO, encoding="ascii") as handle:
            return parse_meminfo(handle.read())["mem_total_bytes"]
    except (OSError, ValueError) as error:
        module.fail_json(
            msg=f"Could not read MemTotal from {MEMINFO}: {error}; pass memory_total_bytes.",
            **unplanned_dict([]),
        )


def fail_unplanned(module: AnsibleModule, problems: list[str]) -> None:
    module.fail_json(msg=". ".join(problems) + ".", **unplanned_dict(problems))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "recipe": {"type": "raw", "required": True},
            "recipes_dir": {"type": "path"},
            "gpu_memory_utilization": {"type": "float"},
            "max_model_len": {"type": "int"},
            "max_num_seqs": {"type": "int"},
            "kv_cache_dtype": {"type": "str"},
            "memory_total_bytes": {"type": "int"},
            "overhead_gib": {"type": "float", "default": 2.0},
            "os_reserve_min_gib": {"type": "float", "default": 8.0},
            "max_gpu_memory_utilization": {"type": "float", "default": 0.90},
            "bandwidth_gb_s": {"type": "float", "default": 273.0},
            "i_accept_freeze_risk": {"type": "bool", "default": False},
            "name": {"type": "str", "default": "recipe"},
        },
        supports_check_mode=True,
    )
    params = module.params
    recipe, problems = load_recipe(params["recipe"], params["recipes_dir"], params["name"])
    if problems:
        fail_unplanned(module, problems)
    memory_total = params["memory_total_bytes"]
    if memory_total is None:
        memory_total = read_mem_total(module)
    inputs, problems = build_inputs(
        recipe,
        {key: params[key] for key in OVERRIDABLE},
        memory_total_bytes=memory_total,
        name=params["name"],
        overhead_gib=params["overhead_gib"],
        os_reserve_min_gib=params["os_reserve_min_gib"],
        max_gpu_memory_utilization=params["max_gpu_memory_utilization"],
        bandwidth_gb_s=params["bandwidth_gb_s"],
    )
    if problems:
        fail_unplanned(module, problems)
    result = as_dict(plan(inputs))
    if not result["fits"]:
        message = ". ".join(result["reasons"]) + "."
        if not params["i_accept_freeze_risk"]:
            module.fail_json(msg=message, changed=False, **result)
        module.warn(
            f"i_accept_freeze_risk is set, so this plan is returned although it does not fit: the DGX Spark may "
            f"run out of unified memory and freeze until power-cycled. {message}"
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
