"""Measure a served model through its OpenAI-compatible endpoint, the way the vLLM blog's Spark evaluation did.

Standard library only, so the measuring half runs on a Spark itself (as `vllm bench serve` would, next to the
server) as well as on the controller. The method:

* Exact prompt lengths without guessing from words: the server's own ``/tokenize`` turns a filler text into token
  ids, and each request sends exactly N of them as a token-id prompt to ``/v1/completions`` (vLLM takes those
  verbatim, no BOS added). The first ``SALT_TOKENS`` ids are drawn afresh for every request, so no two prompts
  share a first block and vLLM's prefix cache cannot turn a prefill measurement into a cache hit. The server's
  ``usage.prompt_tokens`` must then equal N.
* Exact output lengths: ``max_tokens: N`` with ``ignore_eos: true``; the usage chunk
  (``stream_options.include_usage``) must then count N completion tokens.
* One streamed request gives TTFT (first chunk carrying text), every text chunk's arrival (inter-token latency),
  the total (end of stream), and prefill tok/s = prompt tokens / TTFT, decode tok/s = (completion tokens - 1) /
  (last text chunk - TTFT): the end of the stream also carries the usage chunk and [DONE], which are no
  decode work and would skew a 2-token request (against vLLM the difference is a millisecond or less).
  A server that sends several tokens per chunk shows fewer, longer inter-token gaps; the rates stay right
  because they come from the usage counts.
* A scenario is one or more warm-up requests, then the median of ``runs`` measured ones, each figure's median
  taken on its own (as the published table reports them).
* A concurrency sweep keeps C requests in flight at levels 1, 2, 4, ... and finds the knee (see ``find_knee``).
* Prompts are real prose (the quality gate's, repeated), not random tokens: random tokens hide what speculative
  decoding does. With speculative decoding on, each scenario also reports its acceptance rate and mean accepted
  length, from vLLM's ``vllm:spec_decode_*`` counters on ``/metrics`` read before and after its measured runs (the
  formulas of vLLM's own dashboard).
"""

from __future__ import annotations

import csv
import http.client
import io
import itertools
import json
import random
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

# The five scenarios of the vLLM blog's local evaluation (shared/spark-facts.md, "Published local evaluation").
PUBLISHED_SCENARIOS = (
    ("typical judge call", 58, 2),
    ("medium prompt, short gen", 1834, 32),
    ("long prompt, short gen", 7234, 32),
    ("medium prompt, long gen", 1834, 108),
    ("long prompt, long gen", 7234, 124),
)
SALT_TOKENS = 4  # fresh ids at the start of every prompt: the prefix cache then has nothing to reuse
# Real prose for the prompts (repeated to length): speculative decoding drafts from text, so random words or ids would
# show it at its worst.
PROSE = (
    "The survey ship left the harbour an hour before sunrise, its engines low and steady under a grey sky. "
    "On the bridge the captain read the weather report twice, folded it into her coat pocket and asked for tea. "
    "Nobody on board had seen the northern channel since the storms of the previous winter had moved the sandbanks, "
    "and the old charts could no longer be trusted. The youngest of the crew, a geologist from an inland university, "
    "stood at the rail with a notebook and counted the gulls that followed the wake. By mid morning the wind turned "
    "west and the sea grew short and choppy; the cook tied down the pans and complained that soup was impossible. "
    "At noon they reached the first marker buoy, which had drifted almost a mile from its recorded position. "
    "The captain slowed the ship, sent two sailors out in the small boat and watched through her glasses as they "
    "measured the depth with a weighted line. The numbers they shouted back were smaller than anyone expected. "
    "In the afternoon the clouds broke, the light turned silver on the water, and the island appeared on the "
    "horizon, low and green, with the ruined lighthouse standing at its eastern point like a broken tooth. "
    "They anchored in the lee of the cliffs, ate a late supper on deck and argued pleasantly about whether the "
    "lighthouse keeper's cottage could be repaired before the autumn gales arrived."
)
FILLER_WORDS = PROSE.split()
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py, in tests/contracts/vllm/metrics.json).
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
# The knee rule's thresholds (find_knee): documented there, exported with every result.
KNEE_ITL_FACTOR = 1.5
KNEE_TTFT_FACTOR = 1.5
KNEE_TTFT_MIN_RISE_S = 0.05
KNEE_MIN_GAIN = 0.10
KNEE_RULE = (
    f"the knee is the first concurrency level above the first where p50 inter-token latency exceeds "
    f"{KNEE_ITL_FACTOR}x the first level's, or p95 TTFT exceeds {KNEE_TTFT_FACTOR}x the first level's and by "
    f"more than {KNEE_TTFT_MIN_RISE_S} s, or aggregate output tok/s gains less than {KNEE_MIN_GAIN:.0%} over "
    f"the previous level"
)


class BenchError(Exception):
    """A measurement that cannot go on; the message names the URL or model at fault and what to do."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is tolerated)
    model: str
    api_key: str = ""
    timeout_s: float = 120.0

    @property
    def base(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class Scenario:
    name: str
    prompt_tokens: int
    output_tokens: int


@dataclass
class RequestResult:
    """One streamed request as the client saw it; times in seconds from sending the request."""

    ttft_s: float
    total_s: float
    token_times_s: list[float]
    prompt_tokens: int
    completion_tokens: int

    @property
    def inter_token_s(self) -> list[float]:
        times = self.token_times_s
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float | None:
        """(completion tokens - 1) / (last text chunk - first): the first token belongs to prefill, and the
        usage chunk and [DONE] that follow the last token are no decode work. None for one token."""
        decode_time = self.token_times_s[-1] - self.ttft_s
        if self.completion_tokens < 2 or decode_time <= 0:
            return None
        return (self.completion_tokens - 1) / decode_time


def default_scenarios() -> list[Scenario]:
    return [Scenario(*row) for row in PUBLISHED_SCENARIOS]


# --- HTTP -------------------------------------------------------------------------------------------------


def _connect(endpoint: Endpoint) -> tuple[http.client.HTTPConnection, str]:
    """A connected HTTP(S) connection to the endpoint and the path prefix of its URL."""
    parts = urllib.parse.urlsplit(endpoint.base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"url {endpoint.url!r} is not an http(s) URL like http://127.0.0.1:8000")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=endpoint.timeout_s)
    try:
        conn.connect()
    except OSError as error:
        raise BenchError(
            f"cannot reach {endpoint.base}: {error}; check that vLLM is running and listening there "
            f"(GET {endpoint.base}/health should answer 200)"
        ) from None
    return conn, parts.path.rstrip("/")


def _headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if endpoint.api_key:
        headers["authorization"] = f"Bearer {endpoint.api_key}"
    return headers


def _http_error(endpoint: Endpoint, path: str, status: int, raw: bytes) -> BenchError:
    """The error for a non-200 answer, in words that say what to change."""
    url = endpoint.base + path
    if status == 401:
        state = "wrong" if endpoint.api_key else "missing"
        return BenchError(f"{url} answered 401 Unauthorized: the API key is {state}; give the server's --api-key")
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:300].decode("utf-8", "replace")
    if status == 404 and path == "/tokenize":
        return BenchError(
            f"{url} answered 404 ({message}): the server has no /tokenize; sparkfleet needs it to send prompts of "
            f"an exact token count (vLLM's OpenAI server has it)"
        )
    if status == 404 and "model" in str(message).lower():
        return BenchError(f"{url}: model {endpoint.model!r} is not served there ({message})")
    return BenchError(f"{url} answered {status}: {message}")


def call_json(endpoint: Endpoint, method: str, path: str, body: object | None = None) -> dict:
    """One plain JSON request; any answer but 200 is a BenchError."""
    conn, prefix = _connect(endpoint)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, prefix + path, body=data, headers=_headers(endpoint))
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as error:
        raise BenchError(f"{endpoint.base}{path}: {error}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise _http_error(endpoint, path, response.status, raw)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise BenchError(f"{endpoint.base}{path} answered 200 with a body that is not JSON: {raw[:200]!r}") from None
    if not isinstance(answer, dict):
        raise BenchError(f"{endpoint.base}{path} answered 200 with {answer!r:.200}, not a JSON object")
    return answer


def spec_counters(endpoint: Endpoint) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters from /metrics (summed over their labels), or None when the server has
    none (no speculation) or /metrics does not answer: the figures are then left out, nothing fails."""
    conn, prefix = _connect(endpoint)
    try:
        conn.request("GET", prefix + "/metrics", headers=_headers(endpoint))
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if response.status != 200:
        return None
    found = dict.fromkeys(SPEC_COUNTERS, 0.0)
    seen = False
    for line in text.splitlines():
        for key, name in SPEC_COUNTERS.items():
            if line.startswith((name + "{", name + " ")):
                found[key] += float(line.rsplit(" ", 1)[1])
                seen = True
    return found if seen else None


def speculation_figures(before: dict | None, after: dict | None) -> dict:
    """Acceptance rate (accepted / draft tokens) and mean accepted length (1 + accepted / drafts) between two
    readings of spec_counters(), as vLLM's own dashboard computes them; None without speculation or drafts."""
    if before is None or after is None or after["drafts"] <= before["drafts"]:
        return {"spec_acceptance_rate": None, "spec_accepted_length": None}
    accepted = after["accepted"] - before["accepted"]
    return {
        "spec_acceptance_rate": round(accepted / (after["draft_tokens"] - before["draft_tokens"]), 3),
        "spec_accepted_length": round(1 + accepted / (after["drafts"] - before["drafts"]), 3),
    }


def check_model(endpoint: Endpoint) -> None:
    """Fail early, naming what is served, when the endpoint does not serve the model."""
    served = [card.get("id") for card in call_json(endpoint, "GET", "/v1/models").get("data", [])]
    if endpoint.model not in served:
        raise BenchError(
            f"model {endpoint.model!r} is not served at {endpoint.base} (GET /v1/models lists: "
            f"{', '.join(map(str, served)) or 'nothing'}); set model to one of them"
        )


# --- prompts ----------------------------------------------------------------------------------------------


class PromptMaker:
    """Token-id prompts of an exact length from the server's own tokenizer, each with a fresh start."""

    def __init__(self, endpoint: Endpoint, longest: int, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.pool = self._tokenize_filler(endpoint, longest)
        self._distinct = sorted(set(self.pool))

    @staticmethod
    def _tokenize_filler(endpoint: Endpoint, longest: int) -> list[int]:
        words = max(longest, 16)
        for _ in range(4):  # a word is at least one token with every tokenizer seen; grow if not
            text = " ".join(FILLER_WORDS[i % len(FILLER_WORDS)] for i in range(words))
            body = {"model": endpoint.model, "prompt": text, "add_special_tokens": False}
            tokens = call_json(endpoint, "POST", "/tokenize", body).get("tokens") or []
            if len(tokens) >= longest:
                return [int(token) for token in tokens]
            words *= 2
        raise BenchError(f"{endpoint.base}/tokenize gave {len(tokens)} tokens for {words} words; need {longest}")

    def prompt(self, length: int) -> list[int]:
        with self._lock:  # sweep threads share one generator
            salt = [self._rng.choice(self._distinct) for _ in range(min(SALT_TOKENS, length))]
        return salt + self.pool[: length - len(salt)]


# --- one request ------------------------------------------------------------------------------------------


def _stream_events(response: http.client.HTTPResponse):
    """(arrival time, parsed chunk) for each ``data:`` line of an SSE stream, until ``[DONE]``."""
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        now = time.perf_counter()
        if payload == b"[DONE]":
            return
        yield now, json.loads(payload)


def measure_request(endpoint: Endpoint, prompt_ids: list[int], output_tokens: int) -> RequestResult:
    """Stream one completion of exactly len(prompt_ids) prompt and output_tokens output tokens, and time it."""
    body = {
        "model": endpoint.model,
        "prompt": prompt_ids,
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn, prefix = _connect(endpoint)  # connected before the clock starts, as a kept-alive client would be
    token_times: list[float] = []
    usage = None
    try:
        start = time.perf_counter()
        conn.request("POST", prefix + "/v1/completions", body=json.dumps(body).encode(), headers=_headers(endpoint))
        response = conn.getresponse()
        if response.status != 200:
            raise _http_error(endpoint, "/v1/completions", response.status, response.read())
        for arrived, chunk in _stream_events(response):
            if not isinstance(chunk, dict) or chunk.get("error"):  # vLLM reports a failure mid-stream this way
                detail = chunk.get("error") if isinstance(chunk, dict) else chunk
                raise BenchError(f"{endpoint.base}/v1/completions failed mid-stream: {detail!r:.300}")
            if any(choice.get("text") for choice in chunk.get("choices") or []):
                token_times.append(arrived - start)
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
        end = time.perf_counter() - start
    except (OSError, http.client.HTTPException) as error:
        raise BenchError(f"{endpoint.base}/v1/completions: {error}") from None
    except ValueError as error:  # a data: line that is not JSON
        raise BenchError(f"{endpoint.base}/v1/completions sent a stream that is not OpenAI's SSE: {error}") from None
    finally:
        conn.close()
    return _checked_result(endpoint, token_times, end, usage, len(prompt_ids), output_tokens)


def _checked_result(
    endpoint: Endpoint, token_times: list[float], end: float, usage: dict | None, prompt: int, output: int
) -> RequestResult:
    if usage is None:
        raise BenchError(
            f"{endpoint.base} does not report usage with stream_options.include_usage; sparkfleet needs it to count "
            f"tokens exactly (vLLM does it; on vLLM, --enable-force-include-usage also works)"
        )
    if not token_times:
        raise BenchError(f"{endpoint.base}: model {endpoint.model!r} streamed no text")
    if usage.get("prompt_tokens") != prompt:
        raise BenchError(
            f"{endpoint.base}: asked for a prompt of exactly {prompt} tokens, the server counted "
            f"{usage.get('prompt_tokens')}; it must take token-id prompts verbatim (vLLM's /v1/completions does)"
        )
    if usage.get("completion_tokens") != output:
        raise BenchError(
            f"{endpoint.base}: asked for exactly {output} output tokens (max_tokens with ignore_eos), got "
            f"{usage.get('completion_tokens')}; the server must honour ignore_eos"
        )
    return RequestResult(token_times[0], end, token_times, prompt, output)


# --- statistics -------------------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float | None:
    """The pct-th percentile, linearly interpolated between ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def decode_bound_tok_s(bandwidth_gbps: float, active_params_b: float | None, bytes_per_param: float | None):
    """The planner's bandwidth bound: decode reads the active weights once per token."""
    if not active_params_b or not bytes_per_param:
        return None
    return bandwidth_gbps * 1e9 / (active_params_b * 1e9 * bytes_per_param)


# --- scenarios --------------------------------------------------------------------------------------------


def _published_row(published: list[dict], scenario: Scenario) -> dict:
    """The published figures for a scenario: same name, else same prompt and output lengths; {} if none."""
    for row in published:
        if row.get("scenario") == scenario.name:
            return row
    for row in published:
        if (row.get("prompt_tokens"), row.get("output_tokens")) == (scenario.prompt_tokens, scenario.output_tokens):
            return row
    return {}


def _ratio(measured: float | None, reference: float | None) -> float | None:
    return None if measured is None or not reference else round(measured / reference, 3)


def run_scenario(
    endpoint: Endpoint, maker: PromptMaker, scenario: Scenario, runs: int, warmup: int, published: dict, bound
) -> dict:
    """One flat row: medians of `runs` measured requests after `warmup` unmeasured ones, beside the published
    figures and the bandwidth bound (None where not given)."""
    for _ in range(warmup):
        measure_request(endpoint, maker.prompt(scenario.prompt_tokens), scenario.output_tokens)
    before = spec_counters(endpoint)
    measured = [
        measure_request(endpoint, maker.prompt(scenario.prompt_tokens), scenario.output_tokens) for _ in range(runs)
    ]
    speculation = speculation_figures(before, spec_counters(endpoint) if before else None)
    decode = _median([result.decode_tok_s for result in measured])
    return {
        "scenario": scenario.name,
        "prompt_tokens": scenario.prompt_tokens,
        "output_tokens": scenario.output_tokens,
        "runs": runs,
        "ttft_s": _round(_median([result.ttft_s for result in measured])),
        "total_s": _round(_median([result.total_s for result in measured])),
        "prefill_tok_s": _round(_median([result.prefill_tok_s for result in measured]), 1),
        "decode_tok_s": _round(decode, 2),
        "itl_p50_s": _round(_median([percentile(result.inter_token_s, 50) for result in measured])),
        "published_ttft_s": published.get("ttft_s"),
        "published_total_s": published.get("total_s"),
        "published_prefill_tok_s": published.get("prefill_tok_s"),
        "published_decode_tok_s": published.get("decode_tok_s"),
        "decode_vs_published": _ratio(decode, published.get("decode_tok_s")),
        "decode_bound_tok_s": _round(bound, 1),
        "decode_of_bound": _ratio(decode, bound),
        **speculation,
    }


# --- concurrency sweep ------------------------------------------------------------------------------------


def sweep_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to max_concurrency, which is always the last level."""
    levels = [1]
    while levels[-1] * 2 < max_concurrency:
        levels.append(levels[-1] * 2)
    return levels if max_concurrency <= 1 else [*levels, max_concurrency]


def _drive(endpoint: Endpoint, maker: PromptMaker, concurrency: int, requests: int, prompt: int, output: int):
    """Keep `concurrency` requests in flight until `requests` were sent: results, errors, wall time."""
    results: list[RequestResult] = []
    errors: list[str] = []
    lock = threading.Lock()
    remaining = [requests]

    def client() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            # Whatever ends a request is a failure to count, never a request lost from the figures.
            try:
                result = measure_request(endpoint, maker.prompt(prompt), output)
            except Exception as error:
                with lock:
                    errors.append(str(error) if isinstance(error, BenchError) else f"{type(error).__name__}: {error}")
                continue
            with lock:
                results.append(result)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors, time.perf_counter() - start


def run_level(endpoint: Endpoint, maker: PromptMaker, concurrency: int, requests: int, prompt: int, output: int):
    """One flat row of the sweep: throughput and latency percentiles at one concurrency level."""
    results, errors, wall = _drive(endpoint, maker, concurrency, requests, prompt, output)
    if not results:
        raise BenchError(f"every request failed at concurrency {concurrency}: {errors[0]}")
    ttft = [result.ttft_s for result in results]
    itl = [gap for result in results for gap in result.inter_token_s]
    e2e = [result.total_s for result in results]
    return {
        "concurrency": concurrency,
        "requests": len(results) + len(errors),  # every request sent ended in one or the other
        "failures": len(errors),
        "wall_s": _round(wall),
        "output_tok_s": _round(sum(result.completion_tokens for result in results) / wall, 2),
        "request_decode_tok_s_p50": _round(_median([result.decode_tok_s for result in results]), 2),
        **{f"ttft_p{p}_s": _round(percentile(ttft, p)) for p in (50, 95, 99)},
        **{f"itl_p{p}_s": _round(percentile(itl, p), 5) for p in (50, 95, 99)},
        **{f"e2e_p{p}_s": _round(percentile(e2e, p)) for p in (50, 95)},
        "first_error": errors[0] if errors else None,
    }


def find_knee(rows: list[dict]) -> dict | None:
    """Where latency turns up: the first level after the first one at which

    * p50 inter-token latency is more than KNEE_ITL_FACTOR x the first level's (the batch now slows every
      token: on a bandwidth-bound box decode steps get longer as the batch grows), or
    * p95 TTFT is more than KNEE_TTFT_FACTOR x the first level's and at least KNEE_TTFT_MIN_RISE_S s above
      it (requests queue for a --max-num-seqs slot; the floor keeps jitter on tiny TTFTs from counting), or
    * aggregate output tok/s gains less than KNEE_MIN_GAIN over the previous level (more users, no more work).

    Returns {"concurrency", "reason"}, or None when no level turns up.
    """
    if len(rows) < 2:
        return None
    first = rows[0]
    for previous, row in itertools.pairwise(rows):
        reasons = []
        if first["itl_p50_s"] and row["itl_p50_s"] > KNEE_ITL_FACTOR * first["itl_p50_s"]:
            reasons.append(f"p50 ITL {row['itl_p50_s'] * 1000:.1f} ms vs {first['itl_p50_s'] * 1000:.1f} ms at 1")
        ttft, ttft_first = row["ttft_p95_s"], first["ttft_p95_s"]
        if ttft > KNEE_TTFT_FACTOR * ttft_first and ttft - ttft_first > KNEE_TTFT_MIN_RISE_S:
            reasons.append(f"p95 TTFT {ttft:.3f} s vs {ttft_first:.3f} s at {first['concurrency']}")
        if row["output_tok_s"] < (1 + KNEE_MIN_GAIN) * previous["output_tok_s"]:
            reasons.append(
                f"aggregate {row['output_tok_s']:.1f} tok/s vs {previous['output_tok_s']:.1f} at "
                f"{previous['concurrency']}"
            )
        if reasons:
            return {"concurrency": row["concurrency"], "reason": "; ".join(reasons)}
    return None


def run_sweep(
    endpoint: Endpoint, maker: PromptMaker, levels: list[int], requests_per_level: int, prompt: int, output: int
) -> dict:
    """The sweep: one row per level (each level sends max(requests_per_level, 2 x C) requests), and its knee."""
    measure_request(endpoint, maker.prompt(prompt), output)  # warm-up
    rows = [run_level(endpoint, maker, c, max(requests_per_level, 2 * c), prompt, output) for c in levels]
    return {
        "prompt_tokens": prompt,
        "output_tokens": output,
        "levels": rows,
        "knee": find_knee(rows),
        "knee_rule": KNEE_RULE,
    }


# --- the whole benchmark ----------------------------------------------------------------------------------


@dataclass
class BenchSettings:
    scenarios: list[Scenario] = field(default_factory=default_scenarios)
    runs: int = 3
    warmup: int = 1
    published: list[dict] = field(default_factory=list)
    bandwidth_gbps: float = 273.0
    active_params_b: float | None = None
    bytes_per_param: float | None = None
    sweep_levels: list[int] = field(default_factory=list)  # empty: no sweep
    sweep_requests_per_level: int = 0
    sweep_prompt_tokens: int = 1834
    sweep_output_tokens: int = 108
    seed: int | None = None  # None: a fresh one, so a rerun cannot hit the prefix cache of the previous run


def run_bench(endpoint: Endpoint, settings: BenchSettings) -> dict:
    """Scenarios, then the sweep when levels are given, as one JSON-serialisable result."""
    check_model(endpoint)
    lengths = [scenario.prompt_tokens for scenario in settings.scenarios]
    longest = max([*lengths, settings.sweep_prompt_tokens if settings.sweep_levels else 1])
    seed = random.SystemRandom().randrange(2**31) if settings.seed is None else settings.seed
    maker = PromptMaker(endpoint, longest, seed)
    bound = decode_bound_tok_s(settings.bandwidth_gbps, settings.active_params_b, settings.bytes_per_param)
    runs, warmup, published = settings.runs, settings.warmup, settings.published
    rows = [
        run_scenario(endpoint, maker, s, runs, warmup, _published_row(published, s), bound) for s in settings.scenarios
    ]
    sweep = None
    if settings.sweep_levels:
        sweep = run_sweep(
            endpoint,
            maker,
            settings.sweep_levels,
            settings.sweep_requests_per_level,
            settings.sweep_prompt_tokens,
            settings.sweep_output_tokens,
        )
    return {
        "url": endpoint.base,
        "model": endpoint.model,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": f"median of {settings.runs} streamed runs after {settings.warmup} warm-up; token-id prompts",
        "seed": seed,
        "decode_bound_tok_s": _round(bound, 1),
        "bandwidth_gbps": settings.bandwidth_gbps,
        "scenarios": rows,
        "sweep": sweep,
    }


# --- reports ----------------------------------------------------------------------------------------------


def results_json(results: dict) -> str:
    return json.dumps(results, indent=2, sort_keys=False) + "\n"


def results_csv(results: dict) -> str:
    """One table: scenario rows, then sweep rows, a `section` column first, empty cells where a column is not
    the row's."""
    rows = [{"section": "scenario", **row} for row in results.get("scenarios") or []]
    sweep = results.get("sweep") or {}
    knee = (sweep.get("knee") or {}).get("concurrency")
    rows += [{"section": "sweep", **row, "knee": row["concurrency"] == knee} for row in sweep.get("levels") or []]
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def sweep_png(results: dict) -> bytes | None:
    """The sweep as a PNG (aggregate tok/s; p95 TTFT and p50 ITL; knee marked), None without a sweep.

    matplotlib (a controller dependency) is imported here only, so measuring never needs it.
    """
    sweep = results.get("sweep")
    if not sweep or not sweep.get("levels"):
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on a controller or in CI
    from matplotlib.figure import Figure

    rows = sweep["levels"]
    levels = [row["concurrency"] for row in rows]
    figure = Figure(figsize=(8, 6.5), dpi=100)
    top, bottom = figure.subplots(2, 1, sharex=True)
    top.plot(levels, [row["output_tok_s"] for row in rows], "o-", color="tab:blue", label="aggregate output tok/s")
    top.set_ylabel("output tok/s")
    bottom.plot(levels, [row["ttft_p95_s"] * 1000 for row in rows], "s-", color="tab:red", label="p95 TTFT")
    bottom.plot(levels, [row["itl_p50_s"] * 1000 for row in rows], "^-", color="tab:green", label="p50 ITL")
    bottom.set_ylabel("ms")
    bottom.set_yscale("log")
    bottom.set_xlabel("concurrent requests")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(levels, [str(level) for level in levels])
    knee = (sweep.get("knee") or {}).get("concurrency")
    for axes in (top, bottom):
        if knee:
            axes.axvline(knee, color="grey", linestyle="--", label=f"knee at {knee}")
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
    title = f"{results.get('model')}: {sweep['prompt_tokens']} prompt / {sweep['output_tokens']} output tokens"
    figure.suptitle(title)
    out = io.BytesIO()
    figure.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()
