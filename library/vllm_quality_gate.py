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
    shape (text; no C(<think>) block in C(content) when O(reasoning_parser)), and, where an answer is known for
    the prompt, be exactly that answer. Known answers come from O(expected), else from O(record_file) when it was
    recorded for the same O(model). When every check passes, answers not known yet are written to O(record_file)
    (the first good start records them; later starts hold them), which is the module's only change.
  - B(Tool call) - with O(tool_parser), a request that needs a tool must come back as a tool call whose arguments
    are a JSON object.
  - B(Needles) - a fact placed after each fraction of O(needle_fractions) of a prompt of O(needle_depth_tokens)
    tokens (real sentences, counted with the model's own tokenizer through C(/tokenize)) must come back. The depth
    is at most a quarter of O(max_model_len).
  - B(Soak) - O(soak_requests) streamed chat requests, O(soak_concurrency) at a time; every stream must be
    complete and well-formed (JSON events, the final C([DONE]) event, a finish reason, a usage chunk, some text).
  - A failure names the check, the request and what came back. The checks stop at O(budget_s) seconds, which
    fails the gate too (a model too slow for its own gate is not one to serve).
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
  record_file:
    description: JSON file of the answers recorded at the first good start; empty records nothing.
    type: str
    default: ""
  model:
    description:
      - What the recorded answers hold for (e.g. repository and revision); a record made for another model is
        recorded again.
    type: dict
    default: {}
  rerecord:
    description: Record the canaries' answers again instead of holding them (after a deliberate change of answers).
    type: bool
    default: false
  canary_max_tokens:
    description: Tokens a canary may generate.
    type: int
    default: 64
  reasoning_parser:
    description:
      - The model has a reasoning parser, so reasoning must come in C(reasoning), never in C(content). Its canaries
        may generate O(reasoning_max_tokens) tokens, so that the answer comes after the thinking.
    type: bool
    default: false
  reasoning_max_tokens:
    description: Tokens a canary of a model with a reasoning parser may generate.
    type: int
    default: 1024
  tool_parser:
    description: The model is served with a tool parser and automatic tool choice; sends the tool canary.
    type: bool
    default: false
  max_model_len:
    description: The model's context; the needles' depth stays within a quarter of it. 0 for no limit.
    type: int
    default: 0
  recipe:
    description:
      - The model's resolved recipe; when given, O(reasoning_parser), O(tool_parser) and O(max_model_len) are
        read from it (its C(serve_flags) and C(max_model_len)).
    type: dict
    default: {}
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
    record_file: /etc/sparkfleet/vllm/smollm2-135m.last-good.canaries.json
    model: {hf_repo: HuggingFaceTB/SmolLM2-135M-Instruct, hf_revision: 12fd25f77366fa6b3b4b768ec3050bf629380bac}
    max_model_len: 8192
    needle_depth_tokens: 2000
    soak_requests: 8
    soak_concurrency: 4
  no_log: true
  register: quality
"""

RETURN = r"""
answers:
  description: Each canary's answer (C(content), stripped; the reasoning when there is no content), by prompt.
  returned: always
  type: dict
held:
  description: The canaries whose answer was known and held.
  returned: always
  type: list
recorded:
  description: The canaries whose answer was recorded in O(record_file) by this run.
  returned: always
  type: list
tool_call:
  description: The tool canary's call (C(name), C(arguments)), when O(tool_parser).
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
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.atomic_file import write_text_atomically
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.quality_checks import (
    FILLER,
    TOOL,
    TOOL_PROMPT,
    CanaryRecord,
    answer_text,
    canary_problem,
    held_answers,
    message_of,
    needle,
    needle_depth,
    needle_problem,
    recipe_traits,
    shown,
    stream_problem,
    tool_call_problem,
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

    def chat(self, prompt: str, what: str, **settings: object) -> dict:
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


def canary_max_tokens(params: dict) -> int:
    return params["reasoning_max_tokens"] if params["reasoning_parser"] else params["canary_max_tokens"]


def record_identity(params: dict) -> dict:
    """What recorded answers hold for: the model, and how the canaries asked it."""
    return {**params["model"], "max_tokens": canary_max_tokens(params)}


def known_answers(params: dict) -> dict[str, str]:
    """The answers each canary must give: O(expected) over what O(record_file) holds for this model."""
    recorded = {}
    if params["record_file"] and not params["rerecord"] and os.path.exists(params["record_file"]):
        with open(params["record_file"], encoding="utf-8") as handle:
            recorded = held_answers(handle.read(), record_identity(params))
    return {**recorded, **params["expected"]}


def run_canaries(endpoint: Endpoint, params: dict, known: dict[str, str]) -> dict[str, str]:
    answers = {}
    for prompt in params["canaries"]:
        what = f"canary {prompt!r}"
        answer = endpoint.chat(prompt, what, temperature=0, max_tokens=canary_max_tokens(params))
        problem = canary_problem(answer, known.get(prompt), params["reasoning_parser"])
        if problem:
            raise GateFailed(f"{what}: {problem}")
        answers[prompt] = answer_text(answer)
    return answers


def run_tool_call(endpoint: Endpoint, params: dict) -> dict:
    if not params["tool_parser"]:
        return {}
    what = f"tool canary {TOOL_PROMPT!r}"
    answer = endpoint.chat(TOOL_PROMPT, what, temperature=0, max_tokens=canary_max_tokens(params), tools=[TOOL])
    problem = tool_call_problem(answer)
    if problem:
        raise GateFailed(f"{what}: {problem}")
    function = message_of(answer)["tool_calls"][0]["function"]
    return {"name": function["name"], "arguments": json.loads(function["arguments"])}


def record(params: dict, answers: dict[str, str], known: dict[str, str]) -> list[str]:
    """Write the answers not known before to O(record_file) (all of them, for this model); the prompts recorded."""
    new = sorted(prompt for prompt in answers if prompt not in known)
    if params["record_file"] and new:
        text = CanaryRecord(record_identity(params), answers).to_json()
        write_text_atomically(params["record_file"], text, mode=0o600, folder_mode=None)
    return new if params["record_file"] else []


def run_needles(endpoint: Endpoint, params: dict) -> list[dict]:
    depth = needle_depth(params["needle_depth_tokens"], params["max_model_len"])
    if depth <= 0:
        return []
    filler_tokens = endpoint.token_count(FILLER)
    results = []
    for fraction in params["needle_fractions"]:
        item = needle(depth, fraction, filler_tokens)
        what = f"needle at {fraction:.0%} of {depth} tokens"
        started = time.monotonic()
        answer = endpoint.chat(item.prompt, what, temperature=0, max_tokens=canary_max_tokens(params))
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
    for name in ("canary_max_tokens", "reasoning_max_tokens", "soak_concurrency", "soak_max_tokens"):
        if params[name] < 1:
            problems.append(f"{name} ({params[name]}) must be at least 1")
    for name in ("needle_depth_tokens", "soak_requests", "max_model_len"):
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
            "record_file": {"type": "str", "default": ""},
            "model": {"type": "dict", "default": {}},
            "rerecord": {"type": "bool", "default": False},
            "canary_max_tokens": {"type": "int", "default": 64},
            "reasoning_parser": {"type": "bool", "default": False},
            "reasoning_max_tokens": {"type": "int", "default": 1024},
            "tool_parser": {"type": "bool", "default": False},
            "max_model_len": {"type": "int", "default": 0},
            "recipe": {"type": "dict", "default": {}},
            "needle_depth_tokens": {"type": "int", "default": 0},
            "needle_fractions": {"type": "list", "elements": "float", "default": [0.1, 0.5, 0.9]},
            "soak_requests": {"type": "int", "default": 0},
            "soak_concurrency": {"type": "int", "default": 4},
            "soak_max_tokens": {"type": "int", "default": 32},
            "budget_s": {"type": "float", "default": 600},
        },
        supports_check_mode=True,
    )
    params = dict(module.params)
    if params["recipe"]:
        params.update(recipe_traits(params["recipe"]))
    problems = bad_settings(params)
    if problems:
        module.fail_json(msg="vllm_quality_gate: " + "; ".join(problems))
    started = time.monotonic()
    endpoint = Endpoint(params["url"], params["served"], params["api_key"], started + params["budget_s"])
    result = {"changed": False, "answers": {}, "held": [], "recorded": [], "tool_call": {}, "needles": [], "soak": {}}
    known = known_answers(params)
    try:
        result["answers"] = run_canaries(endpoint, params, known)
        result["tool_call"] = run_tool_call(endpoint, params)
        result["needles"] = run_needles(endpoint, params)
        result["soak"] = run_soak(endpoint, params)
    except GateFailed as failure:
        result["seconds"] = round(time.monotonic() - started, 3)
        module.fail_json(msg=f"{params['served']} failed its quality gate: {failure}", **result)
    result["held"] = sorted(prompt for prompt in result["answers"] if prompt in known)
    if not module.check_mode:
        result["recorded"] = record(params, result["answers"], known)
    result["changed"] = bool(result["recorded"])
    result["seconds"] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
