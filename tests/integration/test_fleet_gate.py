"""The fleet's gate on loopback, as the fleet_router role runs it on a router whose endpoint is on loopback: the gate
(its unit's command line, rendered from the role's template) serving the endpoint in front of the real vllm-router
(its unit's command line), with stand-in vLLM servers as the Sparks, each checking only the Sparks' key. A key per
person (Bearer or x-api-key), revoked or added with no restart and no stream cut, limits with 429 and Retry-After,
served-name aliases, OpenAI's model list, and usage by key name as the answers report it."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import READY_TIMEOUT_S, wait_until
from helpers.fleet_gate import gated_router, write_keys
from helpers.fleet_router import (
    KEY,
    Backend,
)

# Each test has keys of its own, so that limits and revocations of one do not touch another.
KEYS = {
    "alice": "alice-key-0123456789",
    "dave": "dave-key-0123456789",
    "erin": "erin-key-0123456789",
    "frank": "frank-key-0123456789",
    "grace": "grace-key-0123456789",
    "heidi": "heidi-key-0123456789",
}
LIMITS = {"erin": {"requests_per_minute": 2}, "frank": {"concurrent": 1}}
ALIASES = {"gpt-4o-mini": "model-b"}


def entries(enabled: dict[str, bool] | None = None, extra: dict[str, str] | None = None) -> list[dict]:
    keys = {**KEYS, **(extra or {})}
    return [
        {"name": name, "key": key, "enabled": (enabled or {}).get(name, True), **LIMITS.get(name, {})}
        for name, key in keys.items()
    ]


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("gate")
    backends = [Backend(tmp, "qwen3-0.6b"), Backend(tmp, "model-b")]
    workers = [{"host": f"h{i}", "url": b.url, "model": b.model} for i, b in enumerate(backends)]
    try:
        with gated_router(tmp, workers, entries(), ALIASES, KEY) as gated:
            gated["logs"] += [backend.log for backend in backends]
            port = gated["port"]
            wait_until(lambda: call(port, "GET", "/health")[0] == 200, "the gate forwards /health", gated["logs"])
            for model in ("model-b", "qwen3-0.6b"):
                wait_until(lambda m=model: chat(port, KEYS["alice"], m)[0] == 200, f"{model} answers", gated["logs"])
            yield gated
    finally:
        for backend in backends:
            backend.process.terminate()
            backend.process.wait(timeout=10)


def call(port: int, method: str, path: str, headers: dict | None = None, body: object = None):
    """(status, headers, text) of one request to the gate."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        sent = {"content-type": "application/json", **(headers or {})} if data else dict(headers or {})
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def chat(port: int, key: str | None, model: str = "qwen3-0.6b", header: str = "bearer", **extra):
    headers = {}
    if key and header == "bearer":
        headers["authorization"] = f"Bearer {key}"
    elif key:
        headers["x-api-key"] = key
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    return call(port, "POST", "/v1/chat/completions", headers, body)


def metrics(gated: dict) -> str:
    return call(gated["metrics_port"], "GET", "/metrics")[2]


def metric(gated: dict, line_start: str) -> float:
    for line in metrics(gated).splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Stream(threading.Thread):
    """A long streamed chat through the gate, read to its end in the background."""

    def __init__(self, port: int, key: str, tokens: int = 1500) -> None:
        super().__init__(daemon=True)
        self.port, self.key, self.tokens = port, key, tokens
        self.status, self.text = 0, ""

    def run(self) -> None:
        self.status, _, self.text = chat(self.port, self.key, max_tokens=self.tokens, stream=True, ignore_eos=True)


def test_each_person_uses_their_own_key_as_bearer_or_x_api_key(gated):
    port = gated["port"]
    assert chat(port, KEYS["alice"])[0] == 200
    assert chat(port, KEYS["alice"], header="x-api-key")[0] == 200
    status, _, text = chat(port, "nobody-key-0123456789")
    assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
    assert chat(port, None)[0] == 401
    # The Sparks' own key is no client key: only the gate holds it, and sends it in place of the client's.
    assert chat(port, KEY)[0] == 401
    status, _, text = call(port, "POST", "/v1/messages", {"x-api-key": "nobody-key-0123456789"}, {"model": "m"})
    assert status == 401 and json.loads(text) == {
        "type": "error",
        "error": {"type": "authentication_error", "message": json.loads(text)["error"]["message"]},
    }


def test_an_alias_reaches_its_model_and_the_model_list_is_openais(gated):
    port, key = gated["port"], KEYS["alice"]
    status, _, text = chat(port, key, model="gpt-4o-mini")
    assert status == 200 and json.loads(text)["model"] == "model-b"  # the Spark serves it under its served name
    status, _, text = call(port, "GET", "/v1/models", {"authorization": f"Bearer {key}"})
    listed = json.loads(text)
    assert status == 200 and listed["object"] == "list"
    assert {row["id"] for row in listed["data"]} == {"qwen3-0.6b", "model-b", "gpt-4o-mini"}
    assert all(row["object"] == "model" for row in listed["data"])


def test_a_key_revoked_mid_stream_lets_the_stream_finish_and_is_refused_next(gated):
    port, keys, gate = gated["port"], gated["keys"], gated["gate"]
    stream = Stream(port, KEYS["dave"])
    stream.start()
    wait_until(lambda: metric(gated, 'sparkfleet_gate_in_flight{key="dave"}') == 1, "dave's stream runs", gated["logs"])
    write_keys(keys, entries(enabled={"dave": False}), ALIASES)
    wait_until(lambda: chat(port, KEYS["dave"])[0] == 401, "dave's key is refused", gated["logs"], seconds=30)
    assert stream.is_alive(), (stream.status, stream.text[-400:])
    stream.join(timeout=READY_TIMEOUT_S)
    assert stream.status == 200 and stream.text.rstrip().endswith("data: [DONE]"), stream.text[-300:]
    # A key added is taken as quickly, and the gate never restarted.
    write_keys(keys, entries(enabled={"dave": False}, extra={"heidi": "heidi-key-0123456789"}), ALIASES)
    wait_until(lambda: chat(port, "heidi-key-0123456789")[0] == 200, "heidi's new key works", gated["logs"], seconds=30)
    assert gate.poll() is None
    write_keys(keys, entries(), ALIASES)


def test_limits_answer_429_with_retry_after(gated):
    port = gated["port"]
    assert [chat(port, KEYS["erin"])[0] for _ in range(2)] == [200, 200]
    status, headers, text = chat(port, KEYS["erin"])
    assert status == 429 and int(headers["Retry-After"]) > 0
    assert json.loads(text)["error"]["code"] == "rate_limit_exceeded"
    assert metric(gated, 'sparkfleet_gate_limited_total{key="erin",limit="requests_per_minute"}') == 1

    stream = Stream(port, KEYS["frank"])
    stream.start()
    wait_until(
        lambda: metric(gated, 'sparkfleet_gate_in_flight{key="frank"}') == 1, "frank's stream runs", gated["logs"]
    )
    status, headers, _ = chat(port, KEYS["frank"])
    assert status == 429 and int(headers["Retry-After"]) >= 1
    stream.join(timeout=READY_TIMEOUT_S)
    assert stream.status == 200
    assert chat(port, KEYS["frank"])[0] == 200  # one at a time again


def test_usage_is_counted_by_key_name_as_the_answers_report_it(gated):
    port, key = gated["port"], KEYS["grace"]
    answers = [json.loads(chat(port, key, max_tokens=7)[2])["usage"]]
    status, _, text = chat(port, key, max_tokens=5, stream=True, stream_options={"include_usage": True})
    assert status == 200
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    answers += [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert len(answers) == 2
    prompt = sum(usage["prompt_tokens"] for usage in answers)
    completion = sum(usage["completion_tokens"] for usage in answers)
    assert completion == 12
    # The gate counts an answer once the Spark's side of it has ended, a moment after the client may have read it.
    expected = {
        'sparkfleet_gate_prompt_tokens_total{key="grace",api="chat"}': prompt,
        'sparkfleet_gate_completion_tokens_total{key="grace",api="chat"}': completion,
        'sparkfleet_gate_requests_total{key="grace",api="chat",status="200"}': 2,
    }
    wait_until(lambda: all(metric(gated, line) == value for line, value in expected.items()), str(expected))


def test_a_stream_that_does_not_ask_for_its_usage_is_counted_and_the_client_gets_no_usage_event(gated):
    """The gate asks the Spark for the usage of a chat or completion stream whose client did not, counts it, and
    keeps that usage event (no choices) from the client; every other event arrives, [DONE] last."""
    port, key = gated["port"], KEYS["heidi"]
    before = metric(gated, 'sparkfleet_gate_completion_tokens_total{key="heidi",api="chat"}')
    status, _, text = chat(port, key, max_tokens=6, stream=True)
    assert status == 200
    events = [event for event in text.split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event[len("data: ") :]) for event in events[:-1]]
    assert chunks and all(chunk["choices"] and "usage" not in chunk for chunk in chunks), chunks
    # The same chat asking for its usage, to know what the stand-in counts: 6 completion tokens.
    asked = chat(port, key, max_tokens=6, stream=True, stream_options={"include_usage": True})[2]
    usage = [
        json.loads(line[6:])["usage"]
        for line in asked.splitlines()
        if line.startswith('data: {"') and '"usage"' in line
    ]
    assert usage and usage[-1]["completion_tokens"] == 6
    line = 'sparkfleet_gate_completion_tokens_total{key="heidi",api="chat"}'
    wait_until(lambda: metric(gated, line) == before + 12, f"{line} = {before + 12}")


def test_the_gate_log_names_keys_and_shows_none(gated):
    text = Path(gated["logs"][0]).read_text()
    assert "key=alice" in text and "key=grace" in text
    for key in [*KEYS.values(), KEY]:
        assert key not in text


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/workers"), ("POST", "/workers"), ("GET", "/add_worker?url=http://127.0.0.1:9"), ("GET", "/metrics")],
)
def test_on_loopback_the_gate_refuses_the_routers_admin_api_even_with_a_key(gated, method, path):
    body = {"url": "http://127.0.0.1:9", "model_id": "qwen3-0.6b"} if method == "POST" else None
    status, _, _ = call(gated["port"], method, path, {"authorization": f"Bearer {KEYS['alice']}"}, body)
    assert status == 403


def test_health_needs_no_key_and_a_model_is_retrieved_by_its_id(gated):
    port = gated["port"]
    assert call(port, "GET", "/health")[0] == 200
    assert call(port, "POST", "/health", body={})[0] == 403  # GET and HEAD only
    assert call(port, "GET", "/v1/models")[0] == 401
