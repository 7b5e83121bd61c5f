"""acceptance.yml with speculation off and on, on fleet-3 (which decodes with a draft model, see molecule.yml): the
Spark serves its model once without the recipe's speculative block (vllm_server_speculation false), measures the
scenarios into a speculation-off folder, serves it with speculation again, and the acceptance report sets both side
by side. The stand-in decodes a step's accepted tokens and one more in one plain step's time, with a known
acceptance (2 of 3 draft tokens), so speculation must show in both the counters and the decode rate.

Runs last (file order): fleet-3 restarts twice, which the router and the rollout tests must not see.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import testinfra

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
SPECULATING = testinfra.get_host(f"ansible://fleet-3?ansible_inventory={INVENTORY}")
UNIT = "vllm-qwen3-0.6b"
SERVED = "qwen3-0.6b"
# 31 tokens: the first, then 10 steps of 2 accepted and 1 more, so exactly 2 of every 3 draft tokens are accepted
# (a length that leaves a short last step would accept fewer).
SCENARIO = {"name": "short question", "prompt_tokens": 58, "output_tokens": 31}


def invocation() -> str:
    return SPECULATING.check_output(f"systemctl show {UNIT} --property=InvocationID --value")


def speculative_config() -> dict | None:
    """The --speculative-config the running container got, or None."""
    args = json.loads(SPECULATING.check_output(f"docker inspect --format '{{{{json .Args}}}}' {UNIT}"))
    return json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None


@pytest.fixture(scope="module")
def accepted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, tuple[str, str]]:
    """One acceptance.yml run on fleet-3 (the serving stages, then the comparison and the bench), with one short
    scenario, no sweep and no Arena profile: its output, the model's results folder, the unit's InvocationID
    before and after."""
    before = invocation()
    results = tmp_path_factory.mktemp("acceptance")
    settings = {
        "vllm_bench_results_dir": str(results),
        "vllm_bench_scenarios": [SCENARIO],
        "vllm_bench_runs": 1,
        "vllm_bench_sweep_max_concurrency": 0,
        "vllm_bench_arena": False,
    }
    done = run_site(
        "--limit", "fleet-3", "--tags", "serving,untagged", "-e", json.dumps(settings), playbook="acceptance.yml"
    )
    assert done.returncode == 0, said(done)[-4000:]
    return said(done), results / "fleet-3" / SERVED, (before, invocation())


def test_the_scenarios_were_measured_without_speculation_in_a_folder_of_their_own(accepted):
    _, folder, _ = accepted
    off = json.loads((folder / "speculation-off" / "results.json").read_text())
    (row,) = off["scenarios"]
    # Served without --speculative-config: vLLM exports no spec_decode counters, so no acceptance is reported.
    assert (row["scenario"], row["spec_acceptance_rate"]) == (SCENARIO["name"], None)
    assert (
        "# Acceptance report, speculation off: qwen3-0.6b on fleet-3"
        in (folder / "speculation-off" / "report.md").read_text()
    )


def test_the_acceptance_report_sets_speculation_off_beside_on(accepted):
    output, folder, _ = accepted
    results = json.loads((folder / "results.json").read_text())
    (row,) = results["comparison"]["rows"]
    assert results["comparison"]["variant"] == "speculation-off"
    # The stand-in's known acceptance: 2 of every 3 draft tokens.
    assert row["spec_acceptance_rate"] == pytest.approx(2 / 3, abs=0.001)
    # Three tokens a step where one came before: faster by well over half even on a busy machine.
    assert row["decode_speedup"] > 1.5, row
    report = (folder / "report.md").read_text()
    assert "## Compared with speculation-off" in report
    assert f"{SCENARIO['name']} against speculation-off: decode" in output


def test_the_model_serves_with_its_draft_again_after_two_restarts(accepted):
    _, _, (before, after) = accepted
    assert before != after
    assert SPECULATING.service(f"{UNIT}.service").is_running
    config = speculative_config()
    assert config is not None and config["method"] == "draft_model", config
    # And the files a later run compares with say so too.
    assert "--speculative-config" in SPECULATING.file(f"/etc/systemd/system/{UNIT}.service").content_string
