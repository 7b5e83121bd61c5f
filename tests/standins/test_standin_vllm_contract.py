"""The stand-in vLLM, the dashboards and the alert rules against the contract of the real release.

tests/contracts/vllm/ holds what tests/contracts/vllm/regenerate.py read from vLLM 0.33.0 itself: the JSON schemas
of its responses (from its pydantic models) and every metric it defines. Every field the stand-in sends must exist
in the real schema with the real type, and every metric the stand-in exports or the monitoring reads must exist
in vLLM with the same type, so a drift between our reading of vLLM and vLLM fails here.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator

import pytest
from helpers import ROOT
from helpers.vllm_standin import API_KEY, FAST, Server, request, sse_events, start_server, stop_server

CONTRACT = ROOT / "tests" / "contracts" / "vllm"
SCHEMAS = json.loads((CONTRACT / "openai-schemas.json").read_text())["schemas"]
METRICS = json.loads((CONTRACT / "metrics.json").read_text())["metrics"]
AUTH_GUARDED = json.loads((CONTRACT / "auth.json").read_text())["guarded_prefixes"]
JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def violations(value: object, schema: dict, defs: dict, where: str = "$") -> list[str]:
    """Where `value` departs from a pydantic JSON schema: a field the schema lacks, a wrong type, a missing
    required field. Enough of JSON Schema for pydantic's output ($ref, anyOf, type, const, enum, items)."""
    if "$ref" in schema:
        return violations(value, defs[schema["$ref"].rsplit("/", 1)[-1]], defs, where)
    if "anyOf" in schema:
        tries = [violations(value, option, defs, where) for option in schema["anyOf"]]
        return [] if any(not found for found in tries) else min(tries, key=len)
    problems = []
    kind = schema.get("type")
    if kind and not (isinstance(value, JSON_TYPES[kind]) and not (kind in ("integer", "number") and value is True)):
        return [f"{where}: {type(value).__name__} {value!r:.60}, the schema has {kind}"]
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: {value!r}, the schema has the constant {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict) and "properties" in schema:
        properties = schema["properties"]
        problems += [f"{where}.{key}: not a field of vLLM's response" for key in value if key not in properties]
        problems += [f"{where}.{key}: required, missing" for key in schema.get("required", []) if key not in value]
        for key in value.keys() & properties.keys():
            problems += violations(value[key], properties[key], defs, f"{where}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problems += violations(item, schema["items"], defs, f"{where}[{index}]")
    return problems


def check(body: object, contract: str) -> list[str]:
    schema = SCHEMAS[contract]["schema"]
    return violations(body, schema, schema.get("$defs", {}))


def test_the_checker_finds_a_field_vllm_does_not_have_and_a_wrong_type() -> None:
    # The old stand-in's message field, gone from vLLM since PR 33402, and a count sent as text.
    message = {"role": "assistant", "content": "hi", "reasoning_content": None}
    body = {"object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": message}], "usage": {}}
    body["usage"] = {"prompt_tokens": "1", "completion_tokens": 1, "total_tokens": 2}
    found = check(body, "chat_completion")
    assert "$.choices[0].message.reasoning_content: not a field of vLLM's response" in found
    assert any(line.startswith("$.usage.prompt_tokens: str '1'") for line in found)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_OUTPUT_TOKENS": "4"}
    args = ["m", "--served-model-name", "thinker", "--reasoning-parser", "qwen3"]
    started = start_server(tmp_path_factory.mktemp("standin-contract"), args, env)
    yield started
    stop_server(started)


def chat_body(max_tokens: int, **extra: object) -> dict:
    return {"model": "thinker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, **extra}


STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.mark.parametrize(
    ("path", "body", "contract"),
    [
        ("/v1/chat/completions", chat_body(50), "chat_completion"),  # reasoning only, content null
        ("/v1/chat/completions", chat_body(500), "chat_completion"),  # reasoning, then content
        ("/v1/completions", {"model": "thinker", "prompt": "a b", "max_tokens": 3}, "completion"),
        ("/v1/chat/completions", chat_body(5, model="nope"), "error"),
        ("/tokenize", {"model": "thinker", "prompt": "a b c"}, "tokenize"),
    ],
    ids=["chat-thinking", "chat-answer", "completion", "error", "tokenize"],
)
def test_every_field_the_standin_sends_is_in_vllms_response_schema(thinker, path, body, contract) -> None:
    status, raw, _ = request(thinker, "POST", path, body)
    assert status == (404 if contract == "error" else 200)
    assert check(json.loads(raw), contract) == []


@pytest.mark.parametrize(
    ("path", "body", "contract"),
    [
        ("/v1/chat/completions", chat_body(100, **STREAM_USAGE), "chat_completion_chunk"),
        ("/v1/completions", {"model": "thinker", "prompt": "a", "max_tokens": 3, **STREAM_USAGE}, "completion_chunk"),
    ],
    ids=["chat", "completion"],
)
def test_every_stream_chunk_is_in_vllms_chunk_schema(thinker, path, body, contract) -> None:
    _, raw, _ = request(thinker, "POST", path, body)
    chunks = [json.loads(event) for event in sse_events(raw)[:-1]]
    assert len(chunks) > 3
    assert [problem for chunk in chunks for problem in check(chunk, contract)] == []


def test_the_model_list_is_in_vllms_schema(thinker) -> None:
    _, raw, _ = request(thinker, "GET", "/v1/models")
    assert check(json.loads(raw), "models") == []


def test_a_request_for_an_alias_is_answered_under_the_first_served_name(tmp_path) -> None:
    """vLLM 0.33 takes any of its --served-model-name names and answers with the first (model_name():
    base_model_paths[0].name); /v1/models lists them all."""
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_OUTPUT_TOKENS": "2"}
    server = start_server(tmp_path, ["m", "--served-model-name", "first", "alias", "--api-key", API_KEY], env)
    try:
        status, raw, _ = request(server, "POST", "/v1/chat/completions", {**chat_body(2), "model": "alias"})
        assert (status, json.loads(raw)["model"]) == (200, "first")
        _, raw, _ = request(server, "GET", "/v1/models")
        assert [card["id"] for card in json.loads(raw)["data"]] == ["first", "alias"]
    finally:
        stop_server(server)


# --- pooling models (--runner pooling) ---------------------------------------------------------------------

RERANKER_OVERRIDES = (
    '{"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
    '"is_original_qwen3_reranker": true}'
)


@pytest.fixture(scope="module")
def pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """An embedding server (--convert embed, Qwen3-Embedding's recipe) and a reranker (--hf-overrides, as
    Qwen3-Reranker's recipe has it), both behind the key."""
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.1"}
    common = ["--runner", "pooling", "--api-key", API_KEY]
    servers = {
        "embed": start_server(
            tmp_path_factory.mktemp("embed"),
            ["m", "--served-model-name", "embedder", *common, "--convert", "embed"],
            env,
        ),
        "rerank": start_server(
            tmp_path_factory.mktemp("rerank"),
            ["m", "--served-model-name", "reranker", *common, "--hf-overrides", RERANKER_OVERRIDES],
            env,
        ),
    }
    yield servers
    for server in servers.values():
        stop_server(server)


def test_a_pooling_server_answers_in_vllms_schemas_and_has_no_generation_api(pooling) -> None:
    status, raw, _ = request(pooling["embed"], "POST", "/v1/embeddings", {"model": "embedder", "input": ["a b", "c"]})
    assert status == 200 and check(json.loads(raw), "embedding") == []
    assert [row["index"] for row in json.loads(raw)["data"]] == [0, 1]
    body = {"model": "reranker", "query": "capital of France", "documents": ["Paris is in France", "a cat"]}
    status, raw, _ = request(pooling["rerank"], "POST", "/v1/rerank", body)
    assert status == 200 and check(json.loads(raw), "rerank") == []
    assert [row["index"] for row in json.loads(raw)["results"]] == [0, 1]
    # vLLM registers routes by the model's tasks: no chat on a pooling model, no embeddings on a reranker.
    for server, path in ((pooling["embed"], "/v1/chat/completions"), (pooling["rerank"], "/v1/embeddings")):
        status, raw, _ = request(server, "POST", path, {"model": "x", "messages": []})
        assert (status, json.loads(raw)) == (404, {"detail": "Not Found"})
    # vLLM's key guards its GUARDED_PREFIX paths only (the contract's auth.json): /rerank answers without it,
    # /v1/rerank and /v2/rerank do not.
    assert AUTH_GUARDED == ["/v1", "/v2", "/inference", "/cohere"]
    assert request(pooling["rerank"], "POST", "/v1/rerank", body, key=None)[0] == 401
    assert request(pooling["rerank"], "POST", "/v2/rerank", body, key=None)[0] == 401
    assert request(pooling["rerank"], "POST", "/rerank", body, key=None)[0] == 200


def test_the_standin_guards_the_paths_vllm_guards() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "standins" / "vllm"))
    from vllm_standin.server import GUARDED_PREFIX

    assert list(GUARDED_PREFIX) == AUTH_GUARDED


# --- metrics -----------------------------------------------------------------------------------------------

SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def metric_of_sample(sample: str) -> str | None:
    """The vLLM metric a sample name belongs to (vllm:x_total -> vllm:x), or None when vLLM has none."""
    for name, spec in METRICS.items():
        if any(sample == name + suffix for suffix in SAMPLE_SUFFIXES[spec["type"]]):
            return name
    return None


def test_every_metric_the_standin_exports_is_vllms_with_the_same_type(thinker) -> None:
    request(thinker, "POST", "/v1/completions", {"model": "thinker", "prompt": "a", "max_tokens": 2})
    _, raw, _ = request(thinker, "GET", "/metrics")
    types = dict(re.findall(r"^# TYPE (vllm:\S+) (\w+)$", raw.decode(), re.MULTILINE))
    assert len(types) > 10
    for name, kind in types.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        assert base in METRICS, f"the stand-in exports {name}, which vLLM 0.33.0 does not define"
        assert METRICS[base]["type"] == kind, f"{name}: the stand-in says {kind}, vLLM says {METRICS[base]['type']}"


# The boards and rules that read vLLM's metrics; sparkfleet-keys.json reads the fleet gate's only (its panels are
# checked against the gate itself by tests/integration/test_monitoring_live.py).
MONITORING = [
    *sorted(
        path
        for path in (ROOT / "roles" / "fleet_monitoring" / "files" / "dashboards").glob("*.json")
        if path.name != "sparkfleet-keys.json"
    ),
    *sorted((ROOT / "roles" / "fleet_monitoring" / "templates" / "etc" / "prometheus" / "rules").glob("*.j2")),
]


@pytest.mark.parametrize("path", MONITORING, ids=[path.name for path in MONITORING])
def test_every_vllm_metric_the_monitoring_reads_exists_in_vllm(path) -> None:
    samples = set(re.findall(r"vllm:[a-z0-9_:]+", path.read_text()))
    assert samples, f"{path.name} reads no vLLM metric"
    assert sorted(sample for sample in samples if metric_of_sample(sample) is None) == []


def test_the_contract_records_metrics_named_through_a_variable_and_counters_by_their_family() -> None:
    import ast
    import sys

    sys.path.insert(0, str(CONTRACT))
    from regenerate import _looped_names, _string_constants, exposed_name

    source = 'name = "vllm:cache_config_info"\ngauge = Gauge(name=name, documentation="d")\n'
    assert _string_constants(ast.parse(source)) == {"name": {"vllm:cache_config_info"}}
    # spec_decode/metrics.py names its counters in a list of (name, documentation) it loops over.
    source = 'specs = [("vllm:spec_decode_num_drafts", "Drafts.")]\n'
    source += "c = [Counter(name=n, documentation=d) for n, d in specs]\n"
    assert _looped_names(ast.parse(source)) == {"n": {"vllm:spec_decode_num_drafts": "Drafts."}}
    for name in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos"):
        assert METRICS[f"vllm:spec_decode_num_{name}"]["type"] == "counter"
    assert exposed_name("vllm:estimated_flops_per_gpu_total", "counter") == "vllm:estimated_flops_per_gpu"
    assert exposed_name("vllm:kv_cache_usage_perc", "gauge") == "vllm:kv_cache_usage_perc"
    # and the committed contract holds them as a scrape of the real engine names them
    assert METRICS["vllm:cache_config_info"]["type"] == "gauge"
    assert METRICS["vllm:estimated_flops_per_gpu"]["defined_as"] == "vllm:estimated_flops_per_gpu_total"
    assert not [name for name, spec in METRICS.items() if spec["type"] == "counter" and name.endswith("_total")]
