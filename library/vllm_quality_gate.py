#!/usr/bin/python
"""Ansible module vllm_quality_gate: prove that a served model's answers are right, not just that its port is up."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_quality_gate
short_description: Canaries, needles and a streamed soak against one vLLM endpoint
description:
  - Runs after the health gate's warm-up. Each check is built and judged by C(module_utils/quality_checks.py).
  - B(Canaries) - each prompt of O(canaries) is sent greedily (temperature 0). Its answer must have the right
    shape (text; no C(<think>) block in C(content) when O(reasoning_parser)), and, where O(expected) has an
    answer for the prompt, be exactly that answer. The answers are returned, so that the first good start can
    record them for later starts.
  - B(Needles) - a fact placed after each fraction of O(needle_fractions) of a prompt of O(needle_depth_tokens)
    tokens (real sentences, counted with the model's own tokenizer through C(/tokenize)) must come back.
  - B(Soak) - O(soak_requests) streamed chat requests, O(soak_concurrency) at a time; every stream must be
    complete and well-formed (JSON events, the final C([DONE]) event, a finish reason, a usage chunk, some text).
  - A failure names the check, the request and what came back. The checks stop at O(budget_s) seconds, which
    fails the gate too (a model too slow for its own gate is not one to serve).
  - Read-only; never reports a change.
version_added: "0.1.0"
author: sparkfleet
options:
  url:
    description: Base URL of the endpoint, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  served:
    description: The served model name (the requests' C(model)).
    type: str
    required: true
  api_key:
    description: The endpoint's API key (sent as C(Authorization Bearer)); empty for none.
    type: str
    default: ""
  canaries:
    description: Prompts sent greedily; an empty list skips the canaries.
    type: list
    elements: str
    default: []
  expected:
    description: Known exact answers, by prompt. A canary without one is checked for its shape only.
    type: dict
    default: {}
  canary_max_tokens:
    description: Tokens a canary may generate.
    type: int
    default: 64
  reasoning_parser:
    description: The model has a reasoning parser, so reasoning must come in C(reasoning), never in C(content).
    type: bool
    default: false
  needle_depth_tokens:
    description: Tokens of the needle prompts; 0 skips the needles.
    type: int
    default: 0
  needle_fractions:
    description: Where the fact sits in each needle prompt, as a fraction of its depth.
    type: list
    elements: float
    default: [0.1, 0.5, 0.9]
  soak_requests:
    description: Streamed requests of the soak; 0 skips it.
    type: int
    default: 0
  soak_concurrency:
    description: Soak requests at once.
    type: int
    default: 4
  soak_max_tokens:
    description: Tokens each soak request may generate.
    type: int
    default: 32
  budget_s:
    description: Seconds all checks together may take.
    type: float
    default: 600
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Prove the answers of the endpoint
  vllm_quality_gate:
    url: http://127.0.0.1:8000
    served: smollm2-135m
    api_key: "{{ vllm_server_api_key }}"
    canaries: ["What is the capital of France? Answer in one word."]
    expected: "{{ recorded_canaries }}"
    needle_depth_tokens: 2000
    soak_requests: 8
    soak_concurrency: 4
  no_log: true
  register: quality
"""

RETURN = r"""
answers:
  description: Each canary's answer (C(content), stripped), by prompt.
  returned: always
  type: dict
needles:
  description: Each needle, with C(depth_tokens), C(fraction), C(prompt_tokens) (vLLM's count) and C(seconds).
  returned: always
  type: list
soak:
  description: C(requests), C(concurrency), C(completion_tokens) and C(seconds) of the soak.
  returned: always
  type: dict
seconds:
  description: Time all checks took.
  returned: always
  type: float
"""

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.quality_checks import (
    FILLER,
    canary_problem,
    message_of,
    needle,
    needle_problem,
    shown,
    stream_problem,
)


class GateFailed(Exception):
    """One check failed: its message names the check, the request and what came back."""


class Endpoint:
    """The endpoint's API, with the key, within the gate's deadline."""

    def __init__(self, url: str, served: str, api_key: str, deadline: float):
        self.url, self.served, self.api_key, self.deadline = url.rstrip("/"), served, api_key, deadline

    def post(self, path: str, body: dict, what: str) -> tuple[int, str]:
        """(status, body text) of one POST; out of time or unreachable is a failure naming WHAT."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GateFailed(f"{what}: the quality gate ran out of its time budget (budget_s) before this request")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=left) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")
        except (OSError, ValueError) as error:
            raise GateFailed(f"{what}: {self.url}{path} did not answer: {error}") from None

    def chat(self, prompt: str, what: str, **settings) -> dict:
        body = {"model": self.served, "messages": [{"role": "user", "content": prompt}], **settings}
        status, text = self.post("/v1/chat/completions", body, what)
        if status != 200:
            raise GateFailed(f"{what}: HTTP {status}: {shown(text)}")
        try:
            return json.loads(text)
        except ValueError:
            raise GateFailed(f"{what}: the answer is not JSON: {shown(text)}") from None

    def token_count(self, text: str) -> int:
        status, answer = self.post("/tokenize", {"model": self.served, "prompt": text, "add_special_tokens": False},
                                   "needles: counting the filler's tokens")  # fmt: skip
        if status != 200:
            raise GateFailed(f"needles: /tokenize answered HTTP {status}: {shown(answer)}")
        return int(json.loads(answer)["count"])


def run_canaries(endpoint: Endpoint, params: dict) -> dict[str, str]:
    answers = {}
    for prompt in params["canaries"]:
        what = f"canary {prompt!r}"
        answer = endpoint.chat(prompt, what, temperature=0, max_tokens=params["canary_max_tokens"])
        problem = canary_problem(answer, params["expected"].get(prompt), params["reasoning_parser"])
        if problem:
            raise GateFailed(f"{what}: {problem}")
        answers[prompt] = (message_of(answer).get("content") or "").strip()
    return answers


def run_needles(endpoint: Endpoint, params: dict) -> list[dict]:
    depth = params["needle_depth_tokens"]
    if depth <= 0:
        return []
    filler_tokens = endpoint.token_count(FILLER)
    results = []
    for fraction in params["needle_fractions"]:
        item = needle(depth, fraction, filler_tokens)
        what = f"needle at {fraction:.0%} of {depth} tokens"
        started = time.monotonic()
        answer = endpoint.chat(item.prompt, what, temperature=0, max_tokens=32)
        problem = needle_problem(answer, item)
        if problem:
            raise GateFailed(f"{what}: {problem}")
        usage = answer.get("usage") or {}
        results.append(
            {
                "depth_tokens": depth,
                "fraction": fraction,
                "prompt_tokens": usage.get("prompt_tokens"),
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    return results


def soak_one(endpoint: Endpoint, number: int, max_tokens: int) -> int:
    """One streamed soak request; its completion tokens."""
    what = f"soak request {number + 1}"
    body = {
        "model": endpoint.served,
        "messages": [{"role": "user", "content": f"Count from {number} to {number + 5}, one number per line."}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, text = endpoint.post("/v1/chat/completions", body, what)
    if status != 200:
        raise GateFailed(f"{what}: HTTP {status}: {shown(text)}")
    problem = stream_problem(text)
    if problem:
        raise GateFailed(f"{what}: {problem}")
    usage = [json.loads(line[6:]).get("usage") for line in text.splitlines() if line.startswith("data: {")]
    return next(item["completion_tokens"] for item in reversed(usage) if item)


def run_soak(endpoint: Endpoint, params: dict) -> dict:
    requests, concurrency = params["soak_requests"], params["soak_concurrency"]
    if requests <= 0:
        return {}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = list(pool.map(lambda n: soak_one(endpoint, n, params["soak_max_tokens"]), range(requests)))
    seconds = round(time.monotonic() - started, 3)
    return {"requests": requests, "concurrency": concurrency, "completion_tokens": sum(tokens), "seconds": seconds}


def bad_settings(params: dict) -> list[str]:
    problems = []
    for name in ("canary_max_tokens", "soak_concurrency", "soak_max_tokens"):
        if params[name] < 1:
            problems.append(f"{name} ({params[name]}) must be at least 1")
    for name in ("needle_depth_tokens", "soak_requests"):
        if params[name] < 0:
            problems.append(f"{name} ({params[name]}) must be 0 (skip) or more")
    if any(not 0 <= fraction <= 1 for fraction in params["needle_fractions"]):
        problems.append(f"needle_fractions {params['needle_fractions']} must lie between 0 and 1")
    if params["budget_s"] <= 0:
        problems.append(f"budget_s ({params['budget_s']}) must be positive")
    return problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "served": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "canaries": {"type": "list", "elements": "str", "default": []},
            "expected": {"type": "dict", "default": {}},
            "canary_max_tokens": {"type": "int", "default": 64},
            "reasoning_parser": {"type": "bool", "default": False},
            "needle_depth_tokens": {"type": "int", "default": 0},
            "needle_fractions": {"type": "list", "elements": "float", "default": [0.1, 0.5, 0.9]},
            "soak_requests": {"type": "int", "default": 0},
            "soak_concurrency": {"type": "int", "default": 4},
            "soak_max_tokens": {"type": "int", "default": 32},
            "budget_s": {"type": "float", "default": 600},
        },
        supports_check_mode=True,
    )
    params = module.params
    problems = bad_settings(params)
    if problems:
        module.fail_json(msg="vllm_quality_gate: " + "; ".join(problems))
    started = time.monotonic()
    endpoint = Endpoint(params["url"], params["served"], params["api_key"], started + params["budget_s"])
    result = {"changed": False, "answers": {}, "needles": [], "soak": {}}
    try:
        result["answers"] = run_canaries(endpoint, params)
        result["needles"] = run_needles(endpoint, params)
        result["soak"] = run_soak(endpoint, params)
    except GateFailed as failure:
        result["seconds"] = round(time.monotonic() - started, 3)
        module.fail_json(msg=f"{params['served']} failed its quality gate: {failure}", **result)
    result["seconds"] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
