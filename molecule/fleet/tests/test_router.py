"""The fleet's endpoint: vllm-router on fleet-router (reached over SSH) in front of the pair's head (fleet-1) and
fleet-3, which serve the same model, behind HAProxy on the fabric address (10.77.0.20:8080); vllm-router itself
listens on 127.0.0.1:18080 only. The router under a rolling update and with an unreachable Spark: test_fleet.py;
a killed backend and a drained one: tests/integration/test_fleet_router.py (the same router, unit and HAProxy
configuration, on loopback)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import testinfra

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
ROUTER_URL = "http://10.77.0.20:8080"
# vllm-router behind HAProxy, admin API included: reached on the router host only (fleet_router_internal_port).
ADMIN_URL = "http://127.0.0.1:18080"
API_KEY = "sparkfleet-fleet-test-key"


def router():
    return testinfra.get_host(f"ansible://fleet-router?ansible_inventory={INVENTORY}")


def workers() -> dict[str, bool]:
    answer = json.loads(router().check_output(f"curl -fsS {ADMIN_URL}/workers"))
    return {worker["url"]: worker["is_healthy"] for worker in answer["workers"]}


def status_of(method: str, path: str, body: dict | None = None) -> int:
    """The status the fleet's endpoint answers, from the controller (over the fabric, as a client)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json", "authorization": f"Bearer {API_KEY}"}
    request = urllib.request.Request(ROUTER_URL + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def chat(key: str | None) -> int:
    body = {"model": "qwen3-0.6b", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(ROUTER_URL + "/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["model"] == "qwen3-0.6b"
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_router_holds_the_heads_and_single_sparks_endpoints_not_the_workers():
    # test_pair.py restarts the pair just before: the router readmits its head after two good health checks.
    expected = {"http://fleet-1:8000": True, "http://fleet-3:8000": True, "http://fleet-3:8001": True}
    # Generous: a busy machine slows the restart, never the outcome.
    deadline = time.monotonic() + 300
    while (held := workers()) != expected and time.monotonic() < deadline:
        time.sleep(2)
    assert held == expected, router().check_output("journalctl -u sparkfleet-router --no-pager -n 30")
    assert router().service("sparkfleet-router").is_enabled


def test_the_fleet_endpoint_answers_with_the_key_and_refuses_without_it():
    assert chat(API_KEY) == 200
    assert chat(None) == 401
    assert chat("wrong") == 401


def test_the_fleet_endpoint_refuses_the_routers_admin_api():
    intruder = {"url": "http://10.77.0.99:8000", "model_id": "qwen3-0.6b"}
    assert status_of("GET", "/workers") in (403, 404)
    assert status_of("POST", "/workers", intruder) in (403, 404)
    assert status_of("GET", "/list_workers") in (403, 404)
    assert intruder["url"] not in workers()  # nothing was added behind the refusal
    assert chat(API_KEY) == 200
    assert status_of("GET", "/health") == 200
    front = router().service("haproxy")
    assert front.is_running and front.is_enabled
    # vllm-router, admin API included, on loopback only; HAProxy alone on the fabric address.
    assert router().socket("tcp://127.0.0.1:18080").is_listening
    assert not router().socket("tcp://0.0.0.0:18080").is_listening
    assert not router().socket("tcp://10.77.0.20:18080").is_listening


def test_an_embedding_model_is_reached_through_the_fleet_endpoint_by_its_name():
    """fleet-3's second model (kind embed) passed its own gate (a probe of /v1/embeddings) and the router sends
    /v1/embeddings for it there, with the fleet's key, in vLLM's EmbeddingResponse shape."""
    body = {"model": "qwen3-embedding-0.6b", "input": ["The cat sits on the mat.", "Revenue rose."]}
    headers = {"content-type": "application/json", "authorization": f"Bearer {API_KEY}"}
    request = urllib.request.Request(ROUTER_URL + "/v1/embeddings", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert answer["model"] == "qwen3-embedding-0.6b"
    assert [row["index"] for row in answer["data"]] == [0, 1] and answer["usage"]["prompt_tokens"] > 0
    assert status_of("POST", "/v1/chat/completions", {"model": "qwen3-embedding-0.6b", "messages": []}) == 404


def invocation(unit: str) -> str:
    """systemd's InvocationID of a unit on the router host: a new one for each start."""
    return router().check_output(f"systemctl show {unit} --property=InvocationID --value")


def test_a_key_added_then_revoked_by_the_router_stage_works_within_seconds_with_no_restart():
    """A key change as an owner makes it: the router stage on the router host (`site.yml --tags router --limit
    fleet-router`) with carol's key added, then revoked. The gate reads its keys file again; nothing restarts."""
    carol = {"name": "carol", "key": "carol-key-of-the-fleet-test-5d1"}
    units = ("sparkfleet-gate", "sparkfleet-router", "haproxy")
    before = {unit: invocation(unit) for unit in units}
    for enabled, status, verbosity in ((True, 200, ["-vvv"]), (False, 401, [])):
        keys = [{"name": "fleet", "key": API_KEY}, carol | {"enabled": enabled}]
        extra = ["-e", json.dumps({"fleet_router_keys": keys})]
        done = run_site("--tags", "router", "--limit", "fleet-router", *extra, *verbosity)
        assert done.returncode == 0, said(done)[-3000:]
        assert carol["key"] not in done.stdout + done.stderr  # not even at -vvv
        # The gate rereads its keys file within a second of a change; generous for a busy machine.
        deadline = time.monotonic() + 60
        while chat(carol["key"]) != status and time.monotonic() < deadline:
            time.sleep(0.5)
        assert chat(carol["key"]) == status
        assert chat(API_KEY) == 200
    assert {unit: invocation(unit) for unit in units} == before
    # Nowhere on the router host: not in the journal, not in a file under /etc/sparkfleet (the gate keeps digests).
    journal = router().check_output("journalctl --no-pager -u sparkfleet-gate -u sparkfleet-router")
    assert "key=carol" in journal and carol["key"] not in journal
    assert router().run(f"grep -rF -- {carol['key']} /etc/sparkfleet /etc/haproxy").rc == 1
