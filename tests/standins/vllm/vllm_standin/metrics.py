"""The /metrics page: vLLM's Prometheus metric names, types, labels and histogram buckets.

Real vLLM registers these with prometheus_client in vllm/v1/metrics/loggers.py (PrometheusStatLogger); this
module writes the same text exposition format by hand so the stand-in needs only the standard library. What a
scraper or a Grafana dashboard relies on is kept: names (counters get prometheus_client's ``_total`` suffix),
types, the ``model_name`` and ``engine`` labels (sorted, as prometheus_client prints them), and the bucket bounds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from .config import Speculation

# Bucket bounds copied from vLLM's PrometheusStatLogger.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip

FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (the bounds of its token counts)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True)
class FinishedRequest:
    """What vLLM records of a request when it ends (its FinishedRequestStats): phases in seconds, token counts."""

    finish_reason: str
    e2e_s: float
    queued_s: float
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    """prometheus_client's float formatting: 1.0, 0.25, +Inf."""
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    """Label-value escaping of the text format: backslash, newline and double quote."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    """``{engine="0",model_name="m"}``: sorted by name, as prometheus_client prints them."""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items())) + "}"


class Histogram:
    """Cumulative-bucket histogram, like prometheus_client.Histogram (buckets, then _count, then _sum)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = (*bounds, float("inf"))
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.samples = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.samples += 1


class Metrics:
    """The engine's counters and histograms; gauges are read live from the engine when the page is rendered."""

    def __init__(
        self,
        model_name: str,
        gauges: Callable[[], dict[str, float]],
        max_model_len: int,
        speculation: Speculation | None = None,
    ) -> None:
        self._lock = threading.Lock()
        # vLLM's SpecDecodingProm counters (v1/spec_decode/metrics.py), only with --speculative-config.
        self.speculation = speculation = speculation or Speculation()
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_position = [0] * speculation.tokens
        self._labels = {"model_name": model_name, "engine": "0"}
        self._gauges = gauges
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        # Per finished request, as vLLM's PrometheusStatLogger: the phases share the e2e buckets, the token counts
        # get 1-2-5 buckets up to the context length.
        self.phases = {phase: Histogram(E2E_BUCKETS) for phase in ("queue", "inference", "prefill", "decode")}
        counts = build_1_2_5_buckets(max_model_len)
        self.counts = {name: Histogram(counts) for name in ("prompt", "generation", "max_generation", "max_tokens")}

    def record_prefill(self, prompt_tokens: int, cache_queries: int, cache_hits: int, ttft: float) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.prefix_cache_queries += cache_queries
            self.prefix_cache_hits += cache_hits
            self.ttft.observe(ttft)

    def record_token(self, inter_token_latency: float | None) -> None:
        with self._lock:
            self.generation_tokens += 1
            if inter_token_latency is not None:
                self.itl.observe(inter_token_latency)

    def record_finished(self, done: FinishedRequest) -> None:
        with self._lock:
            self.request_success[done.finish_reason] = self.request_success.get(done.finish_reason, 0) + 1
            self.e2e.observe(done.e2e_s)
            self.phases["queue"].observe(done.queued_s)
            self.phases["inference"].observe(done.prefill_s + done.decode_s)
            self.phases["prefill"].observe(done.prefill_s)
            self.phases["decode"].observe(done.decode_s)
            self.counts["prompt"].observe(done.prompt_tokens)
            self.counts["generation"].observe(done.generation_tokens)
            self.counts["max_generation"].observe(done.max_tokens)
            self.counts["max_tokens"].observe(done.max_tokens)
            self._record_speculation(done.generation_tokens)

    def _record_speculation(self, generated: int) -> None:
        """The drafts of one answer: after its first token, each step drafts `tokens`, accepts up to
        accepted_per_draft of them (no more than the answer still needs) and emits those and one more."""
        if not self.speculation.tokens:
            return
        remaining = generated - 1
        while remaining > 0:
            accepted = min(self.speculation.accepted_per_draft, remaining - 1)
            self.drafts += 1
            self.draft_tokens += self.speculation.tokens
            self.accepted_tokens += accepted
            for position in range(accepted):
                self.accepted_per_position[position] += 1
            remaining -= accepted + 1

    def render(self) -> str:
        """The Prometheus text exposition (version 0.0.4) of every metric."""
        gauges = self._gauges()
        out: list[str] = []
        with self._lock:
            self._gauge(
                out, "vllm:num_requests_running", "Number of requests in model execution batches.", gauges["running"]
            )
            self._gauge(
                out, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", gauges["waiting"]
            )
            self._gauge(
                out, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", gauges["kv_cache_usage"]
            )
            self._counter(
                out,
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prefix_cache_queries,
            )
            self._counter(
                out,
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.prefix_cache_hits,
            )
            self._counter(out, "vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
            self._counter(
                out, "vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens
            )
            name = "vllm:request_success_total"
            out.append(f"# HELP {name} Count of successfully processed requests.")
            out.append(f"# TYPE {name} counter")
            for reason, count in self.request_success.items():
                out.append(f"{name}{_labels({**self._labels, 'finished_reason': reason})} {_number(count)}")
            self._histogram(
                out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft
            )
            self._histogram(
                out, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl
            )
            self._histogram(
                out, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e
            )
            for phase, state in (
                ("queue", "WAITING"),
                ("inference", "RUNNING"),
                ("prefill", "PREFILL"),
                ("decode", "DECODE"),
            ):
                help_text = f"Histogram of time spent in {state} phase for request."
                self._histogram(out, f"vllm:request_{phase}_time_seconds", help_text, self.phases[phase])
            for name, help_text, key in (
                ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt"),
                ("vllm:request_generation_tokens", "Number of generation tokens processed.", "generation"),
                (
                    "vllm:request_max_num_generation_tokens",
                    "Histogram of maximum number of requested generation tokens.",
                    "max_generation",
                ),
                ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "max_tokens"),
            ):
                self._histogram(out, name, help_text, self.counts[key])
            if self.speculation.tokens:
                self._speculation(out)
        return "\n".join(out) + "\n"

    def _speculation(self, out: list[str]) -> None:
        self._counter(out, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", self.drafts)
        self._counter(out, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", self.draft_tokens)
        self._counter(out, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", self.accepted_tokens)
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        out += [f"# HELP {name} Accepted tokens per draft position.", f"# TYPE {name} counter"]
        for position, count in enumerate(self.accepted_per_position):
            out.append(f"{name}{_labels({**self._labels, 'position': str(position)})} {_number(count)}")

    def _gauge(self, out: list[str], name: str, help_text: str, value: float) -> None:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out.append(f"{name}{_labels(self._labels)} {_number(value)}")

    def _counter(self, out: list[str], name: str, help_text: str, value: float) -> None:
        # prometheus_client exposes Counter("vllm:prompt_tokens") as the family vllm:prompt_tokens_total.
        total = name + "_total"
        out += [f"# HELP {total} {help_text}", f"# TYPE {total} counter"]
        out.append(f"{total}{_labels(self._labels)} {_number(value)}")

    def _histogram(self, out: list[str], name: str, help_text: str, histogram: Histogram) -> None:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
            out.append(f"{name}_bucket{_labels({**self._labels, 'le': _number(bound)})} {_number(count)}")
        out.append(f"{name}_count{_labels(self._labels)} {_number(histogram.samples)}")
        out.append(f"{name}_sum{_labels(self._labels)} {_number(histogram.total)}")
