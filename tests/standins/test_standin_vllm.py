"""Tests of the stand-in vLLM server (tests/standins/vllm): real processes, real sockets, real HTTP.

Each server is started as a subprocess on 127.0.0.1 with a free port, a short load delay and fast token rates,
and is stopped by the test that started it. The flag-parsing rules are also checked directly on the package.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.vllm_standin import (
    API_KEY,
    FAST,
    STANDIN_DIR,
    VLLM,
    Server,
    free_port,
    port_open,
    request,
    sse_events,
    start_server,
    stop_server,
    wait_healthy,
)

FLAGS_FILE = ROOT / "recipes" / "vllm-serve-flags.txt"
# How long a process may take to exit once it should (its peer went away, its start was refused): generous, as
# a loaded 2-core machine is slow to end a Python process too; one that exits in time is not waited for.
EXIT_TIMEOUT_S = 60

sys.path.insert(0, str(STANDIN_DIR))
import vllm_standin.engine as engine_module  # noqa: E402 -- importable only once its directory is on sys.path
from vllm_standin.config import build_config  # noqa: E402
from vllm_standin.engine import Engine, GenerationRequest, TokenEvent  # noqa: E402
from vllm_standin.flags import (  # noqa: E402
    UsageError,
    load_flag_table,
    normalize_argv,
    parse_serve_args,
)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample line of a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in metrics")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the API tests: underscore, '=' and -O3 forms on its command line, an API key."""
    tmp = tmp_path_factory.mktemp("standin-vllm")
    args = [
        "org/Some-Model-7B",
        "--served_model_name",
        "spark-test",
        "--max_model_len=4096",
        "-O3",
        "--api-key",
        API_KEY,
        "--trust-remote-code",
        "--no-enable-prefix-caching",
        "--enable-prefix-caching",
        "--gpu-memory-utilization",
        "0.85",
        "--kv-cache-dtype",
        "fp8",
        "--speculative-config.method",
        "mtp",
        "-tp",
        "1",
    ]
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.2", "VLLM_STANDIN_OUTPUT_TOKENS": "8"}
    started = start_server(tmp, args, env)
    yield started
    stop_server(started)


# --- the flag list and the command line -------------------------------------------------------------------


def test_flag_file_has_the_flags_this_project_uses() -> None:
    flags = {line.split()[0] for line in FLAGS_FILE.read_text().splitlines() if line.startswith("--")}
    # The flags /work/shared/spark-facts.md and the recipes rely on.
    needed = {
        "--served-model-name", "--trust-remote-code", "--max-model-len", "--gpu-memory-utilization",
        "--max-num-seqs", "--reasoning-parser", "--enable-auto-tool-choice", "--tool-call-parser",
        "--kv-cache-dtype", "--load-format", "--enable-prefix-caching", "--tensor-parallel-size", "--nnodes",
        "--node-rank", "--master-addr", "--headless", "--kv-cache-memory-bytes", "--host", "--port", "--api-key",
        "--optimization-level", "--speculative-config", "--distributed-executor-backend",
    }  # fmt: skip
    assert needed <= flags
    assert len(flags) > 200  # the whole `vllm serve --help=all` list, not a hand-picked subset
    assert "--task" not in flags  # removed from vLLM; a recipe using it must fail here as it fails there


def test_unknown_flag_is_refused_like_argparse() -> None:
    result = subprocess.run(
        [str(VLLM), "serve", "some/model", "--max-model-len", "4096", "--enable-turbo-mode"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 2
    assert "error: unrecognized arguments: --enable-turbo-mode" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["m", "--no-headless"], "unrecognized arguments: --no-headless"),  # store_true: no --no- form
        # vllm/vllm-openai's ENTRYPOINT is already `vllm serve`; repeating it in the command fails like this.
        (["vllm", "serve", "m", "--port", "8000"], "unrecognized arguments: serve m"),
        (["m", "--port"], "argument --port: expected one argument"),
        (["m", "--enable-prefix-caching=yes"], "ignored explicit argument 'yes'"),
        (["m", "--port", "http"], "argument --port: invalid int value: 'http'"),
        (["m", "-O7"], "argument --optimization-level: invalid choice: '7'"),
        (["m", "--max-model-len", "lots"], "invalid human_readable_int value"),
    ],
)
def test_bad_command_lines_exit_2(argv: list[str], message: str) -> None:
    result = subprocess.run([str(VLLM), "serve", *argv], capture_output=True, text=True, timeout=10)
    assert result.returncode == 2
    assert message in result.stderr


def test_flexible_parser_forms() -> None:
    table = load_flag_table(FLAGS_FILE)
    assert normalize_argv(["--max_model_len=8", "-O3", "-O", "2", "--compilation_config.cudagraph_mode=x"]) == [
        "--max-model-len=8",
        "--optimization-level",
        "3",
        "--optimization-level",
        "2",
        "--compilation-config.cudagraph_mode=x",
    ]
    parsed = parse_serve_args(
        ["--model", "m", "--no-enable-prefix-caching", "--no_trust_remote_code", "-tp", "2", "--headless"], table
    )
    assert parsed.model_tag is None
    assert parsed.values["model"] == "m"
    assert parsed.values["enable_prefix_caching"] is False
    assert parsed.values["trust_remote_code"] is False
    assert parsed.values["tensor_parallel_size"] == "2"
    assert parsed.values["headless"] is True
    parsed = parse_serve_args(["m", "--speculative-config.method", "mtp", "--served-model-name", "a", "b"], table)
    assert parsed.values["speculative_config"] == {"method": "mtp"}
    assert parsed.values["served_model_name"] == ["a", "b"]
    with pytest.raises(UsageError, match=r"unrecognized arguments: --port\.x"):
        parse_serve_args(["m", "--port.x", "1"], table)


# --- startup ----------------------------------------------------------------------------------------------


def test_port_is_closed_until_loading_ends(tmp_path: Path) -> None:
    started = start_server(tmp_path, ["m"], {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "1.0"}, wait=False)
    try:
        time.sleep(0.3)
        assert started.process.poll() is None
        assert not port_open(started.port)
        wait_healthy(started)
        assert time.monotonic() - started.started >= 1.0
        status, body, _ = request(started, "GET", "/health", key=None)
        assert (status, body) == (200, b"")
    finally:
        stop_server(started)
    assert started.process.returncode == 0  # SIGTERM is a clean shutdown, as in vLLM


# --- API --------------------------------------------------------------------------------------------------


def test_models_lists_the_served_name(server: Server) -> None:
    status, body, _ = request(server, "GET", "/v1/models")
    assert status == 200
    listing = json.loads(body)
    assert listing["object"] == "list"
    [card] = listing["data"]
    assert card["id"] == "spark-test"
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["root"] == "org/Some-Model-7B"
    assert card["max_model_len"] == 4096  # from --max_model_len=4096


def test_api_key_guards_v1_only(server: Server) -> None:
    assert request(server, "GET", "/v1/models", key=None)[0] == 401
    status, body, _ = request(server, "GET", "/v1/models", key="wrong")
    assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
    assert request(server, "GET", "/health", key=None)[0] == 200
    assert request(server, "GET", "/metrics", key=None)[0] == 200


def test_completion_honours_max_tokens(server: Server) -> None:
    status, body, _ = request(
        server, "POST", "/v1/completions", {"model": "spark-test", "prompt": "one two three four", "max_tokens": 5}
    )
    assert status == 200
    result = json.loads(body)
    assert result["id"].startswith("cmpl-")
    assert result["object"] == "text_completion"
    assert result["model"] == "spark-test"
    [choice] = result["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["text"].split()) == 5
    assert result["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_chat_stops_on_its_own_below_max_tokens(server: Server) -> None:
    body = {"model": "spark-test", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100}
    status, raw, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200
    result = json.loads(raw)
    assert result["id"].startswith("chatcmpl-")
    assert result["object"] == "chat.completion"
    [choice] = result["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"  # VLLM_STANDIN_OUTPUT_TOKENS=8 < 100
    assert result["usage"]["completion_tokens"] == 8 == len(choice["message"]["content"].split())


def test_chat_stream_with_usage_chunk(server: Server) -> None:
    body = {
        "model": "spark-test",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count to three"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw, headers = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"]]
    assert len(content) == 6
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 5 + ["length"]
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 5
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["total_tokens"] == 11


def test_a_chat_stream_returns_token_ids_when_asked(server: Server) -> None:
    """vLLM's return_token_ids: the prompt's ids on the opening chunk, each token's own on the others."""
    body = {
        "model": "spark-test",
        "messages": [{"role": "user", "content": "count to three"}],
        "max_tokens": 3,
        "stream": True,
        "return_token_ids": True,
    }
    _, raw, _ = request(server, "POST", "/v1/chat/completions", body)
    chunks = [json.loads(event) for event in sse_events(raw)[:-1]]
    assert len(chunks[0]["prompt_token_ids"]) == 3
    assert [len(chunk["choices"][0]["token_ids"]) for chunk in chunks[1:]] == [1, 1, 1]
    _, raw, _ = request(server, "POST", "/v1/chat/completions", {**body, "return_token_ids": False})
    chunks = [json.loads(event) for event in sse_events(raw)[:-1]]
    assert chunks[0]["prompt_token_ids"] is None and chunks[1]["choices"][0]["token_ids"] is None


def test_a_chat_stream_opens_when_the_prefill_is_done(tmp_path: Path) -> None:
    """As vLLM's serving.py, the role chunk goes out with the engine's first output: a client timing the first
    chunk (llama-benchy's time to first response) times the prefill. 20 prompt words at 40 tok/s: 0.5 s at least."""
    standin = start_server(tmp_path, ["org/m"], {"VLLM_STANDIN_PREFILL_TOK_S": "40", "VLLM_STANDIN_LOAD_SECONDS": "0"})
    try:
        body = {"messages": [{"role": "user", "content": " ".join(["word"] * 20)}], "max_tokens": 2, "stream": True}
        connection = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=60)
        started = time.monotonic()
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        line = response.readline()
        while not line.startswith(b"data: "):
            line = response.readline()
        assert time.monotonic() - started >= 0.5
        assert json.loads(line[len(b"data: ") :])["choices"][0]["delta"]["role"] == "assistant"
        connection.close()
    finally:
        stop_server(standin)


def test_speculation_counts_drafts_with_the_known_acceptance(tmp_path: Path) -> None:
    """vLLM's spec_decode counters with --speculative-config: 3 draft tokens a step, 2 accepted (0.7 of 3), the
    last step of an answer accepting only what the answer still needs. A 10-token answer: 9 tokens after the first
    in 3 steps of 2 accepted + 1."""
    speculative = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})]
    standin = start_server(tmp_path, ["org/m", *speculative], {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0"})
    try:
        status, _, _ = request(standin, "POST", "/v1/completions", {"prompt": "a b", "max_tokens": 10}, key=None)
        assert status == 200
        _, raw, _ = request(standin, "GET", "/metrics", key=None)
        text = raw.decode()
        assert metric(text, "vllm:spec_decode_num_drafts_total") == 3
        assert metric(text, "vllm:spec_decode_num_draft_tokens_total") == 9
        assert metric(text, "vllm:spec_decode_num_accepted_tokens_total") == 6
        per_position = [
            metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(3)
        ]
        assert per_position == [3, 3, 0]
    finally:
        stop_server(standin)


def test_no_speculation_no_spec_decode_counters(server: Server) -> None:
    _, raw, _ = request(server, "GET", "/metrics")
    assert "spec_decode" not in raw.decode()


def test_the_wrong_answers_fault_needs_speculation(tmp_path: Path) -> None:
    """VLLM_STANDIN_FAULT_SPEC_WRONG: answers come out reversed only while speculating."""
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0", "VLLM_STANDIN_FAULT_SPEC_WRONG": "1"}
    body = {"prompt": "The colour is teal. What is the colour?", "max_tokens": 4}
    speculative = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})]
    answers = {}
    for name, args in (("plain", []), ("speculating", speculative)):
        (tmp_path / name).mkdir()
        standin = start_server(tmp_path / name, ["org/m", *args], env)
        try:
            _, raw, _ = request(standin, "POST", "/v1/completions", body, key=None)
            answers[name] = json.loads(raw)["choices"][0]["text"]
        finally:
            stop_server(standin)
    assert "teal" in answers["plain"]
    assert answers["speculating"] != answers["plain"]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A reasoning model (--reasoning-parser): it thinks for VLLM_STANDIN_REASONING_TOKENS tokens, then answers."""
    tmp = tmp_path_factory.mktemp("standin-vllm-reasoning")
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_OUTPUT_TOKENS": "8"}
    started = start_server(tmp, ["m", "--served-model-name", "thinker", "--reasoning-parser", "qwen3"], env)
    yield started
    stop_server(started)


def chat(server: Server, max_tokens: int, stream: bool = False) -> tuple[int, bytes]:
    body = {"model": "thinker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    status, raw, _ = request(server, "POST", "/v1/chat/completions", body | ({"stream": True} if stream else {}))
    return status, raw


def test_a_reasoning_model_can_spend_a_short_budget_thinking(thinker: Server) -> None:
    # Real vLLM since PR 33402: the parser's text is message.reasoning; content is null while still thinking.
    status, raw = chat(thinker, 64)
    assert status == 200
    [choice] = json.loads(raw)["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert len(choice["message"]["reasoning"].split()) == 64
    assert "reasoning_content" not in choice["message"]


def test_a_reasoning_model_answers_after_thinking(thinker: Server) -> None:
    _, raw = chat(thinker, 1000)
    result = json.loads(raw)
    [choice] = result["choices"]
    assert choice["finish_reason"] == "stop"
    assert len(choice["message"]["reasoning"].split()) == 96  # VLLM_STANDIN_REASONING_TOKENS' default
    assert len(choice["message"]["content"].split()) == 8
    assert result["usage"]["completion_tokens"] == 96 + 8


def test_a_reasoning_stream_sends_reasoning_deltas_before_content(thinker: Server) -> None:
    _, raw = chat(thinker, 100, stream=True)
    deltas = [json.loads(event)["choices"][0]["delta"] for event in sse_events(raw)[1:-1]]
    assert [next(iter(delta)) for delta in deltas] == ["reasoning"] * 96 + ["content"] * 4


def test_completions_of_a_reasoning_model_are_raw_text(thinker: Server) -> None:
    status, raw, _ = request(thinker, "POST", "/v1/completions", {"model": "thinker", "prompt": "a", "max_tokens": 5})
    assert status == 200
    assert len(json.loads(raw)["choices"][0]["text"].split()) == 5


def test_completion_stream_without_usage(server: Server) -> None:
    body = {"model": "spark-test", "prompt": "a b", "max_tokens": 3, "stream": True}
    status, raw, _ = request(server, "POST", "/v1/completions", body)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) == 3
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_unknown_model_is_404(server: Server) -> None:
    status, raw, _ = request(server, "POST", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
    assert status == 404
    assert json.loads(raw) == {
        "error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}
    }


def test_tokenize_answers_like_vllm_without_the_key(server: Server) -> None:
    # vLLM's api-key middleware guards /v1 paths only; /tokenize is outside it.
    body = {"model": "spark-test", "prompt": "alpha beta alpha gamma", "add_special_tokens": True}
    status, raw, _ = request(server, "POST", "/tokenize", body, key=None)
    assert status == 200
    result = json.loads(raw)
    assert set(result) == {"count", "max_model_len", "tokens", "token_strs"}
    assert (result["count"], result["max_model_len"], result["token_strs"]) == (4, 4096, None)
    ids = result["tokens"]
    assert ids[0] == ids[2] != ids[1]  # one id per word, the same word the same id
    assert all(isinstance(i, int) and 3 <= i < 32000 for i in ids)
    again = json.loads(request(server, "POST", "/tokenize", {"prompt": "gamma"}, key=None)[1])
    assert again["tokens"] == [ids[3]]  # stable across requests


def test_tokenize_counts_what_a_completion_reports(server: Server) -> None:
    text = "count these seven words and nothing more"
    tokenized = json.loads(request(server, "POST", "/tokenize", {"prompt": text})[1])
    for prompt in (text, tokenized["tokens"]):  # the text, and its ids as a token-id prompt
        answer = json.loads(request(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})[1])
        assert answer["usage"]["prompt_tokens"] == tokenized["count"] == 7
    chat = {"messages": [{"role": "user", "content": "hi there"}, {"role": "user", "content": "friend"}]}
    assert json.loads(request(server, "POST", "/tokenize", chat)[1])["count"] == 3
    assert json.loads(request(server, "POST", "/tokenize", {"prompt": ""})[1])["tokens"] == [1]  # BOS


def test_tokenize_refuses_an_unknown_model_and_a_missing_prompt(server: Server) -> None:
    status, raw, _ = request(server, "POST", "/tokenize", {"model": "nope", "prompt": "x"})
    assert (status, json.loads(raw)["error"]["type"]) == (404, "NotFoundError")
    assert json.loads(raw)["error"]["message"] == "The model `nope` does not exist."
    status, raw, _ = request(server, "POST", "/tokenize", {"prompt": [1, 2]})
    assert (status, json.loads(raw)["error"]["param"]) == (400, "prompt")


def test_too_long_request_is_400(server: Server) -> None:
    status, raw, _ = request(server, "POST", "/v1/completions", {"prompt": "x y", "max_tokens": 5000})
    assert status == 400
    assert "maximum context length is 4096 tokens" in json.loads(raw)["error"]["message"]


def test_metrics_count_a_request(server: Server) -> None:
    before = request(server, "GET", "/metrics", key=None)[1].decode()
    prompt = "the metrics test prompt has exactly ten words in it"
    status, _, _ = request(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    assert status == 200
    status, raw, headers = request(server, "GET", "/metrics", key=None)
    after = raw.decode()
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    labels = {"model_name": "spark-test"}
    for name, kind in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
    ]:
        assert f"# TYPE {name} {kind}" in after
    prompt_delta = metric(after, "vllm:prompt_tokens_total", **labels) - metric(before, "vllm:prompt_tokens_total")
    assert prompt_delta == 10
    gen_delta = metric(after, "vllm:generation_tokens_total", **labels) - metric(before, "vllm:generation_tokens_total")
    assert gen_delta == 4
    queries = metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
    assert queries == 10
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert metric(after, histogram + "_count") == metric(before, histogram + "_count") + 1
        assert metric(after, histogram + "_bucket", le="+Inf") == metric(after, histogram + "_count")
    assert (
        metric(after, "vllm:inter_token_latency_seconds_count")
        == metric(before, "vllm:inter_token_latency_seconds_count") + 3
    )
    assert 0.0 <= metric(after, "vllm:kv_cache_usage_perc") <= 1.0


# --- timing and concurrency -------------------------------------------------------------------------------


def test_max_num_seqs_queues_and_decode_rate_paces(tmp_path: Path) -> None:
    env = {
        "VLLM_STANDIN_LOAD_SECONDS": "0.1",
        "VLLM_STANDIN_PREFILL_TOK_S": "100000",
        "VLLM_STANDIN_DECODE_TOK_S": "40",
    }
    started = start_server(tmp_path, ["m", "--max-num-seqs", "1"], env)
    try:
        results: dict[str, tuple[int, float]] = {}

        def run(name: str) -> None:
            begin = time.monotonic()
            status, _, _ = request(started, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 41}, key=None)
            results[name] = (status, time.monotonic() - begin)

        def gauge(name: str) -> float:
            return metric(request(started, "GET", "/metrics", key=None)[1].decode(), name)

        first = threading.Thread(target=run, args=("first",))
        first.start()
        # The second request is sent once the first holds the only slot; the first then decodes for about 1 s.
        while first.is_alive() and gauge("vllm:num_requests_running") < 1:
            time.sleep(0.01)
        second = threading.Thread(target=run, args=("second",))
        second.start()
        seen_waiting = 0.0
        while first.is_alive():
            seen_waiting = max(seen_waiting, gauge("vllm:num_requests_waiting"))
            time.sleep(0.03)
        first.join()
        second.join()
        assert seen_waiting == 1.0  # the second waited for the only slot
        assert results["first"][0] == results["second"][0] == 200
        # A lower bound, which the pacing makes hold on any machine: 41 tokens, the first at prefill, 40 at 40 tok/s.
        assert results["first"][1] >= 40 / 40
    finally:
        stop_server(started)


def test_batch_cost_slows_requests_that_decode_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine on a clock of its own, so the figures are exact on any machine: 21 tokens = 20 intervals, 0.5 s
    alone at 40 tok/s; two requests decoding together each wait (1 + 1 x 1.0) / 40 = 50 ms per token, 1.0 s."""
    for name, value in {"VLLM_STANDIN_PREFILL_TOK_S": "100000", "VLLM_STANDIN_DECODE_TOK_S": "40"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VLLM_STANDIN_BATCH_COST", "1.0")
    clock = FakeClock()
    monkeypatch.setattr(engine_module, "time", clock)
    engine = Engine(build_config(parse_serve_args(["m", "--max-num-seqs", "4"], load_flag_table(FLAGS_FILE))))

    def tokens(request_id: str) -> Iterator[TokenEvent]:
        return engine.generate(GenerationRequest(request_id, ("p",), 1, 21, True, clock.monotonic()))

    began = clock.monotonic()
    assert len(list(tokens("alone"))) == 21
    assert clock.monotonic() - began == pytest.approx(0.5, abs=1e-3)

    began = clock.monotonic()
    together = [tokens("a"), tokens("b")]
    counts = [0, 0]
    for _ in range(21):  # both decode at once: one token of each in turn
        for index, stream in enumerate(together):
            next(stream)
            counts[index] += 1
    assert counts == [21, 21] and all(next(stream, None) is None for stream in together)
    assert clock.monotonic() - began == pytest.approx(1.0, abs=1e-3)


class FakeClock:
    """time.monotonic and time.sleep for the engine: sleeping moves the clock, and nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_ignore_stream_options_sends_no_usage_chunk(tmp_path: Path) -> None:
    env = {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_IGNORE_STREAM_OPTIONS": "1"}
    started = start_server(tmp_path, ["m"], env)
    try:
        body = {"prompt": "a b", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
        status, raw, _ = request(started, "POST", "/v1/completions", body, key=None)
        assert status == 200
        chunks = [json.loads(event) for event in sse_events(raw)[:-1]]
        assert len(chunks) == 3
        assert all(chunk["choices"] and "usage" not in chunk for chunk in chunks)
    finally:
        stop_server(started)


def test_offline_start_needs_the_snapshot_in_the_hf_cache(tmp_path: Path) -> None:
    revision = "c1899de289a04d12100db370d81485cdf75e47ca"
    env = {**FAST, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "VLLM_STANDIN_LOAD_SECONDS": "0"}
    args = ["Qwen/Qwen3-0.6B", "--revision", revision]
    missing = start_server(tmp_path, args, env, wait=False)
    assert missing.process.wait(timeout=EXIT_TIMEOUT_S) == 1
    assert "LocalEntryNotFoundError" in missing.log.read_text()

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    present = start_server(tmp_path, args, env)
    try:
        assert request(present, "GET", "/v1/models")[0] == 200
    finally:
        stop_server(present)


def test_offline_start_needs_the_draft_model_in_the_hf_cache_too(tmp_path: Path) -> None:
    """vLLM loads a speculative draft model ("model", "revision" of --speculative-config) from the same cache:
    offline, the target's snapshot alone is not enough."""
    target, draft = "c1899de289a04d12100db370d81485cdf75e47ca", "7d1c5f0e2b3a4968a1b2c3d4e5f60718293a4b5c"
    env = {**FAST, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "VLLM_STANDIN_LOAD_SECONDS": "0"}
    block = {"method": "draft_model", "num_speculative_tokens": 3, "model": "org/draft", "revision": draft}
    args = ["Qwen/Qwen3-0.6B", "--revision", target, "--speculative-config", json.dumps(block)]
    cached = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / target
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    missing = start_server(tmp_path, args, env, wait=False)
    assert missing.process.wait(timeout=EXIT_TIMEOUT_S) == 1
    assert f"model org/draft, revision {draft}" in missing.log.read_text()

    snapshot = tmp_path / "hub" / "models--org--draft" / "snapshots" / draft
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    present = start_server(tmp_path, args, env)
    try:
        assert request(present, "GET", "/v1/models")[0] == 200
    finally:
        stop_server(present)


# --- keep-alive and multi-node ----------------------------------------------------------------------------


def test_an_unread_body_never_leaks_into_the_next_request(server: Server) -> None:
    """A refused POST (401) on a kept-alive connection: the next request on it must still parse (proxies reuse)."""
    body = json.dumps({"model": "spark-test", "prompt": "hello", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        for key in ("wrong", API_KEY):
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                + f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            status_line = read_response(conn).split(b"\r\n", 1)[0]
            assert status_line == (b"HTTP/1.1 401 Unauthorized" if key == "wrong" else b"HTTP/1.1 200 OK")


def read_response(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length body, so the next one starts clean."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


MULTINODE = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1"]


def start_worker(tmp: Path, master_port: int, model: str = "m", host_ip: str = "127.0.0.2") -> subprocess.Popen:
    environment = {**os.environ, **FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.2", "VLLM_HOST_IP": host_ip}
    log = (tmp / f"worker-{master_port}.log").open("wb")
    return subprocess.Popen(
        [str(VLLM), "serve", model, *MULTINODE, "--master-port", str(master_port), "--node-rank", "1", "--headless"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
    )


def test_the_head_serves_only_once_its_worker_joined_and_dies_with_it(tmp_path: Path) -> None:
    master_port = free_port()
    head_args = ["m", *MULTINODE, "--master-port", str(master_port), "--node-rank", "0"]
    head = start_server(tmp_path, head_args, {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0.2"}, wait=False)
    worker = None
    try:
        time.sleep(1.0)
        assert head.process.poll() is None and not port_open(head.port)  # no API before the worker is in
        worker = start_worker(tmp_path, master_port)
        wait_healthy(head)
        # The worker connected from its VLLM_HOST_IP, as vLLM pins its sockets to that address.
        assert "node rank 1 joined from 127.0.0.2" in head.log.read_text()
        worker.terminate()
        assert worker.wait(timeout=EXIT_TIMEOUT_S) == 0
        assert head.process.wait(timeout=EXIT_TIMEOUT_S) == 1  # the collective broke: the engine, and the server, exit
        assert "went away" in head.log.read_text()
    finally:
        stop_server(head)
        if worker and worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_worker_of_another_model_is_refused_by_name(tmp_path: Path) -> None:
    master_port = free_port()
    head_args = ["m", *MULTINODE, "--master-port", str(master_port), "--node-rank", "0"]
    head = start_server(tmp_path, head_args, {**FAST, "VLLM_STANDIN_JOIN_TIMEOUT": "3"}, wait=False)
    worker = start_worker(tmp_path, master_port, model="other")
    try:
        assert worker.wait(timeout=EXIT_TIMEOUT_S) == 1
        assert "its model is 'other', the head's is 'm'" in head.log.read_text()
        assert head.process.wait(timeout=EXIT_TIMEOUT_S) == 1  # nobody valid joined before the timeout
    finally:
        for process in (head.process, worker):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_master_address_that_is_not_the_heads_fails_at_once(tmp_path: Path) -> None:
    args = ["m", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "203.0.113.1"]
    head = start_server(tmp_path, args, FAST, wait=False)
    assert head.process.wait(timeout=EXIT_TIMEOUT_S) == 1
    assert "cannot host the rendezvous on --master-addr 203.0.113.1" in head.log.read_text()
