"""Model kinds beyond chat (module_utils/model_kinds.py, library/vllm_model_probe.py): a recipe's kind needs its
serve flags; an embedding or reranking model's gate probes its own endpoint with a request whose right answer is
known, passes on the stand-in vLLM serving it with the recipe's flags, and names what is wrong when the answer is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import ROOT
from helpers.vllm_standin import API_KEY, FAST, Server, start_server, stop_server
from model_kinds import embed_problems, kind_problems, rerank_problems
from recipe_rules import load_recipe, serve_args
from vllm_flags import load_flag_list

RECIPES = ROOT / "recipes"
EMBEDDER, RERANKER = "qwen3-embedding-0.6b", "qwen3-reranker-0.6b"


def test_a_kind_needs_its_flags_and_a_chat_model_is_not_pooled():
    assert kind_problems({"kind": "embed", "serve_flags": {"runner": "pooling"}}, "r") == []
    assert kind_problems({"kind": "rerank", "serve_flags": {}}, "r") == [
        "r.serve_flags.runner: a rerank model is served with runner: pooling; add it"
    ]
    assert kind_problems({"serve_flags": {"runner": "pooling"}, "kind": "chat"}, "r") == [
        "r.serve_flags.runner=pooling: a pooling model has no chat API; set kind: embed or rerank"
    ]
    assert kind_problems({"kind": "vision"}, "r") == [
        "r.kind='vision': expected one of chat, embed, rerank (none: chat)"
    ]
    # No kind is chat: a pooling runner or conversion without one is refused too.
    assert kind_problems({"serve_flags": {"runner": "pooling"}}, "r") == [
        "r.serve_flags.runner=pooling: a pooling model has no chat API; set kind: embed or rerank"
    ]
    assert kind_problems({"serve_flags": {"convert": "embed"}}, "r") == [
        "r.serve_flags.convert=embed: that makes a pooling model, which has no chat API; set kind: embed or rerank"
    ]


def vectors(*rows: list[float]) -> dict:
    data = [{"index": index, "embedding": row} for index, row in enumerate(rows)]
    return {"model": "e", "data": data, "usage": {"prompt_tokens": 12}}


def test_the_embedding_verdict_wants_paraphrases_closer_than_an_unrelated_sentence():
    problems, found = embed_problems(vectors([1, 0], [0.9, 0.1], [0, 1]), "e")
    assert problems == [] and found["dimension"] == 2
    assert found["paraphrase_cosine"] > found["unrelated_cosine"]
    problems, _ = embed_problems(vectors([1, 0], [0, 1], [1, 0]), "e")
    assert len(problems) == 1 and "embed no closer (cosine 0.0000) than an unrelated sentence" in problems[0]
    assert "differ in dimension" in embed_problems(vectors([1, 0], [1, 0, 0], [0, 1]), "e")[0][0]
    assert embed_problems({"data": []}, "e")[0][0].startswith("expected 3 embeddings")
    nameless = {**vectors([1, 0], [1, 0], [0, 1]), "model": "other", "usage": {}}
    assert embed_problems(nameless, "e")[0] == [
        "the answer names model 'other', not 'e'",
        "the answer counts no prompt tokens: usage {}",
    ]


def test_the_rerank_verdict_wants_the_answering_passage_first():
    def answer(*scores: float) -> dict:
        results = [{"index": index, "relevance_score": score} for index, score in enumerate(scores)]
        return {"model": "r", "results": results, "usage": {"prompt_tokens": 30}}

    problems, found = rerank_problems(answer(0.9, 0.1, 0.2), "r")
    assert problems == [] and found["ranking"] == [0, 2, 1]
    problems, _ = rerank_problems(answer(0.1, 0.9, 0.2), "r")
    assert len(problems) == 1 and "does not rank first: ranking [1, 2, 0]" in problems[0]
    assert rerank_problems(answer(0.5, 0.1), "r")[0][0].startswith("expected 3 results")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """The stand-in vLLM started with each pooling recipe's own serve arguments, behind the key."""
    flags = load_flag_list(RECIPES / "vllm-serve-flags.txt")
    servers = {}
    for name in (EMBEDDER, RERANKER):
        # Unpinned recipes: the commit the models lock would hold.
        args = serve_args({**load_recipe(name, RECIPES), "hf_revision": "a" * 40}, flags)
        folder = tmp_path_factory.mktemp(name)
        servers[name] = start_server(folder, [*args, "--api-key", API_KEY], {**FAST, "VLLM_STANDIN_LOAD_SECONDS": "0"})
    yield servers
    for server in servers.values():
        stop_server(server)


@pytest.mark.parametrize(("name", "kind"), [(EMBEDDER, "embed"), (RERANKER, "rerank")])
def test_each_pooling_recipe_passes_its_gate_on_the_standin(run_module, served, name, kind):
    server = served[name]
    done = run_module("vllm_model_probe", {"url": server.base, "served": name, "kind": kind, "api_key": API_KEY})
    assert not done.get("failed"), done.get("msg")
    if kind == "embed":
        assert done["found"]["paraphrase_cosine"] > done["found"]["unrelated_cosine"]
    else:
        assert done["found"]["ranking"][0] == 0


def test_a_probe_of_the_wrong_kind_or_without_the_key_names_what_came_back(run_module, served):
    embedder = served[EMBEDDER]
    reranker = served[RERANKER]
    wrong = run_module(
        "vllm_model_probe", {"url": reranker.base, "served": RERANKER, "kind": "embed", "api_key": API_KEY}
    )
    assert wrong["failed"] and wrong["msg"].startswith(
        f"The embed probe to {reranker.base}/v1/embeddings failed: HTTP Error 404"
    )
    keyless = run_module("vllm_model_probe", {"url": embedder.base, "served": EMBEDDER, "kind": "embed"})
    assert keyless["failed"] and "HTTP Error 401" in keyless["msg"]
