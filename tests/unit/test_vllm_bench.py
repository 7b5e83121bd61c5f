"""The OpenAI-endpoint benchmark (module_utils/openai_bench.py, and library/vllm_bench.py and vllm_bench_report.py
in-process through tests/unit/conftest.py's run_module) against stand-in vLLM servers on 127.0.0.1 whose timing
model is known (tests/standins/vllm/vllm_standin/engine.py):
time to first token = uncached prompt tokens / PREFILL_TOK_S, then one token every 1 / DECODE_TOK_S seconds, and
with BATCH_COST c each of n running requests waits (1 + (n - 1) c) / DECODE_TOK_S per token."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.vllm_standin import Server, free_port, start_server, stop_server
from openai_bench import (
    KNEE_RULE,
    BenchError,
    BenchSettings,
    Endpoint,
    PromptMaker,
    Scenario,
    _checked_result,
    check_model,
    find_knee,
    measure_request,
    percentile,
    run_bench,
    run_scenario,
    sweep_levels,
)
from recipe_rules import load_recipe

KEY = "bench-key"
MODEL = "bench-model"
PREFILL, DECODE = 2000.0, 50.0  # the timed server's rates
NEMOTRON = load_recipe("nemotron-3-super-120b-a12b-nvfp4", ROOT / "recipes")


def serve(tmp: Path, env: dict[str, str], *flags: str) -> Server:
    args = ["org/Bench-Model", "--served-model-name", MODEL, "--api-key", KEY, *flags]
    return start_server(tmp, args, {"VLLM_STANDIN_LOAD_SECONDS": "0.1", **env})


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"VLLM_STANDIN_PREFILL_TOK_S": str(PREFILL), "VLLM_STANDIN_DECODE_TOK_S": str(DECODE)}
    server = serve(tmp_path_factory.mktemp("timed"), env)
    yield server
    stop_server(server)


def endpoint(server: Server, key: str = KEY, model: str = MODEL) -> Endpoint:
    return Endpoint(server.base, model, key, timeout_s=30)


def within(measured: float, expected: float, tolerance: float = 0.05) -> bool:
    return abs(measured - expected) <= tolerance * expected


# --- what one request measures --------------------------------------------------------------------------


def test_scenario_figures_match_the_standin_timing_model(timed: Server) -> None:
    bench = endpoint(timed)
    maker = PromptMaker(bench, 400)
    # Three runs of the same shape: without fresh first ids the 2nd and 3rd would be prefix-cache hits, and
    # their TTFT (hence the median) would collapse far below 400 / PREFILL.
    row = run_scenario(bench, maker, Scenario("timed", 400, 21), runs=3, warmup=0, published={}, bound=None)
    expected_ttft = 400 / PREFILL  # 0.2 s
    expected_total = expected_ttft + 20 / DECODE  # 20 more tokens: 0.6 s
    assert within(row["ttft_s"], expected_ttft), row
    assert within(row["prefill_tok_s"], PREFILL), row
    assert within(row["decode_tok_s"], DECODE), row
    assert within(row["total_s"], expected_total), row
    assert within(row["itl_p50_s"], 1 / DECODE), row


def test_a_speculating_server_reports_its_acceptance_per_scenario(tmp_path: Path, timed: Server) -> None:
    """From vLLM's spec_decode counters before and after the measured runs (not the warm-up): the stand-in drafts 3
    tokens a step and accepts 2, so a 10-token answer takes 3 drafts of 9 tokens with 6 accepted."""
    speculative = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    env = {"VLLM_STANDIN_PREFILL_TOK_S": "100000", "VLLM_STANDIN_DECODE_TOK_S": "2000"}
    server = serve(tmp_path, env, "--speculative-config", speculative)
    try:
        bench = endpoint(server)
        row = run_scenario(
            bench, PromptMaker(bench, 32), Scenario("s", 32, 10), runs=2, warmup=1, published={}, bound=None
        )
    finally:
        stop_server(server)
    assert (row["spec_acceptance_rate"], row["spec_accepted_length"]) == (round(6 / 9, 3), 3.0)
    plain = run_scenario(endpoint(timed), PromptMaker(endpoint(timed), 32), Scenario("s", 32, 4), 1, 0, {}, None)
    assert (plain["spec_acceptance_rate"], plain["spec_accepted_length"]) == (None, None)


def test_prompts_have_the_exact_length_and_a_fresh_start(timed: Server) -> None:
    maker = PromptMaker(endpoint(timed), 1834)
    first, second = maker.prompt(1834), maker.prompt(1834)
    assert len(first) == len(second) == 1834
    assert first[:4] != second[:4] and first[4:] == second[4:]
    assert len(maker.prompt(2)) == 2
    result = measure_request(endpoint(timed), maker.prompt(58), 2)
    assert (result.prompt_tokens, result.completion_tokens, len(result.token_times_s)) == (58, 2, 2)


# --- clear errors ---------------------------------------------------------------------------------------


def test_an_unreachable_endpoint_says_where_it_looked() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BenchError, match=rf"cannot reach {url}: .*check that vLLM is running and listening there"):
        check_model(Endpoint(url, MODEL, timeout_s=2))


def test_an_unknown_model_lists_what_is_served(timed: Server) -> None:
    with pytest.raises(BenchError, match=r"model 'nemotron' is not served at .*lists: bench-model\); set model"):
        check_model(endpoint(timed, model="nemotron"))


@pytest.mark.parametrize(("key", "state"), [("wrong", "wrong"), ("", "missing")])
def test_a_wrong_or_missing_key_is_named(timed: Server, key: str, state: str) -> None:
    with pytest.raises(BenchError, match=rf"answered 401 Unauthorized: the API key is {state}; give the server"):
        check_model(endpoint(timed, key=key))


def test_a_server_without_usage_reporting_is_refused(tmp_path: Path) -> None:
    env = {"VLLM_STANDIN_PREFILL_TOK_S": "100000", "VLLM_STANDIN_DECODE_TOK_S": "1000"}
    server = serve(tmp_path, {**env, "VLLM_STANDIN_IGNORE_STREAM_OPTIONS": "1"})
    try:
        bench = endpoint(server)
        with pytest.raises(BenchError, match=r"does not report usage with stream_options.include_usage; sparkfleet"):
            measure_request(bench, PromptMaker(bench, 58).prompt(58), 2)
    finally:
        stop_server(server)


def test_a_prompt_or_output_length_the_server_counts_differently_is_refused() -> None:
    bench = Endpoint("http://127.0.0.1:1", MODEL)
    usage = {"prompt_tokens": 59, "completion_tokens": 2}
    with pytest.raises(BenchError, match="a prompt of exactly 58 tokens, the server counted 59"):
        _checked_result(bench, [0.1, 0.2], 0.2, usage, 58, 2)
    with pytest.raises(BenchError, match=r"exactly 3 output tokens .* got 2; the server must honour ignore_eos"):
        _checked_result(bench, [0.1, 0.2], 0.2, {**usage, "prompt_tokens": 58}, 58, 3)


# --- the knee and the statistics ------------------------------------------------------------------------


def level(concurrency: int, tok_s: float, itl: float = 0.02, ttft: float = 0.2) -> dict:
    return {"concurrency": concurrency, "output_tok_s": tok_s, "itl_p50_s": itl, "ttft_p95_s": ttft}


@pytest.mark.parametrize(
    ("rows", "knee", "reason"),
    [
        ([level(1, 50), level(2, 95), level(4, 180)], None, None),
        ([level(1, 50), level(2, 95, itl=0.029), level(4, 150, itl=0.031)], 4, "p50 ITL 31.0 ms vs 20.0 ms"),
        ([level(1, 50), level(2, 95, ttft=0.29), level(4, 180, ttft=0.35)], 4, "p95 TTFT 0.350 s vs 0.200 s"),
        ([level(1, 50), level(2, 95), level(4, 104)], 4, "aggregate 104.0 tok/s vs 95.0 at 2"),
        # a 1.5x rise of a tiny TTFT is jitter, not queueing: it must also be 50 ms longer
        ([level(1, 50, ttft=0.01), level(2, 95, ttft=0.03)], None, None),
    ],
)
def test_the_knee_rule(rows: list[dict], knee: int | None, reason: str | None) -> None:
    found = find_knee(rows)
    assert (found or {}).get("concurrency") == knee
    if reason:
        assert reason in found["reason"]


def test_percentiles_and_levels() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert percentile([], 50) is None
    assert sweep_levels(8) == [1, 2, 4, 8]
    assert sweep_levels(6) == [1, 2, 4, 6]
    assert sweep_levels(1) == [1]


# --- the modules, in-process: each case's result by name, computed once for the module --------------------


def bench_args(server: Server | None, **args: object) -> dict:
    params = {"url": server.base if server else "http://127.0.0.1:1", "model": MODEL, "api_key": KEY, "runs": 1}
    return {**params, **args}


@pytest.fixture(scope="module")
def played(run_module, timed: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Each case's result by name, from the modules run in-process one after the other, as a play would."""
    tmp = tmp_path_factory.mktemp("played")
    fast = serve(tmp, {"VLLM_STANDIN_PREFILL_TOK_S": "50000", "VLLM_STANDIN_DECODE_TOK_S": "500"})
    # Batch cost 0.3: p50 ITL is 1.3x at 2 requests, 1.9x at 4 (the knee); at 8, four wait for a slot.
    batch_env = {"VLLM_STANDIN_PREFILL_TOK_S": "20000", "VLLM_STANDIN_DECODE_TOK_S": "200"}
    batched = serve(tmp, {**batch_env, "VLLM_STANDIN_BATCH_COST": "0.3"}, "--max-num-seqs", "4")
    architecture = {key: NEMOTRON["architecture"][key] for key in ("active_params_b", "bytes_per_param")}
    five = {"published": NEMOTRON["published_eval"]["rows"], **architecture}
    sweep = {"scenarios": [], "sweep_levels": [1, 2, 4, 8], "sweep_prompt_tokens": 200, "sweep_output_tokens": 40}
    results = {}
    try:
        results["five in check mode"] = run_module("vllm_bench", bench_args(fast, **five), check_mode=True)
        results["five"] = run_module("vllm_bench", bench_args(fast, **five))
        results["unknown model"] = run_module("vllm_bench", bench_args(timed, model="nope"))
        results["bad options"] = run_module("vllm_bench", bench_args(None, runs=0, sweep_levels=[4, 2]))
        results["sweep"] = run_module("vllm_bench", bench_args(batched, **sweep))
    finally:
        stop_server(fast)
        stop_server(batched)
    report = {"measurements": results["sweep"]["measurements"], "dest": str(tmp / "report")}
    results["report in check mode"] = run_module("vllm_bench_report", report, check_mode=True)
    results["report"] = run_module("vllm_bench_report", report)
    results["report again"] = run_module("vllm_bench_report", report)
    yield results | {"tmp": tmp}


def test_check_mode_measures_nothing(played: dict) -> None:
    checked = played["five in check mode"]
    assert (checked["changed"], "measurements" in checked) == (False, False)
    assert "check mode: nothing measured" in checked["msg"]


def test_the_module_measures_the_five_published_scenarios(played: dict) -> None:
    done = played["five"]
    assert not done.get("failed"), done.get("msg")
    assert done["changed"] is False
    assert KEY not in json.dumps(done)
    rows = done["measurements"]["scenarios"]
    published = {row["scenario"]: row for row in NEMOTRON["published_eval"]["rows"]}
    assert [(r["scenario"], r["prompt_tokens"], r["output_tokens"]) for r in rows] == [
        (name, row["prompt_tokens"], row["output_tokens"]) for name, row in published.items()
    ]
    bound = 273 / (12.7 * 0.5625)
    for row in rows:
        assert row["published_decode_tok_s"] == published[row["scenario"]]["decode_tok_s"]
        assert row["decode_bound_tok_s"] == pytest.approx(bound, abs=0.05)
        assert row["decode_vs_published"] == pytest.approx(row["decode_tok_s"] / row["published_decode_tok_s"], 1e-2)
        if row["output_tokens"] >= 100:  # long generations: the decode rate is the stand-in's 500 to within 10%
            assert within(row["decode_tok_s"], 500, 0.10), row


def test_an_unknown_model_fails_the_module_with_the_served_list(played: dict) -> None:
    done = played["unknown model"]
    assert done["failed"] is True
    assert "model 'nope' is not served at" in done["msg"] and "bench-model" in done["msg"]


def test_bad_options_are_named_before_anything_is_sent(played: dict) -> None:
    done = played["bad options"]
    assert done["failed"] is True
    assert "runs=0: must be at least 1" in done["msg"] and "sweep_levels=[4, 2]" in done["msg"]


def test_the_sweep_finds_the_knee(played: dict) -> None:
    sweep = played["sweep"]["measurements"]["sweep"]
    rows = sweep["levels"]
    assert [(row["concurrency"], row["requests"], row["failures"]) for row in rows] == [
        (1, 2, 0),
        (2, 4, 0),
        (4, 8, 0),
        (8, 16, 0),
    ]
    assert sweep["knee"]["concurrency"] == 4, sweep["knee"]
    assert "p50 ITL" in sweep["knee"]["reason"]
    assert within(rows[2]["itl_p50_s"], 1.9 / 200, 0.10), rows[2]
    assert rows[3]["ttft_p95_s"] > 5 * rows[2]["ttft_p95_s"]  # queued behind --max-num-seqs 4
    assert sweep["knee_rule"] == KNEE_RULE
    assert "knee at 4" in played["sweep"]["msg"]


def test_the_report_writes_json_csv_and_png_once(played: dict) -> None:
    checked, written, again = played["report in check mode"], played["report"], played["report again"]
    assert checked["changed"] is True and sorted(checked["changed_files"]) == sorted(written["files"].values())
    assert written["changed"] is True, written.get("msg")
    assert sorted(written["files"]) == ["csv", "json", "png"]
    png = Path(written["files"]["png"]).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR" and len(png) > 10_000
    assert json.loads(Path(written["files"]["json"]).read_text())["sweep"]["knee"]["concurrency"] == 4
    table = list(csv.DictReader(io.StringIO(Path(written["files"]["csv"]).read_text())))
    assert [row["section"] for row in table] == ["sweep"] * 4
    assert [row["concurrency"] for row in table] == ["1", "2", "4", "8"]
    assert [row["knee"] for row in table] == ["False", "False", "True", "False"]
    assert oct(Path(written["files"]["csv"]).stat().st_mode & 0o777) == "0o644"
    assert (again["changed"], again["changed_files"]) == (False, [])


def test_each_run_draws_a_fresh_seed_unless_given_one(timed: Server) -> None:
    """A rerun must not send the prompts of the run before: vLLM's prefix cache still holds them."""
    bench = endpoint(timed)
    fresh = [run_bench(bench, BenchSettings(scenarios=[]))["seed"] for _ in range(2)]
    assert fresh[0] != fresh[1]
    assert run_bench(bench, BenchSettings(scenarios=[], seed=7))["seed"] == 7


def test_the_report_sets_the_speculation_off_variant_beside_each_scenario(
    run_module, tmp_path: Path, timed: Server
) -> None:
    """acceptance.yml's comparison: the scenarios measured with speculation off go to a variant folder inside the
    model's; the run with speculation on names it, and its results set each scenario beside the variant's. The
    stand-in emits 2 accepted tokens and one more per step in one plain step's time: decode 3x as fast."""
    scenario = {"name": "s", "prompt_tokens": 32, "output_tokens": 31}
    speculative = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    env = {"VLLM_STANDIN_PREFILL_TOK_S": str(PREFILL), "VLLM_STANDIN_DECODE_TOK_S": str(DECODE)}
    speculating = serve(tmp_path, env, "--speculative-config", speculative)
    try:
        on = run_module("vllm_bench", bench_args(speculating, scenarios=[scenario, {**scenario, "name": "t"}]))
    finally:
        stop_server(speculating)
    off = run_module("vllm_bench", bench_args(timed, scenarios=[scenario]))
    model = tmp_path / "spark-1" / MODEL
    written_off = run_module("vllm_bench_report", {"measurements": off["measurements"], "dest": str(model / "off")})
    assert not written_off.get("failed"), written_off
    never = run_module(
        "vllm_bench_report", {**{"measurements": on["measurements"]}, "dest": str(model), "compare_with": "x"}
    )
    assert never["comparison"] is None
    written = run_module(
        "vllm_bench_report", {"measurements": on["measurements"], "dest": str(model), "compare_with": "off"}
    )
    comparison = written["comparison"]
    assert (comparison["variant"], comparison["unmatched"]) == ("off", ["t"])
    assert comparison["variant_measured_at"] == off["measurements"]["measured_at"]
    (row,) = comparison["rows"]
    measured_off, measured_on = off["measurements"]["scenarios"][0], on["measurements"]["scenarios"][0]
    assert (row["variant_decode_tok_s"], row["decode_tok_s"]) == (
        measured_off["decode_tok_s"],
        measured_on["decode_tok_s"],
    )
    assert row["decode_speedup"] == round(measured_on["decode_tok_s"] / measured_off["decode_tok_s"], 3)
    assert within(row["decode_speedup"], 3.0, 0.15), row
    assert (row["spec_acceptance_rate"], measured_off["spec_acceptance_rate"]) == (round(2 / 3, 3), None)
    assert json.loads((model / "results.json").read_text())["comparison"] == comparison
    # A variant left from before this run (acceptance.yml passes its own start) is not compared, with a warning.
    args = {"measurements": on["measurements"], "dest": str(model), "compare_with": "off"}
    current = run_module("vllm_bench_report", {**args, "compare_since": off["measurements"]["measured_at"]})
    assert current["comparison"] == comparison
    stale = run_module("vllm_bench_report", {**args, "compare_since": "2999-01-01T00:00:00Z"})
    assert stale["comparison"] is None and any("before this run" in w for w in stale.get("warnings", [])), stale
    wrong = run_module("vllm_bench_report", {**args, "compare_since": "yesterday"})
    assert wrong["failed"] and "compare_since='yesterday': expected a UTC time" in wrong["msg"]
