"""The stand-in's pooling models: what vLLM 0.33 serves with --runner pooling instead of the generation API.

Which task (vLLM's ModelConfig rules for a *ForCausalLM checkpoint): --convert embed or classify when given;
else classify when --hf-overrides names a *ForSequenceClassification architecture (Qwen3-Reranker's recipe);
else embed. A pooling server registers no /v1/completions or /v1/chat/completions (404, FastAPI's "Not Found"),
and serves /v1/embeddings (embed) or /rerank, /v1/rerank, /v2/rerank (classify), in the shapes of vLLM's
EmbeddingResponse and RerankResponse (tests/contracts/vllm/openai-schemas.json holds them; the contract test
checks these answers against it).

The numbers are a stand-in's, not a model's: an embedding is a hashed bag of the text's words, L2-normalised (vLLM's
embed pooler normalises), so texts that share words are close; a rerank score is the share of the query's words a
document holds, so the document that repeats the query's words ranks first. Prompt tokens are counted one per
whitespace word, as the rest of the stand-in counts them.
"""

from __future__ import annotations

import json
import math
import re
import time
import zlib
from http import HTTPStatus

EMBED, CLASSIFY = "embed", "classify"
DIMENSION = 64
WORD = re.compile(r"[a-z0-9]+")


def pooling_task(values: dict) -> str | None:
    """The task a pooling server runs, or None for a generating one (vLLM's --runner auto resolves a checkpoint
    the stand-in cannot read to generate)."""
    convert = values.get("convert")
    if values.get("runner") != "pooling" and convert in (None, "auto", "none"):
        return None
    if convert in (EMBED, CLASSIFY):
        return str(convert)
    overrides = values.get("hf_overrides")
    try:
        architectures = (json.loads(overrides) if isinstance(overrides, str) else {}).get("architectures") or []
    except ValueError:
        architectures = []
    if any(str(name).endswith("ForSequenceClassification") for name in architectures):
        return CLASSIFY
    return EMBED


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def embedding(text: str, dimension: int = DIMENSION) -> list[float]:
    vector = [0.0] * dimension
    for word in _words(text):
        vector[zlib.crc32(word.encode()) % dimension] += 1.0
    norm = math.sqrt(sum(value * value for value in vector)) or 1.0
    return [value / norm for value in vector]


def _texts(value: object, field: str) -> list[str]:
    from .protocol import ApiError

    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return list(value)
    raise ApiError(HTTPStatus.BAD_REQUEST, f"{field} must be a string or a non-empty list of strings.", param=field)


def embeddings_response(body: dict, config) -> dict:
    """POST /v1/embeddings -> vLLM's EmbeddingResponse."""
    from .protocol import _resolve_model, random_id  # protocol reads config, which reads this module

    model = _resolve_model(body, config)
    texts = _texts(body.get("input"), "input")
    tokens = sum(max(1, len(text.split())) for text in texts)
    return {
        "id": random_id("embd"),
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "embedding", "embedding": embedding(text)} for i, text in enumerate(texts)],
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


def _score(query_text: str, query_words: set[str], document: str, config) -> float:
    """A classifier's score: the share of the query's words the document holds; an embedding model's (vLLM scores
    with it too): the cosine of the two embeddings."""
    if config.pooling == EMBED:
        return sum(a * b for a, b in zip(embedding(query_text), embedding(document), strict=True))
    return len(query_words & set(_words(document))) / max(1, len(query_words))


def rerank_response(body: dict, config) -> dict:
    """POST /rerank (and /v1/rerank, /v2/rerank) -> vLLM's RerankResponse, best first, top_n when given."""
    from .protocol import ApiError, _resolve_model, random_id

    model = _resolve_model(body, config)
    if not isinstance(body.get("query"), str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "query must be a string.", param="query")
    query = set(_words(body["query"]))
    documents = _texts(body.get("documents"), "documents")
    results = [
        {
            "index": index,
            "document": {"text": text, "multi_modal": None},
            "relevance_score": _score(body["query"], query, text, config),
        }
        for index, text in enumerate(documents)
    ]
    results.sort(key=lambda row: -row["relevance_score"])
    top_n = body.get("top_n") or 0
    if isinstance(top_n, int) and top_n > 0:
        results = results[:top_n]
    tokens = sum(len(body["query"].split()) + len(text.split()) for text in documents)
    return {
        "id": random_id("score"),
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }
