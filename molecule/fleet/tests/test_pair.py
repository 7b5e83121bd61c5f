"""fleet-1 and fleet-2 serve one model together (tensor parallel 2, vLLM's native multi-node mode): the same
command on both with rank 0 and a headless rank 1, every socket pinned to the pair's own network (the stand-in
for the ConnectX-7 link), a head that serves only while its worker is in, and a bandwidth gate measured in the
pinned image before the pair starts."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import testinfra

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
UNIT = "vllm-qwen3-0.6b"
FABRIC = {"fleet-1": "10.77.0.11", "fleet-2": "10.77.0.12"}


def host(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def container(name: str) -> dict:
    return json.loads(host(name).check_output(f"docker inspect {UNIT}"))[0]


def test_both_ranks_run_one_command_pinned_to_the_fabric():
    for name, rank in (("fleet-1", "0"), ("fleet-2", "1")):
        config = container(name)
        args, env = config["Args"], dict(item.split("=", 1) for item in config["Config"]["Env"])
        assert args[args.index("--tensor-parallel-size") + 1] == "2"
        assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--node-rank") + 1] == rank
        assert args[args.index("--master-addr") + 1] == FABRIC["fleet-1"]
        assert ("--headless" in args) == (rank == "1")
        assert env["VLLM_HOST_IP"] == FABRIC[name] and env["MASTER_ADDR"] == FABRIC["fleet-1"]
        for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            assert env[variable] == "eth0", variable
        assert config["HostConfig"]["NetworkMode"] == "host" and config["HostConfig"]["IpcMode"] == "host"


def test_the_worker_joined_over_the_fabric_and_only_the_head_serves():
    journal = host("fleet-1").check_output(f"journalctl -u {UNIT} --no-pager")
    assert f"node rank 1 joined from {FABRIC['fleet-2']}" in journal
    assert host("fleet-1").socket("tcp://0.0.0.0:8000").is_listening
    assert not host("fleet-2").socket("tcp://0.0.0.0:8000").is_listening


def test_the_head_goes_down_with_its_worker_and_both_come_back_by_themselves():
    head, worker = host("fleet-1"), host("fleet-2")
    restarts = int(head.check_output(f"systemctl show -P NRestarts {UNIT}"))
    worker.check_output(f"systemctl restart {UNIT}")
    # The head's collective broke: it exits, systemd starts it again, it waits for the worker, then serves.
    # Generous: a busy machine slows the restart, never the outcome.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        healthy = head.run("curl -fsS -o /dev/null http://127.0.0.1:8000/health").rc == 0
        if int(head.check_output(f"systemctl show -P NRestarts {UNIT}")) > restarts and healthy:
            break
        time.sleep(2)
    else:
        raise AssertionError(head.check_output(f"journalctl -u {UNIT} --no-pager -n 30"))
    assert "went away" in head.check_output(f"journalctl -u {UNIT} --no-pager")


def kept_bandwidth(name: str) -> dict:
    return json.loads(host(name).check_output("cat /var/lib/sparkfleet/fabric/bandwidth.json"))


def test_the_pairs_bandwidth_was_measured_in_the_image_it_serves_from_over_the_fabric():
    kept = {name: kept_bandwidth(name) for name in FABRIC}
    assert kept["fleet-1"]["key"] == kept["fleet-2"]["key"]
    result = kept["fleet-1"]
    assert result["group"] == "fleet_pair" and result["busbw_gbs"] > 0
    # The stand-in image's stand-in torch ran the script (the real torch runs it in tests/unit).
    assert "# torch 0.0.0+sparkfleet.standin backend nccl" in result["output"]
    assert "# Collective test concluded: all_reduce_perf" in result["output"]
    assert result["image"] == container("fleet-1")["Image"]  # the image the pair serves from (the rolling update's)


def test_a_rerun_judges_the_kept_result_and_a_pair_below_the_threshold_is_refused_and_left_running():
    before = {name: host(name).check_output(f"systemctl show -P InvocationID {UNIT}") for name in FABRIC}
    # node_exporter's textfile folder (the fleet has no monitoring host to install node_exporter): the result is
    # exported there once it exists.
    host("fleet-1").check_output("mkdir -p /var/lib/prometheus/node-exporter")
    # The first run measures only if the tests before changed a setting the result is kept with; the second judges
    # the kept figure either way, and measures nothing.
    kept = run_site("--tags", "fabric", "--limit", "fleet_pair")
    assert kept.returncode == 0, said(kept)[-3000:]
    stamp = "stat -c %Y /var/lib/sparkfleet/fabric/bandwidth.json"
    measured = {name: host(name).check_output(stamp) for name in FABRIC}
    kept = run_site("--tags", "fabric", "--limit", "fleet_pair")
    assert kept.returncode == 0, said(kept)[-3000:]
    assert "(kept from the last test with these settings)" in said(kept)
    assert {name: host(name).check_output(stamp) for name in FABRIC} == measured
    metrics = host("fleet-1").check_output("cat /var/lib/prometheus/node-exporter/sparkfleet-fabric.prom")
    assert f'sparkfleet_fabric_busbw_gbs{{group="fleet_pair"}} {kept_bandwidth("fleet-1")["busbw_gbs"]:g}' in metrics
    assert 'sparkfleet_fabric_bandwidth_passed{group="fleet_pair"} 1' in metrics
    refused = run_site("--tags", "fabric", "--limit", "fleet_pair", "-e", "spark_fabric_min_busbw_gbs=100000")
    assert refused.returncode != 0
    assert "group fleet_pair: bus bandwidth" in said(refused)
    assert "below the 100000 GB/s the group needs (spark_fabric_min_busbw_gbs); likely causes: (1)" in said(refused)
    assert "The pair's model is not started" in said(refused)
    after = {name: host(name).check_output(f"systemctl show -P InvocationID {UNIT}") for name in FABRIC}
    assert after == before  # the running pair was not touched
    metrics = host("fleet-1").check_output("cat /var/lib/prometheus/node-exporter/sparkfleet-fabric.prom")
    assert 'sparkfleet_fabric_bandwidth_passed{group="fleet_pair"} 0' in metrics
