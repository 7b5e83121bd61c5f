"""module_utils/arena_bench: the Spark Arena profile's command lines for llama-benchy, the depths that fit, and
llama-benchy's JSON report read into rows (a report llama-benchy 0.4.0 wrote, tests/contracts/llama-benchy/)."""

from __future__ import annotations

import csv
import io
import json
import os
import sys

import pytest
from arena_bench import (
    ARENA_V2,
    KEY_VARIABLE,
    RUNNER,
    arena_csv,
    arena_png,
    fitting_depths,
    llama_benchy_args,
    missing_figures,
    pairs,
    rows,
    with_published,
)
from helpers import ROOT

REPORT = json.loads((ROOT / "tests/contracts/llama-benchy/report-d1024-c2.json").read_text())
SETTINGS = {
    "base_url": "http://127.0.0.1:8000/v1",
    "model": "openai/gpt-oss-120b",
    "served": "gpt-oss-120b",
    "tokenizer": "/var/lib/sparkfleet/hf/hub/models--openai--gpt-oss-120b/snapshots/abc",
    "book_url": "https://www.gutenberg.org/files/1661/1661-0.txt",
    "prompt_tokens": 2048,
    "output_tokens": 128,
    "runs": 3,
    "prefix_caching": True,
}


def test_the_profile_is_the_arenas_v2():
    # spark-arena/recipe-registry benchmarking/spark-arena-v2.yaml
    assert ARENA_V2 == {
        "depths": [0, 4096, 8192, 16384, 32768, 65535, 100000],
        "prompt_tokens": 2048,
        "output_tokens": 128,
        "concurrency": [1, 2, 5, 10],
        "runs": 3,
    }


@pytest.mark.parametrize(
    ("max_model_len", "kept", "skipped"),
    [
        (131072, ARENA_V2["depths"], []),
        # 100,000 + 2,048 + 128 does not fit 100,000; 65,535 + 2,176 does.
        (100000, [0, 4096, 8192, 16384, 32768, 65535], [100000]),
        (8192, [0, 4096], [8192, 16384, 32768, 65535, 100000]),
        (2048, [], ARENA_V2["depths"]),
        (None, ARENA_V2["depths"], []),
    ],
)
def test_depths_beyond_the_served_context_are_skipped(max_model_len, kept, skipped):
    assert fitting_depths(ARENA_V2["depths"], 2048, 128, max_model_len) == (kept, skipped)


def test_pairs_run_depth_by_depth_fewest_requests_first():
    assert pairs([4096, 0], [5, 1]) == [(0, 1), (0, 5), (4096, 1), (4096, 5)]


def test_the_first_pair_warms_up_and_the_others_do_not():
    first = llama_benchy_args(SETTINGS, 0, 1, first=True, result_file="/tmp/r.json")
    later = llama_benchy_args(SETTINGS, 4096, 5, first=False, result_file="/tmp/r.json")
    assert "--no-warmup" not in first and "--no-warmup" in later
    assert later[later.index("--depth") + 1] == "4096" and later[later.index("--concurrency") + 1] == "5"
    for args in (first, later):
        assert args[args.index("--pp") + 1] == "2048" and args[args.index("--tg") + 1] == "128"
        assert {"--enable-prefix-caching", "--skip-coherence", "--exit-on-first-fail"} <= set(args)
        assert args[args.index("--format") + 1] == "json"
        assert args[args.index("--tokenizer") + 1] == SETTINGS["tokenizer"]


def test_no_prefix_caching_on_a_server_without_it():
    args = llama_benchy_args({**SETTINGS, "prefix_caching": False}, 0, 1, first=True, result_file="/r.json")
    assert "--enable-prefix-caching" not in args


def test_the_key_never_is_an_argument():
    args = llama_benchy_args(SETTINGS, 0, 1, first=True, result_file="/tmp/r.json")
    assert "--api-key" not in args
    # The runner appends it inside the process, from the environment (and takes it out of the environment).
    namespace = {}
    code = RUNNER.replace("from llama_benchy.__main__ import main", "main = lambda: None")
    saved = sys.argv
    os.environ[KEY_VARIABLE] = "secret"
    try:
        sys.argv = ["-c", *args]
        exec(code, namespace)  # the module's own program, with main stubbed
        assert sys.argv[0] == "llama-benchy" and sys.argv[-2:] == ["--api-key", "secret"]
        assert KEY_VARIABLE not in os.environ
    finally:
        sys.argv = saved
        os.environ.pop(KEY_VARIABLE, None)


def test_a_report_reads_as_one_row_per_depth_and_concurrency():
    (row,) = rows(REPORT)
    assert (row["depth"], row["concurrency"], row["prompt_tokens"], row["output_tokens"]) == (1024, 2, 512, 32)
    # The stand-in's known rates: 2,000 tok/s prefill and 50 tok/s decode per request, two requests at once.
    assert row["decode_per_request_tok_s"] == pytest.approx(50, rel=0.05)
    assert row["decode_tok_s"] == pytest.approx(100, rel=0.05)
    assert row["prefill_tok_s"] == pytest.approx(4000, rel=0.05)
    assert row["context_prefill_tok_s"] == pytest.approx(4000, rel=0.05)
    assert row["ttft_ms"] == pytest.approx(512 / 2000 * 1000, rel=0.05)
    assert missing_figures([row], 1024, 2) is None


def test_a_pair_without_figures_is_named():
    assert missing_figures([], 0, 1) == "llama-benchy reported nothing for depth 0 at concurrency 1"
    empty = {**rows(REPORT)[0], "depth": 0, "concurrency": 1, "decode_tok_s": None}
    assert missing_figures([empty], 0, 1) == "llama-benchy measured no decode speed for depth 0 at concurrency 1"


def test_published_figures_join_by_depth_and_concurrency():
    published = [{"depth": 1024, "concurrency": 2, "decode_tok_s": 58.82}, {"depth": 0, "concurrency": 1}]
    (row,) = with_published(rows(REPORT), published)
    assert row["published_decode_tok_s"] == 58.82 and row["published_prefill_tok_s"] is None
    (row,) = with_published(rows(REPORT), [])
    assert row["published_decode_tok_s"] is None


def test_the_report_files():
    arena = {"profile": {**ARENA_V2, "prefix_caching": True}, "skipped_depths": [], "rows": rows(REPORT)}
    table = list(csv.DictReader(io.StringIO(arena_csv(arena))))
    assert [(line["depth"], line["concurrency"]) for line in table] == [("1024", "2")]
    assert arena_png(arena, "sm").startswith(b"\x89PNG")
