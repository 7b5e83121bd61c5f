"""What a served model answers: its kind (a recipe's `kind`, default chat), the one place each kind's API lives.

- chat: a generative model behind /v1/chat/completions (and the rest of the OpenAI API); the health gate's smoke
  request, quality gate and the bench measure it.
- embed: a pooling model behind /v1/embeddings (vLLM's `--runner pooling`, `--convert embed` for a *ForCausalLM
  checkpoint such as Qwen3-Embedding).
- rerank: a pooling model behind /v1/rerank (Jina/Cohere shape; vLLM serves /rerank too, which only sparkfleet's key
  guard asks the key for), a cross-encoder such as Qwen3-Reranker.

A pooling kind has no chat API, so its gate probes its own endpoint with a request whose right answer is known
whatever the model: two paraphrases embed closer together than an unrelated sentence; the passage that answers
the query ranks first. Request and response shapes are vLLM 0.33's (EmbeddingResponse, RerankResponse; their
JSON schemas are in tests/contracts/vllm/openai-schemas.json).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

CHAT = "chat"
KINDS = (CHAT, "embed", "rerank")
# The serve flag every pooling kind needs (vLLM would otherwise run a *ForCausalLM checkpoint as a generator).
POOLING_FLAGS = {"embed": {"runner": "pooling"}, "rerank": {"runner": "pooling"}}
# Where each pooling kind answers. vLLM 0.33 serves a reranker at /rerank, /v1/rerank and /v2/rerank (its own key
# guards /v1 and /v2 only; sparkfleet's key guard covers the rest: module_utils/key_guard.py), and the router's front
# forwards /v1 only: /v1/rerank.
PATHS = {"embed": "/v1/embeddings", "rerank": "/v1/rerank"}

PARAPHRASES = ("The cat sits on the mat.", "A cat is sitting on the mat.")
UNRELATED = "Quarterly revenue rose by four percent."
QUERY = "What is the capital of France?"
DOCUMENTS = (
    "Paris is the capital and largest city of France.",
    "Photosynthesis turns light into chemical energy in plants.",
    "The stock market closed higher on Tuesday.",
)


def kind_of(recipe: Mapping) -> str:
    return recipe.get("kind") or CHAT


def is_chat(recipe: Mapping) -> bool:
    return kind_of(recipe) == CHAT


def kind_problems(recipe: Mapping, label: str) -> list[str]:
    """The recipe's kind (none: chat), and the serve flags it needs, each with the fix."""
    kind = kind_of(recipe)
    if kind not in KINDS:
        return [f"{label}.kind={kind!r}: expected one of {', '.join(KINDS)} (none: chat)"]
    flags = recipe.get("serve_flags") if isinstance(recipe.get("serve_flags"), Mapping) else {}
    problems = []
    for name, value in POOLING_FLAGS.get(kind, {}).items():
        if flags.get(name) != value:
            problems.append(f"{label}.serve_flags.{name}: a {kind} model is served with {name}: {value}; add it")
    if kind == CHAT and flags.get("runner") == "pooling":
        problems.append(
            f"{label}.serve_flags.runner=pooling: a pooling model has no chat API; set kind: embed or rerank"
        )
    if kind == CHAT and flags.get("convert") in ("embed", "classify"):
        problems.append(
            f"{label}.serve_flags.convert={flags['convert']}: that makes a pooling model, which has no chat API; set "
            "kind: embed or rerank"
        )
    return problems


def warm_up(kind: str, served: str) -> tuple[str, dict]:
    """(path, body) of the first request after a start: a streamed chat request, or the kind's own probe."""
    if kind == CHAT:
        body = {"model": served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
        return "/v1/chat/completions", body
    return probe(kind, served)


def example(kind: str, served: str) -> dict:
    """The request a person tries first (the run's summary prints it as a curl line): path and JSON body."""
    if kind == CHAT:
        return {
            "path": "/v1/chat/completions",
            "body": {"model": served, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64},
        }
    if kind == "embed":
        return {"path": PATHS[kind], "body": {"model": served, "input": "Hello!"}}
    return {"path": PATHS[kind], "body": {"model": served, "query": QUERY, "documents": list(DOCUMENTS[:2])}}


def probe(kind: str, served: str) -> tuple[str, dict]:
    """(path, body) of the gate's request to a pooling kind."""
    if kind == "embed":
        return PATHS[kind], {"model": served, "input": [*PARAPHRASES, UNRELATED]}
    return PATHS[kind], {"model": served, "query": QUERY, "documents": list(DOCUMENTS)}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _cosine(left: list[float], right: list[float]) -> float:
    dot = sum(a * b for a, b in zip(left, right, strict=True))
    norms = math.sqrt(sum(a * a for a in left)) * math.sqrt(sum(b * b for b in right))
    return dot / norms if norms else 0.0


def embed_problems(answer: Mapping, served: str) -> tuple[list[str], dict]:
    """What is wrong with an /v1/embeddings answer to the probe, and what it found (dimension, similarities)."""
    data = sorted(answer.get("data") or [], key=lambda row: row.get("index", -1) if isinstance(row, Mapping) else -1)
    vectors = [row.get("embedding") for row in data if isinstance(row, Mapping)]
    if len(vectors) != 3 or not all(isinstance(v, list) and v and all(map(_number, v)) for v in vectors):
        return [f"expected 3 embeddings of finite numbers (one per input), got {str(answer)[:300]}"], {}
    problems = []
    if len({len(vector) for vector in vectors}) != 1:
        problems.append(f"the embeddings differ in dimension: {[len(vector) for vector in vectors]}")
        return problems, {}
    close, far = _cosine(vectors[0], vectors[1]), _cosine(vectors[0], vectors[2])
    found = {"dimension": len(vectors[0]), "paraphrase_cosine": round(close, 4), "unrelated_cosine": round(far, 4)}
    if not close > far:
        problems.append(
            f"two paraphrases ({PARAPHRASES[0]!r}, {PARAPHRASES[1]!r}) embed no closer (cosine {close:.4f}) than an "
            f"unrelated sentence ({UNRELATED!r}, cosine {far:.4f}): the model does not embed meaning"
        )
    problems += _common_problems(answer, served)
    return problems, found


def rerank_problems(answer: Mapping, served: str) -> tuple[list[str], dict]:
    """What is wrong with a /v1/rerank answer to the probe, and what it found (the ranking and its scores)."""
    results = [row for row in answer.get("results") or [] if isinstance(row, Mapping)]
    if len(results) != len(DOCUMENTS) or not all(_number(row.get("relevance_score")) for row in results):
        return [f"expected {len(DOCUMENTS)} results, each with a relevance_score, got {str(answer)[:300]}"], {}
    ranked = sorted(results, key=lambda row: -row["relevance_score"])
    found = {
        "ranking": [row.get("index") for row in ranked],
        "scores": [round(row["relevance_score"], 4) for row in ranked],
    }
    problems = []
    if ranked[0].get("index") != 0:
        problems.append(
            f"the passage that answers {QUERY!r} ({DOCUMENTS[0]!r}) does not rank first: ranking {found['ranking']}, "
            f"scores {found['scores']}"
        )
    problems += _common_problems(answer, served)
    return problems, found


def _common_problems(answer: Mapping, served: str) -> list[str]:
    problems = []
    if answer.get("model") != served:
        problems.append(f"the answer names model {answer.get('model')!r}, not {served!r}")
    usage = answer.get("usage") if isinstance(answer.get("usage"), Mapping) else {}
    if not (isinstance(usage.get("prompt_tokens"), int) and usage["prompt_tokens"] > 0):
        problems.append(f"the answer counts no prompt tokens: usage {usage}")
    return problems


def probe_problems(kind: str, answer: Mapping, served: str) -> tuple[list[str], dict]:
    """The probe's verdict for a pooling kind: (problems, what it found)."""
    return (embed_problems if kind == "embed" else rerank_problems)(answer, served)
