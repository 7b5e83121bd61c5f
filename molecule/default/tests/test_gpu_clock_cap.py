"""The optional GPU clock cap (roles/spark_gpu_clock) on the simulated Spark, whose stand-in nvidia-smi keeps the
lock it was given in /run/sparkfleet-standin/locked-gpu-clocks: on, a unit locks the clocks (and would at every
boot); a second run changes nothing; a new maximum is applied at once; off, the unit is stopped, which resets the
clocks, and removed, and a run after that changes nothing either. A bad value stops the run naming it."""

import json
import os
import sys
from pathlib import Path

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import changed_per_host, run_site, said  # noqa: E402

PLAYBOOK = "molecule/default/gpu-clock-cap.yml"
UNIT = "sparkfleet-gpu-clock-cap.service"
LOCKED = "/run/sparkfleet-standin/locked-gpu-clocks"


def cap(value: int | None):
    done = run_site("-e", json.dumps({"spark_gpu_clock_max_mhz": value}), playbook=PLAYBOOK, timeout=300)
    assert done.returncode == 0, said(done)[-3000:]
    return changed_per_host(done.stdout)


def test_the_cap_is_applied_kept_changed_and_removed(host):
    assert cap(2000)["simspark-1"] > 0
    assert host.service(UNIT).is_enabled and host.service(UNIT).is_running
    assert host.file(LOCKED).content_string.strip() == "0,2000"
    assert cap(2000)["simspark-1"] == 0

    assert cap(1800)["simspark-1"] > 0
    assert host.file(LOCKED).content_string.strip() == "0,1800"

    assert cap(None)["simspark-1"] > 0
    assert not host.file(f"/etc/systemd/system/{UNIT}").exists
    assert not host.file(LOCKED).exists  # stopping the unit reset the clocks
    assert cap(None)["simspark-1"] == 0


def test_a_cap_out_of_range_stops_the_run_naming_it(host):
    done = run_site("-e", json.dumps({"spark_gpu_clock_max_mhz": 50}), playbook=PLAYBOOK, timeout=300)
    assert done.returncode != 0
    assert "spark_gpu_clock_max_mhz" in said(done)
    assert not host.file(f"/etc/systemd/system/{UNIT}").exists
