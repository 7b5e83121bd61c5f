"""The vllm_bench role through a real ansible-playbook run on localhost against a stand-in vLLM on 127.0.0.1: it
measures the endpoints that vllm_server published (fact vllm_server_endpoints), reads the recipe for the decode
bound and the published table, and writes results.json, results.csv, sweep.png and report.md per model; and bad
settings fail first with the variable named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from helpers.vllm_standin import Server, start_server, stop_server

MODEL = "nemotron-3-super"  # the recipe's served name: its published table and architecture come along
KEY = "role-key"
# Fast stand-in rates (the bench's accuracy is test_vllm_bench.py's business) and a batching cost, so the sweep
# turns up within 1, 2, 4 at --max-num-seqs 2. 10 ms a token, not less: a busy machine's scheduling jitter on a
# 2.5 ms token hid the knee (the ITL and aggregate rules compare levels a few ms apart).
STANDIN_ENV = {
    "VLLM_STANDIN_LOAD_SECONDS": "0.1",
    "VLLM_STANDIN_PREFILL_TOK_S": "40000",
    "VLLM_STANDIN_DECODE_TOK_S": "100",
    "VLLM_STANDIN_BATCH_COST": "0.5",
}
SCENARIOS = [{"name": "typical judge call", "prompt_tokens": 58, "output_tokens": 2}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "--served-model-name", MODEL, "--api-key", KEY]
    # Speculating (3 draft tokens a step, 2 accepted): the report shows the acceptance per scenario.
    args += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})]
    standin = start_server(tmp_path_factory.mktemp("standin"), [*args, "--max-num-seqs", "2"], STANDIN_ENV)
    yield standin
    stop_server(standin)


def run_role(tmp: Path, server: Server, **settings) -> subprocess.CompletedProcess:
    """One playbook: the facts the "Model serving" play would publish, then the role."""
    endpoint = {
        "served": MODEL,
        "kind": "chat",
        "port": server.port,
        "url": f"http://127.0.0.1:{server.port}",
        "unit": "vllm-nemotron.service",
    }
    endpoint |= {"recipe": "nemotron-3-super-120b-a12b-nvfp4", "image_shown": "vllm/vllm-openai@sha256:abc"}
    endpoint |= {"memory": "weights 74.8 GiB + KV 20 GiB of 108 GiB", "hf_repo": "nvidia/x", "hf_revision": "ff43"}
    variables = {
        "vllm_server_endpoints": [endpoint],
        "sparkfleet_api_key": KEY,
        "vllm_bench_results_dir": str(tmp / "results"),
        "vllm_bench_scenarios": SCENARIOS,
        "vllm_bench_runs": 1,
        "vllm_bench_sweep_max_concurrency": 4,
        "vllm_bench_sweep_prompt_tokens": 50,
        "vllm_bench_sweep_output_tokens": 20,
        # The Arena profile (llama-benchy) is test_vllm_bench_arena.py's.
        "vllm_bench_arena": False,
        "ansible_python_interpreter": sys.executable,
    } | settings
    play = {"hosts": "spark-1", "gather_facts": False, "vars": variables, "roles": ["vllm_bench"]}
    (tmp / "play.yml").write_text(yaml.safe_dump([play]))
    argv = [ansible_tool("ansible-playbook"), "-i", "spark-1,", "-c", "local", str(tmp / "play.yml")]
    env = os.environ | {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_role_writes_the_results_and_a_report_per_model(tmp_path: Path, server: Server) -> None:
    done = run_role(tmp_path, server)
    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "results" / "spark-1" / MODEL
    results = json.loads((folder / "results.json").read_text())
    assert [row["scenario"] for row in results["scenarios"]] == ["typical judge call"]
    # The recipe's published row and the bandwidth bound (273 GB/s over 12.7 B x 0.5625 B) ride along.
    row = results["scenarios"][0]
    assert row["published_ttft_s"] == 0.42
    assert row["decode_bound_tok_s"] == pytest.approx(273e9 / (12.7e9 * 0.5625), rel=1e-3)
    assert [level["concurrency"] for level in results["sweep"]["levels"]] == [1, 2, 4]
    assert results["sweep"]["knee"] is not None
    assert (folder / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "results.csv").read_text().count("\n") == 1 + 1 + 3  # header, a scenario, three levels
    report = (folder / "report.md").read_text()
    assert f"# Local evaluation: {MODEL} on spark-1" in report
    assert "| typical judge call | 58 / 2 |" in report
    assert "(0.42)" in report  # the published TTFT beside the measured one
    assert f"**Latency turns up at {results['sweep']['knee']['concurrency']} concurrent requests**" in report
    assert "vllm/vllm-openai@sha256:abc" in report and "weights 74.8 GiB" in report
    # The judge call's 2 tokens: after the first, one draft of 3 tokens and none accepted (one token was left).
    assert (row["spec_acceptance_rate"], row["spec_accepted_length"]) == (0.0, 1.0)
    assert "| typical judge call | 0 % | 1.00 |" in report
    assert "0% of drafts accepted, 1.00 tokens a step" in done.stdout
    # The key never reaches the output.
    assert KEY not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"vllm_bench_models": ["no-such-model"]}, "vllm_bench_models names no-such-model"),
        ({"vllm_bench_runs": 0}, "vllm_bench_runs (0) must be at least 1"),
        (
            {"vllm_bench_arena": True, "vllm_bench_arena_book_url": "http://books.example/1661.txt"},
            "vllm_bench_arena_book_url='http://books.example/1661.txt' uses plain http to another machine",
        ),
        ({"vllm_bench_arena": True, "vllm_bench_arena_depths": [0, -1]}, "vllm_bench_arena_depths[1]"),
        ({"vllm_bench_arena": True, "vllm_bench_arena_concurrency": []}, "vllm_bench_arena_concurrency"),
        ({"vllm_bench_arena": True, "vllm_bench_arena_output_tokens": 1}, "vllm_bench_arena_output_tokens"),
    ],
)
def test_bad_settings_fail_before_any_request(tmp_path: Path, server: Server, settings: dict, named: str) -> None:
    done = run_role(tmp_path, server, **settings)
    assert done.returncode != 0
    assert named in done.stdout, done.stdout
    assert not (tmp_path / "results").exists()
