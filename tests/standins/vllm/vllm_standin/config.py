"""Turn parsed `vllm serve` flags and VLLM_STANDIN_* environment variables into the stand-in's settings.

Only the flags that change what a client can observe are interpreted (address, names, limits, auth, prefix
caching, headless). Every other real flag is accepted and ignored, because it tunes GPU work the stand-in does
not do. Defaults follow vLLM where vLLM has one; the rest are documented in README.md.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from .flags import ParsedArgs, UsageError
from .multinode import Topology, topology_from
from .pooling import pooling_task

# What `vllm serve` serves when neither model_tag nor --model is given (ModelConfig.model in recent vLLM).
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
# vLLM's default for the OpenAI server when --max-num-seqs is not given (SchedulerConfig, GPU usage context).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class Rates:
    """The timing model: how long "loading", prefill and decode take (published DGX Spark figures by default)."""

    load_seconds: float
    prefill_tok_s: float
    decode_tok_s: float
    # Each of n requests decoding together waits (1 + (n - 1) * batch_cost) / decode_tok_s per token: the batch
    # shares one 273 GB/s bus, so a concurrency sweep shows a knee. 0 (default): requests never slow each other.
    batch_cost: float = 0.0


@dataclass(frozen=True)
class Speculation:
    """--speculative-config: vLLM's speculative-decoding counters with a known acceptance. Each decoding step
    drafts `tokens` and accepts round(acceptance x tokens) of them (VLLM_STANDIN_SPEC_ACCEPTANCE, default 0.7),
    fewer at the end of an answer, and emits one token more. The answer does not change; a step takes the time of
    one plain decode step (the draft is counted free), so decode runs tokens_per_step times as fast: what
    speculation buys a memory-bound decode, in its best case."""

    tokens: int = 0  # num_speculative_tokens; 0: no speculation
    acceptance: float = 0.7
    # The draft model ("model", "revision"): vLLM loads it as it loads the target, from the cache when offline.
    draft_model: str | None = None
    draft_revision: str | None = None

    @property
    def accepted_per_draft(self) -> int:
        return round(self.acceptance * self.tokens)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one decoding step emits: the accepted draft tokens and one more (1 without speculation)."""
        return 1 + self.accepted_per_draft


@dataclass(frozen=True)
class Faults:
    """Misbehaviour on purpose, so that the quality gate can be shown catching it. Counted in generation requests
    (chat and completions) since the start; 0: never.

    VLLM_STANDIN_FAULT_WRONG_AFTER=N: from request N+1 on, every answer's text comes out reversed (a server that
    starts answering garbage after a few good requests).
    VLLM_STANDIN_FAULT_TRUNCATE_AFTER=N: from request N+1 on, a stream stops after its first token, without the
    usage chunk and `data: [DONE]` (a stream cut short under load).
    VLLM_STANDIN_FAULT_CONTEXT_WORDS=N: answers read only the last N words of the prompt, so a fact placed earlier
    in a long prompt is lost (a model that drops the start of its context).
    VLLM_STANDIN_FAULT_SPEC_WRONG=1: with --speculative-config, every answer's text comes out reversed (a draft
    path that corrupts the output, as reported for prefix caching with MTP; the quality gate's canaries, recorded
    without speculation, catch it).
    A slow start needs no fault of its own: VLLM_STANDIN_LOAD_SECONDS sets how long the weights "load"."""

    wrong_after: int = 0
    truncate_after: int = 0
    context_words: int = 0
    wrong_when_speculating: bool = False

    def wrong(self, number: int, speculating: bool = False) -> bool:
        return 0 < self.wrong_after < number or (self.wrong_when_speculating and speculating)

    def truncated(self, number: int) -> bool:
        return 0 < self.truncate_after < number


@dataclass(frozen=True)
class ServeConfig:
    """Everything the server and engine need, already validated."""

    model: str
    revision: str | None
    served_model_names: tuple[str, ...]
    host: str
    port: int
    api_keys: tuple[str, ...]
    max_model_len: int
    max_num_seqs: int
    enable_prefix_caching: bool
    block_size: int
    headless: bool
    kv_cache_tokens: int
    natural_output_tokens: int
    # --reasoning-parser: a chat answer starts with this many tokens of reasoning (message.reasoning), then the
    # natural_output_tokens of content, as a thinking model's does. 0 without a parser.
    reasoning_tokens: int
    rates: Rates
    version: str
    force_include_usage: bool
    topology: Topology | None = None  # --nnodes > 1: this node's rank, head address, ...
    # VLLM_STANDIN_IGNORE_STREAM_OPTIONS=1: act like an OpenAI-compatible server that drops stream_options
    # (no usage chunk), so clients can test their error for a server without usage reporting.
    ignore_stream_options: bool = False
    faults: Faults = Faults()
    speculation: Speculation = Speculation()
    # --runner pooling: "embed" or "classify" (pooling.py), None for a generating server.
    pooling: str | None = None
    # --middleware: ASGI middleware import paths. vLLM takes several; the flag list reads it as one value.
    middleware: tuple[str, ...] = ()

    @property
    def metrics_model_name(self) -> str:
        """vLLM labels metrics with the first served name (ModelConfig.served_model_name)."""
        return self.served_model_names[0]


def standin_version() -> str:
    """What /version and ``vllm --version`` report; set VLLM_STANDIN_VERSION to imitate a release."""
    return os.environ.get("VLLM_STANDIN_VERSION", "0.0.0+standin")


def human_readable_int(flag: str, text: str) -> int:
    """vLLM's human-readable integers: 1k = 1000, 1K = 1024, 25.6k = 25600 (decimal suffixes allow floats)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", text.strip())
    if not match:
        raise UsageError(f"argument {flag}: invalid human_readable_int value: '{text}'")
    number, suffix = match.groups()
    if suffix in ("K", "M", "G", "T"):
        if "." in number:
            raise UsageError(f"argument {flag}: binary suffix {suffix} needs an integer: '{text}'")
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
    scale = 1000 ** ("kmgt".index(suffix) + 1) if suffix else 1
    return int(float(number) * scale) if suffix else int(number)


def _int(flag: str, value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise UsageError(f"argument {flag}: invalid int value: '{value}'") from None


def _float(flag: str, value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        raise UsageError(f"argument {flag}: invalid float value: '{value}'") from None


def env_float(name: str, default: float, minimum: float = 0.0) -> float:
    """A positive float from the environment; a bad value stops the stand-in with a message naming it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"environment variable {name}={raw!r} must be a finite number >= {minimum}")
    return value


def build_config(parsed: ParsedArgs) -> ServeConfig:
    """Validate the flags the stand-in uses and combine them with the VLLM_STANDIN_* settings."""
    values = parsed.values
    # vLLM: the positional model_tag wins over --model; with neither, ModelConfig's default model is served.
    model = parsed.model_tag or str(values.get("model") or DEFAULT_MODEL)
    names_value = values.get("served_model_name")
    served = tuple(names_value) if isinstance(names_value, list) and names_value else (model,)

    port = _int("--port", values.get("port", 8000))
    if not 0 <= port <= 65535:
        raise UsageError(f"argument --port: {port} is not a TCP port")

    # vLLM takes the key from --api-key (one or more) or, without it, from $VLLM_API_KEY.
    keys_value = values.get("api_key")
    if isinstance(keys_value, list):
        api_keys = tuple(k for k in keys_value if k)
    else:
        api_keys = tuple(k for k in [os.environ.get("VLLM_API_KEY", "")] if k)

    native_len = int(env_float("VLLM_STANDIN_MODEL_MAX_LEN", 131072, minimum=1))
    raw_len = values.get("max_model_len")
    if raw_len is None or str(raw_len) in ("auto", "-1"):
        max_model_len = native_len
    else:
        max_model_len = human_readable_int("--max-model-len", str(raw_len))
    if max_model_len < 1:
        raise UsageError("argument --max-model-len: must be at least 1")

    max_num_seqs = _int("--max-num-seqs", values.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))
    if max_num_seqs < 1:
        raise UsageError("argument --max-num-seqs: must be at least 1")

    if "optimization_level" in values:
        level = str(values["optimization_level"])
        if level not in {"0", "1", "2", "3"}:
            raise UsageError(f"argument --optimization-level: invalid choice: '{level}' (choose from 0, 1, 2, 3)")
    if "gpu_memory_utilization" in values:
        utilization = _float("--gpu-memory-utilization", values["gpu_memory_utilization"])
        if not 0 < utilization <= 1:
            raise UsageError("argument --gpu-memory-utilization: must be in (0, 1]")
    if "kv_cache_memory_bytes" in values:
        human_readable_int("--kv-cache-memory-bytes", str(values["kv_cache_memory_bytes"]))
    for flag in ("tensor_parallel_size", "pipeline_parallel_size", "nnodes", "node_rank"):
        if flag in values:
            _int("--" + flag.replace("_", "-"), values[flag])

    try:
        topology = topology_from(values)
    except ValueError as error:
        raise UsageError(f"argument --node-rank: {error}") from None
    if topology and topology.node_rank > 0 and not values.get("headless"):
        raise UsageError("a node of rank above 0 must run --headless (only the head serves the API)")

    block_size = _int("--block-size", values.get("block_size", DEFAULT_BLOCK_SIZE))
    kv_default = max(max_model_len * 2, max_num_seqs * DEFAULT_BLOCK_SIZE)
    rates = Rates(
        load_seconds=env_float("VLLM_STANDIN_LOAD_SECONDS", 2.0),
        prefill_tok_s=env_float("VLLM_STANDIN_PREFILL_TOK_S", 1800.0, minimum=1e-9),
        decode_tok_s=env_float("VLLM_STANDIN_DECODE_TOK_S", 23.0, minimum=1e-9),
        batch_cost=env_float("VLLM_STANDIN_BATCH_COST", 0.0),
    )
    return ServeConfig(
        model=model,
        revision=str(values["revision"]) if values.get("revision") else None,
        served_model_names=served,
        host=str(values.get("host") or "0.0.0.0"),
        port=port,
        api_keys=api_keys,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        # Prefix caching is on by default in vLLM V1; --no-enable-prefix-caching turns it off.
        enable_prefix_caching=values.get("enable_prefix_caching", True) is not False,
        block_size=max(block_size, 1),
        headless=bool(values.get("headless", False)),
        kv_cache_tokens=int(env_float("VLLM_STANDIN_KV_CACHE_TOKENS", kv_default, minimum=1)),
        natural_output_tokens=int(env_float("VLLM_STANDIN_OUTPUT_TOKENS", 64, minimum=1)),
        # Real reasoning models think for hundreds of tokens before they answer: by default longer than a short
        # smoke check's budget, so a client that reads only `content` sees null, as it would on a real model.
        reasoning_tokens=int(env_float("VLLM_STANDIN_REASONING_TOKENS", 96)) if values.get("reasoning_parser") else 0,
        rates=rates,
        version=standin_version(),
        force_include_usage=bool(values.get("enable_force_include_usage", False)),
        topology=topology,
        ignore_stream_options=os.environ.get("VLLM_STANDIN_IGNORE_STREAM_OPTIONS", "") not in ("", "0"),
        faults=Faults(
            wrong_after=int(env_float("VLLM_STANDIN_FAULT_WRONG_AFTER", 0)),
            truncate_after=int(env_float("VLLM_STANDIN_FAULT_TRUNCATE_AFTER", 0)),
            context_words=int(env_float("VLLM_STANDIN_FAULT_CONTEXT_WORDS", 0)),
            wrong_when_speculating=os.environ.get("VLLM_STANDIN_FAULT_SPEC_WRONG", "") not in ("", "0"),
        ),
        speculation=speculation_from(values.get("speculative_config")),
        pooling=pooling_task(values),
        middleware=(str(values["middleware"]),) if values.get("middleware") else (),
    )


def speculation_from(value: object) -> Speculation:
    """--speculative-config as JSON text (or --speculative-config.KEY VALUE, a mapping): its number of tokens."""
    if value in (None, ""):
        return Speculation()
    try:
        config = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise UsageError("argument --speculative-config: expected a JSON object") from None
    if not isinstance(config, dict):
        raise UsageError("argument --speculative-config: expected a JSON object")
    tokens = config.get("num_speculative_tokens")
    tokens = int(tokens) if isinstance(tokens, (int, str)) and str(tokens).isdigit() else 0
    acceptance = env_float("VLLM_STANDIN_SPEC_ACCEPTANCE", 0.7)
    if not 0 <= acceptance <= 1:
        raise UsageError("VLLM_STANDIN_SPEC_ACCEPTANCE must be between 0 and 1")
    model, revision = config.get("model"), config.get("revision")
    return Speculation(
        tokens=tokens,
        acceptance=acceptance,
        draft_model=model if isinstance(model, str) and model else None,
        draft_revision=revision if isinstance(revision, str) and revision else None,
    )
