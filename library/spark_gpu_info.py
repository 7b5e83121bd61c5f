#!/usr/bin/python
"""Ansible module spark_gpu_info: verify that a host has the DGX Spark's GPU and report its unified memory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spark_gpu_info
short_description: Verify the NVIDIA GPU of a DGX Spark (GB10, sm_121) and report unified memory
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) and returns, per GPU, its index, name,
    compute capability, driver version, UUID and total memory (null where the driver prints C([N/A]), as a GB10
    does for every memory field).
  - Reads the host's unified-memory figures from C(/proc/meminfo); on a Spark the CPU and GPU share one pool,
    so this is the memory vLLM competes for.
  - Fails, naming what it found and what was expected, when nvidia-smi is missing, the driver does not answer,
    no GPU is listed, a GPU's compute capability differs from O(required_compute_capability), or the driver is
    older than O(min_driver_version).
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  required_compute_capability:
    description:
      - Compute capability every GPU must have. V(12.1) is the GB10 (sm_121) of a DGX Spark.
    type: str
    default: "12.1"
  min_driver_version:
    description:
      - Oldest acceptable NVIDIA driver version, compared numerically part by part.
      - The default is the first 580-series driver DGX OS 7 shipped for the Spark.
    type: str
    default: "580.95.05"
  nvidia_smi:
    description:
      - Name or absolute path of the nvidia-smi binary. A bare name is looked up on the PATH.
    type: str
    default: nvidia-smi
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - C(--query-gpu=compute_cap) needs a driver of the 510 series or newer; older drivers fail with a clear message.
"""

EXAMPLES = r"""
- name: Verify the GB10 GPU and the driver
  spark_gpu_info:
  register: spark_gpu_info_result

- name: Accept an older driver on a lab Spark
  spark_gpu_info:
    min_driver_version: "580.0"

- name: Show unified memory
  ansible.builtin.debug:
    msg: "{{ (spark_gpu_info_result.memory.mem_total_bytes / 1024**3) | round(1) }} GiB"
"""

RETURN = r"""
gpus:
  description: One entry per GPU nvidia-smi listed.
  returned: when nvidia-smi answered
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA GB10
      compute_capability: "12.1"
      driver_version: 580.95.05
      uuid: GPU-5c3ad9f2-8e1b-4f7a-9d2c-1b6e0f4a7c31
      memory_total_mib: null
gpu_count:
  description: Number of GPUs listed.
  returned: when nvidia-smi answered
  type: int
  sample: 1
memory:
  description: Unified-memory figures of the host from /proc/meminfo, in bytes.
  returned: always
  type: dict
  sample:
    mem_total_bytes: 130663833600
    mem_available_bytes: 126482350080
    swap_total_bytes: 0
    swap_free_bytes: 0
nvidia_smi_path:
  description: The nvidia-smi binary that was run.
  returned: when found
  type: str
  sample: /usr/bin/nvidia-smi
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.spark_gpu import (
    MEMINFO,
    GpuQueryError,
    describe_capability,
    explain_failure,
    find_problems,
    parse_query_output,
    query_argv,
    read_meminfo,
    version_tuple,
)


def read_memory(module: AnsibleModule) -> dict:
    try:
        return read_meminfo()
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"Could not read the host's memory figures from {MEMINFO}: {error}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "required_compute_capability": {"type": "str", "default": "12.1"},
            "min_driver_version": {"type": "str", "default": "580.95.05"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        version_tuple(params["min_driver_version"])
    except ValueError:
        module.fail_json(
            msg=f"min_driver_version={params['min_driver_version']!r} is not a driver version; use dotted numbers "
            "such as '580.95.05'."
        )
    expected = (
        f"expected an NVIDIA GPU with {describe_capability(params['required_compute_capability'])} "
        f"and driver {params['min_driver_version']} or newer"
    )
    result = {"changed": False, "memory": read_memory(module)}

    nvidia_smi = module.get_bin_path(params["nvidia_smi"])
    if nvidia_smi is None:
        module.fail_json(
            msg=f"nvidia-smi was not found (looked for {params['nvidia_smi']!r} on the PATH), so no NVIDIA driver is "
            f"installed; {expected}. On a DGX Spark, restore DGX OS's NVIDIA driver packages; sparkfleet serves "
            "only on DGX Spark hardware.",
            **result,
        )
    result["nvidia_smi_path"] = nvidia_smi

    rc, stdout, stderr = module.run_command(query_argv(nvidia_smi))
    if rc != 0:
        module.fail_json(
            msg=f"The NVIDIA driver did not answer: {explain_failure(rc, stdout, stderr)}; {expected}.", **result
        )
    try:
        gpus = parse_query_output(stdout)
    except GpuQueryError as error:
        module.fail_json(msg=f"{error}; {expected}.", **result)
    result.update(gpus=gpus, gpu_count=len(gpus))

    problems = find_problems(gpus, params["required_compute_capability"], params["min_driver_version"])
    if problems:
        module.fail_json(msg="; ".join(problems) + ".", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
