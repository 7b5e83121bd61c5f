"""The Spark Arena profile measured with llama-benchy, the leaderboard's own harness, and what its results say.

The profile is spark-arena/recipe-registry's ``benchmarking/spark-arena-v2.yaml`` (2026-05-05): context depths
0 to 100,000 tokens, a 2,048-token prompt after the context, 128 generated tokens, 1, 2, 5 and 10 concurrent
requests, prefix caching on, 3 runs. The Arena's runner (spark-arena/sparkrun, ``benchmarking/llama_benchy.py``
and ``scheduler.py``) runs each (depth, concurrency) pair as one llama-benchy process with ``--format json
--save-result``; the first keeps llama-benchy's warm-up, the others get ``--no-warmup --skip-coherence``.
library/vllm_bench_arena runs the pairs the same way (depth by depth; the registry's schedule shuffles them to
spread the heat), with the prefix caching the server has.

llama-benchy 0.4.0's JSON (``results.py``): the run's metadata at the top level and ``benchmarks``, one entry per
(depth, concurrency) and phase. With prefix caching and a depth, the context-load phase
(``is_context_prefill_phase``) comes first and the measured prompt follows on the cached context. Each entry's
``pp_throughput`` and ``tg_throughput`` are ``{mean, std, values}`` in tokens per second, totals over the
concurrent requests; ``tg_req_throughput`` is per request, and ``e2e_ttft`` is in milliseconds.
"""

from __future__ import annotations

import csv
import io
import json

# spark-arena/recipe-registry benchmarking/spark-arena-v2.yaml
ARENA_V2 = {
    "depths": [0, 4096, 8192, 16384, 32768, 65535, 100000],
    "prompt_tokens": 2048,
    "output_tokens": 128,
    "concurrency": [1, 2, 5, 10],
    "runs": 3,
}

# Where the API key waits for llama-benchy: its only way in is --api-key, and a command line is visible to every
# user through ps. This program, run by the venv's Python with `-c`, appends the key to llama-benchy's own
# arguments inside the process (ps shows the arguments the process started with).
KEY_VARIABLE = "SPARKFLEET_BENCH_API_KEY"
RUNNER = (
    "import os, sys\n"
    "from llama_benchy.__main__ import main\n"
    f"sys.argv = ['llama-benchy', *sys.argv[1:], '--api-key', os.environ.pop('{KEY_VARIABLE}', '') or 'EMPTY']\n"
    "main()\n"
)


def fitting_depths(depths: list[int], prompt_tokens: int, output_tokens: int, max_model_len: int | None):
    """(kept, skipped): the depths whose request fits the served context (depth + prompt + output tokens within
    max_model_len; vLLM refuses a longer one with a 400). Unknown max_model_len: every depth is kept."""
    if not max_model_len:
        return list(depths), []
    kept = [depth for depth in depths if depth + prompt_tokens + output_tokens <= max_model_len]
    return kept, [depth for depth in depths if depth not in kept]


def pairs(depths: list[int], concurrency: list[int]) -> list[tuple[int, int]]:
    """The (depth, concurrency) pairs in the order they run: depth by depth, fewest requests first."""
    return [(depth, level) for depth in sorted(depths) for level in sorted(concurrency)]


def llama_benchy_args(settings: dict, depth: int, concurrency: int, *, first: bool, result_file: str) -> list[str]:
    """llama-benchy's arguments for one pair, the key left out (RUNNER adds it). SETTINGS: base_url (ending in
    /v1), model (the Hugging Face name the report shows), served, tokenizer (a local folder), book_url,
    prompt_tokens, output_tokens, runs, prefix_caching."""
    args = [
        "--base-url", settings["base_url"],
        "--model", settings["model"],
        "--served-model-name", settings["served"],
        "--tokenizer", settings["tokenizer"],
        "--book-url", settings["book_url"],
        "--pp", str(settings["prompt_tokens"]),
        "--tg", str(settings["output_tokens"]),
        "--depth", str(depth),
        "--concurrency", str(concurrency),
        "--runs", str(settings["runs"]),
        "--format", "json",
        "--save-result", result_file,
        # A failed request ends the run with exit status 1 instead of a table without it.
        "--exit-on-first-fail",
        # llama-benchy's coherence test asks for "Paris"; the health gate's canaries already held this model to
        # its own recorded answers, a stronger check, and the Arena skips the test after its first pair too.
        "--skip-coherence",
    ]  # fmt: skip
    if settings["prefix_caching"]:
        args.append("--enable-prefix-caching")
    if not first:
        args.append("--no-warmup")
    return args


def _mean(entry: dict, key: str) -> float | None:
    metric = entry.get(key)
    return round(float(metric["mean"]), 2) if isinstance(metric, dict) and metric.get("mean") is not None else None


def rows(report: dict) -> list[dict]:
    """One row per (depth, concurrency) of a llama-benchy JSON report: prefill and decode tok/s in all (the
    Arena's figures), decode per request, end-to-end TTFT, and the context-load phase's prefill when there was
    one."""
    measured = [entry for entry in report.get("benchmarks", []) if not entry.get("is_context_prefill_phase")]
    context = {
        (entry["context_size"], entry["concurrency"]): entry
        for entry in report.get("benchmarks", [])
        if entry.get("is_context_prefill_phase")
    }
    found = []
    for entry in measured:
        key = (entry["context_size"], entry["concurrency"])
        found.append(
            {
                "depth": entry["context_size"],
                "concurrency": entry["concurrency"],
                "prompt_tokens": entry["prompt_size"],
                "output_tokens": entry["response_size"],
                "prefill_tok_s": _mean(entry, "pp_throughput"),
                "decode_tok_s": _mean(entry, "tg_throughput"),
                "decode_per_request_tok_s": _mean(entry, "tg_req_throughput"),
                "ttft_ms": _mean(entry, "e2e_ttft"),
                "context_prefill_tok_s": _mean(context[key], "pp_throughput") if key in context else None,
            }
        )
    return found


def missing_figures(found: list[dict], depth: int, concurrency: int) -> str | None:
    """Why one pair's rows are not a measurement (no row, or a row without decode or prefill), else None."""
    mine = [row for row in found if row["depth"] == depth and row["concurrency"] == concurrency]
    if not mine:
        return f"llama-benchy reported nothing for depth {depth} at concurrency {concurrency}"
    absent = [name for name in ("decode", "prefill") if mine[0][f"{name}_tok_s"] is None]
    if absent:
        return f"llama-benchy measured no {' or '.join(absent)} speed for depth {depth} at concurrency {concurrency}"
    return None


def with_published(found: list[dict], published: list[dict]) -> list[dict]:
    """Each row with the published figures of the same depth and concurrency (a recipe's published_arena rows:
    depth, concurrency, decode_tok_s and/or prefill_tok_s), None where none was published."""
    by_pair = {(row["depth"], row["concurrency"]): row for row in published}
    return [
        {
            **row,
            "published_decode_tok_s": by_pair.get((row["depth"], row["concurrency"]), {}).get("decode_tok_s"),
            "published_prefill_tok_s": by_pair.get((row["depth"], row["concurrency"]), {}).get("prefill_tok_s"),
        }
        for row in found
    ]


# --- the report's files (on the controller) -------------------------------------------------------------------

ROW_COLUMNS = (
    "depth",
    "concurrency",
    "prompt_tokens",
    "output_tokens",
    "prefill_tok_s",
    "published_prefill_tok_s",
    "decode_tok_s",
    "published_decode_tok_s",
    "decode_per_request_tok_s",
    "ttft_ms",
    "context_prefill_tok_s",
)


def arena_json(arena: dict) -> str:
    return json.dumps(arena, indent=2) + "\n"


def arena_csv(arena: dict) -> str:
    """One row per depth and concurrency."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=ROW_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(arena["rows"])
    return out.getvalue()


def arena_png(arena: dict, title: str) -> bytes:
    """Decode and prefill tok/s against context depth, one line per concurrency level, as the leaderboard draws
    them. matplotlib (a controller dependency) is imported here only."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a controller or in CI
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 6.5), dpi=100)
    top, bottom = figure.subplots(2, 1, sharex=True)
    for level in sorted({row["concurrency"] for row in arena["rows"]}):
        mine = sorted((row for row in arena["rows"] if row["concurrency"] == level), key=lambda row: row["depth"])
        depths = [row["depth"] for row in mine]
        top.plot(depths, [row["decode_tok_s"] for row in mine], "o-", label=f"{level} concurrent")
        bottom.plot(depths, [row["prefill_tok_s"] for row in mine], "s-", label=f"{level} concurrent")
    top.set_ylabel("decode tok/s (all requests)")
    bottom.set_ylabel("prefill tok/s (all requests)")
    bottom.set_xlabel("context depth (tokens)")
    for axes in (top, bottom):
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
    profile = arena["profile"]
    figure.suptitle(
        f"{title}: Spark Arena profile, {profile['prompt_tokens']} prompt / {profile['output_tokens']} output"
    )
    out = io.BytesIO()
    figure.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()
