"""The pretend inference engine: admission, prefix cache, KV-cache accounting and token timing.

Nothing is computed; the engine only makes time pass the way a DGX Spark would and keeps the numbers vLLM
reports. The model of a request:

* It waits (``num_requests_waiting``) until fewer than ``--max-num-seqs`` requests run, first come first served.
* Prefill takes ``uncached prompt tokens / VLLM_STANDIN_PREFILL_TOK_S`` seconds and yields the first token, so
  time to first token = queueing + prefill. Prefix caching (on unless ``--no-enable-prefix-caching``) skips
  the part of the prompt that a previous prompt shared, in whole ``--block-size`` blocks, as vLLM does.
* Each further token comes ``1 / VLLM_STANDIN_DECODE_TOK_S`` seconds after the previous one. By default running
  requests do not slow each other down; with ``VLLM_STANDIN_BATCH_COST`` = c > 0, n running requests each wait
  ``(1 + (n - 1) * c) / VLLM_STANDIN_DECODE_TOK_S`` per token, as a batch sharing one bandwidth-bound bus does
  (n is counted at each token, so requests joining or leaving change the pace from the next token on).
* The "model" answers a question whose fact stands in the prompt with that fact (recall.py), else it would answer
  in ``VLLM_STANDIN_OUTPUT_TOKENS`` tokens: fewer allowed by max_tokens ends with
  finish_reason "length", more allowed ends with "stop"; ``ignore_eos`` always runs to max_tokens ("length").
  A chat request to a server with ``--reasoning-parser`` first reasons for ``VLLM_STANDIN_REASONING_TOKENS``
  tokens (they count against max_tokens, as a thinking model's do), then answers.

Tokens are an approximation: a prompt has as many tokens as whitespace-separated words (at least one), and each
generated token is one word, so the text a client receives counts back to the reported usage.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .config import ServeConfig
from .metrics import FinishedRequest, Metrics

# The stand-in's whole vocabulary: each generated token is the next word of this sentence, with a leading space.
ANSWER_WORDS = tuple(["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "."])
REASONING_WORDS = tuple(["Let", "me", "think", "about", "what", "the", "user", "asks", "here", "."])
PREFIX_MEMORY = 256  # how many past prompts the pretend prefix cache remembers


def count_tokens(text: str) -> int:
    """Approximate token count of a prompt text: its whitespace-separated words, at least 1 (a BOS token)."""
    return max(len(text.split()), 1)


@dataclass(frozen=True)
class GenerationRequest:
    """What the engine needs from an API request, with the prompt already turned into pretend tokens."""

    request_id: str
    prompt_words: tuple[str, ...]
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    arrival: float  # time.monotonic() when the HTTP request arrived
    reasoning_tokens: int = 0  # tokens of reasoning before the answer (chat with --reasoning-parser)
    answer_words: tuple[str, ...] = ()  # the answer recalled from the prompt (recall.py); () for the usual one


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; the last one carries the finish reason."""

    index: int
    text: str
    finish_reason: str | None
    reasoning: bool = False  # reasoning text (message.reasoning / delta.reasoning), not the answer


class Engine:
    """Shared by all HTTP threads; every mutable field is guarded by one condition variable."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()  # request ids waiting for a slot, oldest first
        self._running: dict[str, int] = {}  # request id -> tokens it holds in the KV cache
        self._seen_prompts: deque[tuple[str, ...]] = deque(maxlen=PREFIX_MEMORY)
        self.metrics = Metrics(config.metrics_model_name, self.gauges, config.max_model_len, config.speculation)
        # The wedge fault (SIGUSR1, cli.py): from then on no request gets another token, /health stays 200.
        self.wedged = threading.Event()

    def wedge(self) -> None:
        self.wedged.set()

    def _stall_if_wedged(self) -> None:
        """A wedged engine (an engine core stuck in a collective or a kernel, its API process still up) never
        produces another token: the request waits until the process ends."""
        if self.wedged.is_set():
            threading.Event().wait()

    def gauges(self) -> dict[str, float]:
        """Live values of vLLM's scheduler gauges."""
        with self._cond:
            held = sum(self._running.values())
            return {
                "running": float(len(self._running)),
                "waiting": float(len(self._queue)),
                "kv_cache_usage": min(held / self.config.kv_cache_tokens, 1.0),
            }

    def output_plan(
        self, max_tokens: int, ignore_eos: bool, reasoning_tokens: int = 0, answer_tokens: int = 0
    ) -> tuple[int, str]:
        """How many tokens the pretend model generates (reasoning included) and why it stops. ANSWER_TOKENS: the
        length of a recalled answer; 0 for the usual VLLM_STANDIN_OUTPUT_TOKENS."""
        natural = reasoning_tokens + (answer_tokens or self.config.natural_output_tokens)
        if ignore_eos or max_tokens < natural:
            return max_tokens, "length"
        return natural, "stop"

    def generate(self, request: GenerationRequest) -> Iterator[TokenEvent]:
        """Yield the tokens of one request at the modelled times; closing the iterator early aborts it."""
        self._admit(request)
        admitted = first_token = time.monotonic()
        generated = 0
        finish_reason = "abort"
        try:
            rates = self.config.rates
            cached = self._prefix_hits(request.prompt_words, request.prompt_tokens)
            first_token_at = time.monotonic() + (request.prompt_tokens - cached) / rates.prefill_tok_s
            _sleep_until(first_token_at)
            self._stall_if_wedged()
            queried = request.prompt_tokens if self.config.enable_prefix_caching else 0
            first_token = time.monotonic()
            self.metrics.record_prefill(request.prompt_tokens, queried, cached, first_token - request.arrival)
            self._remember_prompt(request.prompt_words)

            count, reason = self.output_plan(
                request.max_tokens, request.ignore_eos, request.reasoning_tokens, len(request.answer_words)
            )
            previous = time.monotonic()
            deadline = first_token_at
            for index in range(count):
                if index:
                    # Deadlines add up from the first token's, not from "now", so sleep overhead does not drift.
                    deadline += self._token_interval()
                    _sleep_until(deadline)
                self._stall_if_wedged()
                now = time.monotonic()
                self.metrics.record_token(now - previous if index else None)
                previous = now
                with self._cond:
                    self._running[request.request_id] += 1
                generated += 1
                reasoning = index < request.reasoning_tokens
                if reasoning:
                    word = REASONING_WORDS[index % len(REASONING_WORDS)]
                else:
                    answer = request.answer_words or ANSWER_WORDS
                    word = answer[(index - request.reasoning_tokens) % len(answer)]
                yield TokenEvent(
                    index=index,
                    text=" " + word,
                    finish_reason=reason if index == count - 1 else None,
                    reasoning=reasoning,
                )
            finish_reason = reason
        finally:
            self._release(request.request_id)
            end = time.monotonic()
            self.metrics.record_finished(
                FinishedRequest(
                    finish_reason=finish_reason,
                    e2e_s=end - request.arrival,
                    queued_s=admitted - request.arrival,
                    prefill_s=max(first_token - admitted, 0.0),
                    decode_s=max(end - first_token, 0.0),
                    prompt_tokens=request.prompt_tokens,
                    generation_tokens=generated,
                    max_tokens=request.max_tokens,
                )
            )

    def _token_interval(self) -> float:
        """Seconds between two tokens of one request while the current batch decodes together (a speculative
        step's tokens share the step's time)."""
        rates = self.config.rates
        with self._cond:
            batch = max(len(self._running), 1)
        step_s = (1 + (batch - 1) * rates.batch_cost) / rates.decode_tok_s
        return step_s / self.config.speculation.tokens_per_step

    def _admit(self, request: GenerationRequest) -> None:
        """Block until this request is first in line and a --max-num-seqs slot is free."""
        with self._cond:
            self._queue.append(request.request_id)
            while self._queue[0] != request.request_id or len(self._running) >= self.config.max_num_seqs:
                self._cond.wait()
            self._queue.popleft()
            self._running[request.request_id] = request.prompt_tokens
            self._cond.notify_all()

    def _release(self, request_id: str) -> None:
        with self._cond:
            self._running.pop(request_id, None)
            self._cond.notify_all()

    def _prefix_hits(self, words: tuple[str, ...], prompt_tokens: int) -> int:
        """Tokens served from the prefix cache: the longest prefix shared with a remembered prompt, in whole
        blocks, never the whole prompt (vLLM always computes at least the last prompt token)."""
        if not self.config.enable_prefix_caching:
            return 0
        with self._cond:
            remembered = list(self._seen_prompts)
        best = 0
        for previous in remembered:
            shared = 0
            for mine, theirs in zip(words, previous, strict=False):
                if mine != theirs:
                    break
                shared += 1
            best = max(best, shared)
        block = self.config.block_size
        return min(best, prompt_tokens - 1) // block * block

    def _remember_prompt(self, words: tuple[str, ...]) -> None:
        if self.config.enable_prefix_caching:
            with self._cond:
                self._seen_prompts.append(words)


def _sleep_until(deadline: float) -> None:
    """Sleep to an absolute time so per-token delays do not add up rounding and scheduling overhead."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
