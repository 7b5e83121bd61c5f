#!/usr/bin/python
"""Ansible module vllm_bench: measure a served model the way the vLLM blog's Spark evaluation did, and sweep
concurrency to find where latency turns up."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Measure TTFT, prefill and decode speed of an OpenAI-compatible vLLM endpoint, and sweep concurrency
description:
  - Runs the vLLM blog's local evaluation against O(url) (by default its five scenarios, from a 58-token judge
    call to a 7,234-token prompt with 124 generated tokens), each as O(warmup) unmeasured requests and the
    median of O(runs) measured ones, streamed, with token counts from C(stream_options.include_usage).
  - Prompts have an exact token count. The server's C(/tokenize) turns a filler text into token ids and each
    request sends exactly that many ids to C(/v1/completions); the first ids differ in every request, so vLLM's
    prefix cache cannot turn a prefill measurement into a cache hit. Outputs are exact too (C(max_tokens) with
    C(ignore_eos)). The module fails when the server's usage counts differ from what was sent.
  - With O(sweep_max_concurrency) or O(sweep_levels), it also keeps C requests in flight at each level and
    reports aggregate output tok/s, per-request decode tok/s, TTFT, inter-token and end-to-end latency
    percentiles, failures and the knee (the rule is returned as RV(sweep.knee_rule)).
  - Each row shows the O(published) figures of the same scenario and the bandwidth bound on decode
    (O(bandwidth_gbps) / (O(active_params_b) x O(bytes_per_param))) when those are given.
  - Standard library only, so it runs on a Spark as well as on the controller. It loads the server; it changes
    nothing on the host and never reports a change. In check mode nothing is measured.
version_added: "0.1.0"
author: sparkfleet
options:
  url:
    description: Base URL of the endpoint, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: The served model name (as C(/v1/models) lists it).
    type: str
    required: true
  api_key:
    description: The server's C(--api-key), sent as a bearer token; empty for none.
    type: str
    default: ""
  scenarios:
    description: Scenarios to measure; the default is the blog's five. An empty list measures none.
    type: list
    elements: dict
    suboptions:
      name:
        description: The scenario's name, matched against O(published).
        type: str
        required: true
      prompt_tokens:
        description: Exact prompt length in tokens.
        type: int
        required: true
      output_tokens:
        description: Exact number of generated tokens.
        type: int
        required: true
  runs:
    description: Measured requests per scenario; the figures are their medians.
    type: int
    default: 3
  warmup:
    description: Unmeasured requests before each scenario (the first request after a start pays JIT costs).
    type: int
    default: 1
  sweep_max_concurrency:
    description: Sweep concurrency levels 1, 2, 4, ... up to this; 0 for no sweep (unless O(sweep_levels)).
    type: int
    default: 0
  sweep_levels:
    description: Explicit concurrency levels, ascending; overrides O(sweep_max_concurrency).
    type: list
    elements: int
    default: []
  sweep_requests_per_level:
    description: Requests sent at each level; at least twice the level is always sent.
    type: int
    default: 0
  sweep_prompt_tokens:
    description: Prompt length of every sweep request.
    type: int
    default: 1834
  sweep_output_tokens:
    description: Generated tokens of every sweep request.
    type: int
    default: 108
  timeout_s:
    description: Seconds any one connect or read may wait.
    type: float
    default: 300
  bandwidth_gbps:
    description: Memory bandwidth in GB/s for the decode bound (a DGX Spark's LPDDR5X is 273).
    type: float
    default: 273
  active_params_b:
    description: Parameters read per decoded token, in billions (a recipe's C(architecture.active_params_b)).
    type: float
  bytes_per_param:
    description: Weight bytes per active parameter (a recipe's C(architecture.bytes_per_param)).
    type: float
  published:
    description: Published figures to compare with (a recipe's C(published_eval.rows)).
    type: list
    elements: dict
    default: []
  seed:
    description:
      - Seed of the prompts' fresh first ids (same seed, same prompts); returned as RV(measurements.seed).
      - Unset, a fresh one each run, so a rerun cannot hit the prefix cache the previous run left behind.
    type: int
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Measure the blog's five scenarios and sweep up to 8 concurrent requests
  vllm_bench:
    url: http://127.0.0.1:8000
    model: nemotron-3-super
    api_key: "{{ vllm_server_api_key }}"
    active_params_b: "{{ recipe.architecture.active_params_b }}"
    bytes_per_param: "{{ recipe.architecture.bytes_per_param }}"
    published: "{{ recipe.published_eval.rows }}"
    sweep_max_concurrency: 8
  register: bench

- name: Write results.json, results.csv and sweep.png on the controller
  vllm_bench_report:
    measurements: "{{ bench.measurements }}"
    dest: "reports/{{ inventory_hostname }}"
  delegate_to: localhost
"""

RETURN = r"""
measurements:
  description:
    - Everything measured, JSON-serialisable; C(scenarios) and C(sweep.levels) are flat rows (one CSV row each).
    - Scenario rows have scenario, prompt_tokens, output_tokens, runs, ttft_s, total_s, prefill_tok_s,
      decode_tok_s, itl_p50_s, published_ttft_s, published_total_s, published_prefill_tok_s,
      published_decode_tok_s, decode_vs_published, decode_bound_tok_s, decode_of_bound, and with speculative
      decoding spec_acceptance_rate and spec_accepted_length from vLLM's spec_decode counters over the measured
      runs (null where unknown).
    - Sweep rows have concurrency, requests, failures, wall_s, output_tok_s, request_decode_tok_s_p50,
      ttft_p50_s, ttft_p95_s, ttft_p99_s, itl_p50_s, itl_p95_s, itl_p99_s, e2e_p50_s, e2e_p95_s, first_error.
  returned: success, not in check mode
  type: dict
  contains:
    scenarios:
      description: One row per scenario.
      type: list
      elements: dict
    sweep:
      description: Null without a sweep; else prompt_tokens, output_tokens, levels (rows), knee and knee_rule.
      type: dict
    decode_bound_tok_s:
      description: The bandwidth bound on decode, or null without O(active_params_b) and O(bytes_per_param).
      type: float
msg:
  description: One line on what was measured, or why nothing was.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.openai_bench import (
    BenchError,
    BenchSettings,
    Endpoint,
    Scenario,
    default_scenarios,
    run_bench,
    sweep_levels,
)

SCENARIO_SPEC = {
    "name": {"type": "str", "required": True},
    "prompt_tokens": {"type": "int", "required": True},
    "output_tokens": {"type": "int", "required": True},
}


def input_problems(params: dict) -> list[str]:
    """Values argument_spec cannot check: ranges and orders, each with the option's name."""
    problems = []
    for key in ("runs", "sweep_prompt_tokens", "sweep_output_tokens"):
        if params[key] < 1:
            problems.append(f"{key}={params[key]}: must be at least 1")
    for key in ("warmup", "sweep_max_concurrency", "sweep_requests_per_level"):
        if params[key] < 0:
            problems.append(f"{key}={params[key]}: must be 0 or more")
    for key in ("timeout_s", "bandwidth_gbps"):
        if params[key] <= 0:
            problems.append(f"{key}={params[key]}: must be positive")
    levels = params["sweep_levels"]
    if levels and (min(levels) < 1 or levels != sorted(set(levels))):
        problems.append(f"sweep_levels={levels}: must be distinct positive integers in ascending order")
    for index, scenario in enumerate(params["scenarios"] or []):
        if scenario["prompt_tokens"] < 1 or scenario["output_tokens"] < 1:
            problems.append(f"scenarios[{index}] ({scenario['name']}): prompt_tokens and output_tokens must be >= 1")
    return problems


def settings_from(params: dict) -> BenchSettings:
    scenarios = params["scenarios"]
    levels = params["sweep_levels"] or (
        sweep_levels(params["sweep_max_concurrency"]) if params["sweep_max_concurrency"] else []
    )
    return BenchSettings(
        scenarios=default_scenarios()
        if scenarios is None
        else [Scenario(s["name"], s["prompt_tokens"], s["output_tokens"]) for s in scenarios],
        runs=params["runs"],
        warmup=params["warmup"],
        published=params["published"],
        bandwidth_gbps=params["bandwidth_gbps"],
        active_params_b=params["active_params_b"],
        bytes_per_param=params["bytes_per_param"],
        sweep_levels=levels,
        sweep_requests_per_level=params["sweep_requests_per_level"],
        sweep_prompt_tokens=params["sweep_prompt_tokens"],
        sweep_output_tokens=params["sweep_output_tokens"],
        seed=params["seed"],
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "scenarios": {"type": "list", "elements": "dict", "options": SCENARIO_SPEC},
            "runs": {"type": "int", "default": 3},
            "warmup": {"type": "int", "default": 1},
            "sweep_max_concurrency": {"type": "int", "default": 0},
            "sweep_levels": {"type": "list", "elements": "int", "default": []},
            "sweep_requests_per_level": {"type": "int", "default": 0},
            "sweep_prompt_tokens": {"type": "int", "default": 1834},
            "sweep_output_tokens": {"type": "int", "default": 108},
            "timeout_s": {"type": "float", "default": 300},
            "bandwidth_gbps": {"type": "float", "default": 273},
            "active_params_b": {"type": "float"},
            "bytes_per_param": {"type": "float"},
            "published": {"type": "list", "elements": "dict", "default": []},
            "seed": {"type": "int"},
        },
        supports_check_mode=True,
    )
    params = module.params
    problems = input_problems(params)
    if problems:
        module.fail_json(msg="vllm_bench: " + "; ".join(problems))
    settings = settings_from(params)
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: nothing measured (a benchmark loads the server)")
    endpoint = Endpoint(params["url"], params["model"], params["api_key"], params["timeout_s"])
    try:
        results = run_bench(endpoint, settings)
    except BenchError as error:
        module.fail_json(msg=str(error))
    knee = (results["sweep"] or {}).get("knee")
    summary = f"measured {len(results['scenarios'])} scenarios of {params['model']} at {endpoint.base}"
    if results["sweep"]:
        summary += f"; swept {settings.sweep_levels}, knee at {knee['concurrency'] if knee else 'none found'}"
    # "measurements", not "results": Ansible reserves a module's "results" key for loops.
    module.exit_json(changed=False, measurements=results, msg=summary)


if __name__ == "__main__":
    main()
