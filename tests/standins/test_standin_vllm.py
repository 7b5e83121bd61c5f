"""Tests of the stand-in vLLM server (tests/standins/vllm): real processes, real sockets, real HTTP.

Each server is started as a subprocess on 127.0.0.1 with a free port, a short load delay and fast token rates,
and is stopped by the test that started it. The flag-parsing rules are also checked directly on the package.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN_DIR = REPO / "tests" / "standins" / "vllm"
VLLM = STANDIN_DIR / "vllm"
FLAGS_FILE = REPO / "recipes" / "vllm-serve-flags.txt"

sys.path.insert(0, str(STANDIN_DIR))
from vllm_standin.flags import (  # noqa: E402 -- importable only once its directory is on sys.path
    UsageError,
    load_flag_table,
    normalize_argv,
    parse_serve_args,
)

API_KEY = "test-key-123"
FAST = {"VLLM_STANDIN_PREFILL_TOK_S": "1000000", "VLLM_STANDIN_DECODE_TOK_S": "100000"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    started: float
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_server(tmp: Path, args: list[str], env: dict[str, str], wait: bool = True) -> Server:
    port = free_port()
    log = tmp / f"vllm-{port}.log"
    environment = {**os.environ, **env}
    environment.pop("VLLM_API_KEY", None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(VLLM), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    server = Server(process=process, port=port, started=time.monotonic(), log=log)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: Server, timeout: float = 180.0) -> None:
    # Generous: a busy 2-core CI machine can take long to start Python; a dead process fails at once.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.log.read_text()
        try:
            with urllib.request.urlopen(server.base + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    raise AssertionError(f"stand-in not healthy after {timeout} s:\n{server.log.read_text()}")


def stop_server(server: Server) -> None:
    """Stop only the process this test started."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def request(
    server: Server, method: str, path: str, body: object | None = None, key: str | None = API_KEY
) -> tuple[int, bytes, dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server.base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


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
            status, _, _ = request(started, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 13}, key=None)
            results[name] = (status, time.monotonic() - begin)

        first = threading.Thread(target=run, args=("first",))
        first.start()
        time.sleep(0.1)
        second = threading.Thread(target=run, args=("second",))
        second.start()
        seen_waiting = 0.0
        while first.is_alive():
            page = request(started, "GET", "/metrics", key=None)[1].decode()
            seen_waiting = max(seen_waiting, metric(page, "vllm:num_requests_waiting"))
            time.sleep(0.03)
        first.join()
        second.join()
        assert seen_waiting == 1.0
        assert results["first"][0] == results["second"][0] == 200
        assert results["first"][1] >= 12 / 40  # 13 tokens: the first at prefill, then 12 at 40 tok/s
        assert results["second"][1] >= results["first"][1]  # it waited for the only slot
    finally:
        stop_server(started)


def timed_completion(server: Server, max_tokens: int) -> float:
    begin = time.monotonic()
    status, _, _ = request(server, "POST", "/v1/completions", {"prompt": "p", "max_tokens": max_tokens}, key=None)
    assert status == 200
    return time.monotonic() - begin


def test_batch_cost_slows_requests_that_decode_together(tmp_path: Path) -> None:
    # 21 tokens = 20 intervals: 0.5 s alone at 40 tok/s; two together wait (1 + 1 x 1.0) / 40 = 50 ms per token.
    env = {
        "VLLM_STANDIN_LOAD_SECONDS": "0.1",
        "VLLM_STANDIN_PREFILL_TOK_S": "100000",
        "VLLM_STANDIN_DECODE_TOK_S": "40",
    }
    started = start_server(tmp_path, ["m", "--max-num-seqs", "4"], {**env, "VLLM_STANDIN_BATCH_COST": "1.0"})
    try:
        alone = timed_completion(started, 21)
        durations: list[float] = []
        threads = [threading.Thread(target=lambda: durations.append(timed_completion(started, 21))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert 0.5 <= alone < 0.6
        assert all(0.95 <= duration < 1.15 for duration in durations), durations
    finally:
        stop_server(started)


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
    assert missing.process.wait(timeout=10) == 1
    assert "LocalEntryNotFoundError" in missing.log.read_text()

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / revision
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
        assert worker.wait(timeout=5) == 0
        assert head.process.wait(timeout=5) == 1  # the collective broke: the engine, and the server, exit
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
        assert worker.wait(timeout=10) == 1
        assert "its model is 'other', the head's is 'm'" in head.log.read_text()
        assert head.process.wait(timeout=10) == 1  # nobody valid joined before the timeout
    finally:
        for process in (head.process, worker):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_master_address_that_is_not_the_heads_fails_at_once(tmp_path: Path) -> None:
    args = ["m", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "203.0.113.1"]
    head = start_server(tmp_path, args, FAST, wait=False)
    assert head.process.wait(timeout=10) == 1
    assert "cannot host the rendezvous on --master-addr 203.0.113.1" in head.log.read_text()
