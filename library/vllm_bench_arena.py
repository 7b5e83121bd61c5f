#!/usr/bin/python
"""Ansible module vllm_bench_arena: measure a served model with the Spark Arena's profile and harness
(llama-benchy), so that its figures compare with the leaderboard's."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench_arena
short_description: Run the Spark Arena v2 profile with llama-benchy against an endpoint and read its figures
description:
  - "Runs llama-benchy, the Spark Arena leaderboard's harness, from O(python) (a venv that holds it) against
    O(url): for each context depth of O(depths) and each level of O(concurrency), one llama-benchy process with
    O(prompt_tokens) prompt and O(output_tokens) generated tokens, O(runs) runs, C(--format json). The defaults
    are the Arena's v2 profile (spark-arena/recipe-registry C(benchmarking/spark-arena-v2.yaml)): depths 0 to
    100,000, 2,048 prompt tokens, 128 generated, concurrency 1, 2, 5 and 10, 3 runs, prefix caching on."
  - Prompts are real text, a book (O(book_url), downloaded once into C(~/.cache/llama-benchy)) cut to length
    with the model's own tokenizer (O(tokenizer), a local folder, the model's snapshot).
  - The first pair keeps llama-benchy's warm-up run; the others run without, as the Arena's runner does. The
    coherence test is skipped (the health gate's canaries hold the model's answers). A failed request ends the
    run with llama-benchy's message.
  - Depths whose request would not fit O(max_model_len) are skipped and returned in RV(arena.skipped_depths).
  - The API key reaches llama-benchy through the environment of its process, not its command line.
  - It loads the server; it changes nothing on the host and never reports a change. In check mode nothing is
    measured.
version_added: "0.4.0"
author: sparkfleet
options:
  python:
    description: The interpreter of a venv with llama-benchy installed.
    type: path
    required: true
  url:
    description: Base URL of the endpoint, without C(/v1), e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  served:
    description: The served model name requests address.
    type: str
    required: true
  model:
    description: The model's Hugging Face name, shown in llama-benchy's report.
    type: str
    required: true
  tokenizer:
    description: Local folder (or C(tokenizer.json)) of the model's tokenizer; read offline.
    type: path
    required: true
  api_key:
    description: The endpoint's API key; empty for none.
    type: str
    default: ""
  book_url:
    description: HTTP(S) URL of a plain-text book for the prompts (llama-benchy's default is Project
      Gutenberg's Sherlock Holmes); an air-gapped site points it at its own copy.
    type: str
    default: https://www.gutenberg.org/files/1661/1661-0.txt
  depths:
    description: Context depths in tokens, before the prompt.
    type: list
    elements: int
    default: [0, 4096, 8192, 16384, 32768, 65535, 100000]
  prompt_tokens:
    description: Prompt tokens after the context (llama-benchy C(--pp)).
    type: int
    default: 2048
  output_tokens:
    description: Generated tokens per request (llama-benchy C(--tg)).
    type: int
    default: 128
  concurrency:
    description: Concurrent requests of each measurement.
    type: list
    elements: int
    default: [1, 2, 5, 10]
  runs:
    description: Measured runs per depth and concurrency (their mean is reported).
    type: int
    default: 3
  prefix_caching:
    description: Whether the server caches prefixes (llama-benchy then loads the context first and measures
      the prompt on it, C(--enable-prefix-caching)), as the Arena profile has it.
    type: bool
    default: true
  max_model_len:
    description: The served context; depths that do not fit are skipped. Unset, every depth is run.
    type: int
  timeout_s:
    description: The longest one llama-benchy process may run.
    type: int
    default: 7200
  published:
    description: Published figures to show beside (a recipe's C(published_arena.rows)).
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: The Spark Arena profile against the model this Spark serves
  vllm_bench_arena:
    python: /opt/sparkfleet/llama-benchy/bin/python
    url: http://127.0.0.1:8000
    served: gpt-oss-120b
    model: openai/gpt-oss-120b
    tokenizer: /var/lib/sparkfleet/hf/hub/models--openai--gpt-oss-120b/snapshots/b5c939de8f75
    api_key: "{{ sparkfleet_api_key }}"
  register: arena
"""

RETURN = r"""
arena:
  description: The profile as run, the depths skipped, and one row per depth and concurrency.
  returned: success, not in check mode
  type: dict
  contains:
    profile:
      description: depths, prompt_tokens, output_tokens, concurrency, runs and prefix_caching as run.
      type: dict
    skipped_depths:
      description: Depths left out because depth + prompt + output tokens exceed max_model_len.
      type: list
      elements: int
    rows:
      description: "Per depth and concurrency: prefill_tok_s and decode_tok_s (totals over the concurrent
        requests, the Arena's figures), decode_per_request_tok_s, ttft_ms, context_prefill_tok_s (the context
        load, with prefix caching), published_decode_tok_s and published_prefill_tok_s."
      type: list
      elements: dict
    reports:
      description: Each llama-benchy JSON report as it came, in the order run.
      type: list
      elements: dict
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

from ansible.module_utils.arena_bench import (
    KEY_VARIABLE,
    RUNNER,
    fitting_depths,
    llama_benchy_args,
    missing_figures,
    pairs,
    rows,
    with_published,
)
from ansible.module_utils.basic import AnsibleModule


def input_problems(params: dict) -> list[str]:
    """Values argument_spec cannot check, each with the option's name."""
    problems = []
    for key in ("prompt_tokens", "output_tokens", "runs", "timeout_s"):
        if params[key] < 1:
            problems.append(f"{key}={params[key]}: must be at least 1")
    if not params["depths"] or min(params["depths"]) < 0:
        problems.append(f"depths={params['depths']}: give at least one depth, none below 0")
    if not params["concurrency"] or min(params["concurrency"]) < 1:
        problems.append(f"concurrency={params['concurrency']}: give at least one level, none below 1")
    if not params["book_url"].startswith(("http://", "https://")):
        problems.append(f"book_url={params['book_url']!r}: llama-benchy fetches it with HTTP(S)")
    return problems


def run_pair(module: AnsibleModule, settings: dict, depth: int, level: int, first: bool, folder: Path) -> dict:
    """One llama-benchy process; its JSON report."""
    result_file = folder / f"d{depth}-c{level}.json"
    argv = [module.params["python"], "-c", RUNNER]
    argv += llama_benchy_args(settings, depth, level, first=first, result_file=str(result_file))
    # The tokenizer is a local folder: nothing asks the Hub.
    env = os.environ | {KEY_VARIABLE: module.params["api_key"], "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=module.params["timeout_s"], check=False
        )
    except subprocess.TimeoutExpired:
        module.fail_json(
            msg=f"llama-benchy ran past timeout_s={module.params['timeout_s']} at depth {depth}, concurrency {level}"
        )
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or not result_file.is_file():
        module.fail_json(
            msg=f"llama-benchy failed at depth {depth}, concurrency {level} (exit status {done.returncode}): "
            + said[-1500:]
        )
    report = json.loads(result_file.read_text(encoding="utf-8"))
    problem = missing_figures(rows(report), depth, level)
    if problem:
        module.fail_json(msg=f"{problem}; its output: {said[-1500:]}")
    return report


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "url": {"type": "str", "required": True},
            "served": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "tokenizer": {"type": "path", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "book_url": {"type": "str", "default": "https://www.gutenberg.org/files/1661/1661-0.txt"},
            "depths": {"type": "list", "elements": "int", "default": [0, 4096, 8192, 16384, 32768, 65535, 100000]},
            "prompt_tokens": {"type": "int", "default": 2048},
            "output_tokens": {"type": "int", "default": 128},
            "concurrency": {"type": "list", "elements": "int", "default": [1, 2, 5, 10]},
            "runs": {"type": "int", "default": 3},
            "prefix_caching": {"type": "bool", "default": True},
            "max_model_len": {"type": "int"},
            "timeout_s": {"type": "int", "default": 7200},
            "published": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    problems = input_problems(params)
    if problems:
        module.fail_json(msg="vllm_bench_arena: " + "; ".join(problems))
    kept, skipped = fitting_depths(
        params["depths"], params["prompt_tokens"], params["output_tokens"], params["max_model_len"]
    )
    if not kept:
        module.fail_json(
            msg=f"vllm_bench_arena: no depth of {params['depths']} fits max_model_len={params['max_model_len']} "
            f"with {params['prompt_tokens']} prompt and {params['output_tokens']} generated tokens"
        )
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: nothing measured (a benchmark loads the server)")
    settings = {
        "base_url": params["url"].rstrip("/") + "/v1",
        **{key: params[key] for key in ("model", "served", "tokenizer", "book_url", "prompt_tokens")},
        **{key: params[key] for key in ("output_tokens", "runs", "prefix_caching")},
    }
    reports = []
    with tempfile.TemporaryDirectory(prefix="sparkfleet-arena-") as folder:
        for index, (depth, level) in enumerate(pairs(kept, params["concurrency"])):
            reports.append(run_pair(module, settings, depth, level, index == 0, Path(folder)))
    found = with_published([row for report in reports for row in rows(report)], params["published"])
    profile = {key: params[key] for key in ("prompt_tokens", "output_tokens", "concurrency", "runs", "prefix_caching")}
    arena = {"profile": {"depths": kept, **profile}, "skipped_depths": skipped, "rows": found, "reports": reports}
    module.exit_json(
        changed=False,
        arena=arena,
        msg=f"measured {params['served']} at {len(kept)} depths x {len(params['concurrency'])} concurrency levels "
        f"with llama-benchy",
    )


if __name__ == "__main__":
    main()
