"""inventories/fleet-example/: it parses, its variables exist and land where its comments say, and the preflight
play refuses a broken fleet (a group of one, mismatched ends, a two-Spark model on a single Spark) before any
host changes, naming the host and the variable. Runs the real preflight play with every host on this machine
(local connection) and the stand-in nvidia-smi.

How it runs: every preflight run of this module (each case is the example, or a broken copy of it, whose host
names the messages must name) goes side by side with the others once the first test needs one (`runs`), and each
test reads its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from test_preflight_role import FITS, said

EXAMPLE = ROOT / "inventories" / "fleet-example"
ALL_LOCAL = {
    **FITS,
    "ansible_connection": "local",
    "vault_vllm_api_key": "test-key",
    "vault_grafana_admin_password": "test-grafana-password",
}


def inventory(*argv: str, path: Path = EXAMPLE) -> dict:
    argv = [ansible_tool("ansible-inventory"), "-i", str(path), *argv]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def preflight_argv(path: Path, *extra: str, **overrides) -> list[str]:
    variables = {**ALL_LOCAL, "ansible_python_interpreter": sys.executable, **overrides}
    argv = [ansible_tool("ansible-playbook"), "-i", str(path), "playbooks/preflight.yml", "-e", json.dumps(variables)]
    return [*argv, *extra]


def copy_of_the_example(folder: Path, name: str) -> Path:
    copy = folder / name
    shutil.copytree(EXAMPLE, copy)
    return copy


def with_pair_a_of(copy: Path, *members: str) -> Path:
    """COPY of the example with MEMBERS (and no other Spark) in pair_a, in that order."""
    hosts = yaml.safe_load((copy / "hosts.yml").read_text(encoding="utf-8"))
    sparks = hosts["all"]["children"]["sparks"]
    sparks["children"]["spark_pairs"]["children"]["pair_a"]["hosts"] = dict.fromkeys(members)
    left = sorted({"spark-2", "spark-3"} - set(members))  # a Spark of the pair left out of it serves alone
    if left:
        sparks["children"]["single_sparks"]["hosts"].update(dict.fromkeys(left))
    (copy / "hosts.yml").write_text(yaml.safe_dump(hosts), encoding="utf-8")
    return copy


def with_host_vars(copy: Path, host: str, text: str) -> Path:
    """COPY of the example with TEXT as HOST's host_vars."""
    (copy / "host_vars").mkdir()
    (copy / "host_vars" / f"{host}.yml").write_text(text, encoding="utf-8")
    return copy


TWO_SPARK_QWEN = [{"recipe": "qwen3-0.6b", "port": 8000, "tensor_parallel_size": 2}]

# A pair without both halves of its port, by test id: (the pair's variables, what the refusal must say).
HALVES = {
    "one-half": (
        {"spark_fabric_interfaces": ["enp1s0f1np1"]},
        "spark-2 (group pair_a): spark_fabric_interfaces must name the two halves of the cabled ConnectX-7 port, "
        "the first carrying the rendezvous (got ['enp1s0f1np1']).",
    ),
    "one-half-twice": (
        {"spark_fabric_interfaces": ["enp1s0f1np1", "enp1s0f1np1"]},
        "set spark_fabric_interfaces: [enp1s0f1np1, enP2p1s0f1np1] (`ibdev2netdev` lists the names) and give the "
        "second half an address too, in a subnet of its own, on every Spark",
    ),
    "old-variable": (
        {"spark_fabric_interface": "enp1s0f1np1"},
        "spark-2: spark_fabric_interface and spark_fabric_address (one interface) are replaced by the lists "
        "spark_fabric_interfaces and spark_fabric_addresses",
    ),
    "addresses-short": (
        {"spark_fabric_addresses": ["192.168.100.10"]},
        "spark_fabric_addresses must be empty or hold one distinct IPv4 address per interface of "
        "spark_fabric_interfaces, in the same order (got ['192.168.100.10'] for ['enp1s0f1np1', 'enP2p1s0f1np1'])",
    ),
}


@pytest.fixture(scope="module")
def runs(playbook_runs, nvidia_smi_env, tmp_path_factory):
    """Every preflight run of this module, handed over at once (those of the whole fleet, the longest, first), by
    the name its test reads."""
    env = nvidia_smi_env("gb10")
    copies = tmp_path_factory.mktemp("fleet")
    cases = {
        "group-of-three": preflight_argv(
            with_pair_a_of(copy_of_the_example(copies, "group-of-three"), "spark-2", "spark-3", "spark-4")
        ),
        "group-of-one": preflight_argv(with_pair_a_of(copy_of_the_example(copies, "group-of-one"), "spark-2")),
        "the-example": preflight_argv(EXAMPLE),
        "ends-with-different-ports": preflight_argv(
            with_host_vars(
                copy_of_the_example(copies, "ports"),
                "spark-3",
                "spark_fabric_master_port: 29502\nspark_fabric_nccl_library: host\n",
            )
        ),
        "different-mtus": preflight_argv(
            with_host_vars(copy_of_the_example(copies, "mtus"), "spark-3", "spark_fabric_mtu: 1500\n")
        ),
        "two-spark-model-on-a-single-spark": preflight_argv(
            EXAMPLE, "--limit", "spark-1", vllm_server_models=TWO_SPARK_QWEN
        ),
    }
    for case, (fabric, _) in HALVES.items():
        cases[f"pair-with-{case}"] = preflight_argv(EXAMPLE, "--limit", "pair_a", **fabric)
    for name, argv in cases.items():
        playbook_runs.start(name, argv, env)
    return playbook_runs


def test_the_example_has_a_single_spark_a_pair_a_router_and_a_monitoring_host():
    groups = inventory("--list")
    sparks = set(groups["single_sparks"]["hosts"]) | {
        host for child in groups["spark_pairs"]["children"] for host in groups[child]["hosts"]
    }
    assert sparks == {"spark-1", "spark-2", "spark-3"}
    assert groups["pair_a"]["hosts"] == ["spark-2", "spark-3"]  # the first host is the head
    assert groups["router"]["hosts"] == ["gateway-1"]  # not a Spark: no GPU check, only the router's own
    assert groups["monitoring"]["hosts"] == ["gateway-1"]  # a frozen Spark cannot report itself: watch from outside
    assert "gateway-1" not in sparks


def test_a_pairs_variables_win_over_the_fleets():
    head = inventory("--host", "spark-2")
    single = inventory("--host", "spark-1")
    assert head["vllm_server_models"][0]["recipe"] == "llama-3.3-70b-instruct-bf16-tp2"
    assert head["spark_fabric_pair_group"] == "pair_a"
    assert single["vllm_server_models"][0]["recipe"] == "nemotron-3-super-120b-a12b-nvfp4"
    assert "spark_fabric_pair_group" not in single


def test_the_example_sets_only_variables_that_a_role_documents():
    # The site-wide variables (docs/site_variables.yml), and every role's.
    documented = set(yaml.safe_load((ROOT / "docs" / "site_variables.yml").read_text(encoding="utf-8")))
    for defaults in (ROOT / "roles").glob("*/defaults/main.yml"):
        documented |= set(yaml.safe_load(defaults.read_text(encoding="utf-8")) or {})
    for path in sorted(EXAMPLE.glob("group_vars/*/*.yml")):
        for name in yaml.safe_load(path.read_text(encoding="utf-8")) or {}:
            assert name in documented or name.startswith("ansible_"), f"{path.relative_to(ROOT)}: {name} is no role's"


def test_a_two_spark_model_on_a_single_spark_is_refused(runs):
    done = runs.result("two-spark-model-on-a-single-spark")
    assert done.returncode != 0
    assert (
        "spark-1: vllm_server_models[0] (qwen3-0.6b) has tensor_parallel_size 2 and pipeline_parallel_size 1, so it "
        "runs on 2 Sparks linked by ConnectX-7, one GPU each: this host is in no group." in said(done)
    )


def test_the_pairs_link_is_checked_on_each_spark(runs):
    # This machine has no ConnectX-7 port: both Sparks of the pair say so, by interface name.
    done = runs.result("the-example")
    assert done.returncode != 0
    for host in ("spark-2", "spark-3"):
        assert (
            f"{host}: the ConnectX-7 link of group pair_a (spark_fabric_interfaces=enp1s0f1np1, enP2p1s0f1np1) is "
            "not fit: there is no network interface enp1s0f1np1 (ibdev2netdev lists the ConnectX-7 ports); there "
            "is no network interface enP2p1s0f1np1" in said(done)
        )
    assert "changed=0" in said(done) and "changed=1" not in said(done)


def test_a_group_of_three_passes_the_inventory_and_each_spark_checks_its_link(runs):
    # Three Sparks through a switch: the inventory is fine, so each of the three goes on to read its own port.
    done = runs.result("group-of-three")
    assert done.returncode != 0
    assert "which names no inventory group" not in said(done) and "a group serves one model" not in said(done)
    for host in ("spark-2", "spark-3", "spark-4"):
        assert f"{host}: the ConnectX-7 link of group pair_a" in said(done)


def test_a_group_of_one_is_refused_by_name(runs):
    done = runs.result("group-of-one")
    assert done.returncode != 0
    assert (
        "spark-2: its group pair_a holds 1 Spark (spark-2), but a group serves one model on 2 to 8. Put the Sparks "
        "linked by ConnectX-7 that serve one model together (2 to 8, the head first) in an inventory group of their "
        "own and set spark_fabric_pair_group to its name in its group_vars." in said(done)
    )
    assert "is not fit" not in said(done)


def test_ends_of_one_cable_with_different_ports_are_refused(runs):
    done = runs.result("ends-with-different-ports")
    assert done.returncode != 0
    assert (
        "spark-2 and spark-3 (group pair_a) must have the same spark_fabric_pair_group, spark_fabric_master_port, "
        "spark_fabric_nccl_library and spark_fabric_netplan" in said(done)
    )
    assert "port 29501 / 29502" in said(done) and "NCCL image / host" in said(done)


def test_different_recommended_mtus_are_no_refusal(runs):
    # spark_fabric_mtu only decides when to advise jumbo frames; the MTUs the halves really have are compared once
    # read (tests/integration/test_fabric_link_info.py). Here the pair goes on to the link check, which finds no port.
    done = runs.result("different-mtus")
    assert "must have the same" not in said(done)
    assert "spark-3: the ConnectX-7 link of group pair_a" in said(done)


@pytest.mark.parametrize("case", list(HALVES))
def test_a_pair_without_both_halves_is_refused_before_the_link_is_read(runs, case):
    message = HALVES[case][1]
    done = runs.result(f"pair-with-{case}")
    assert done.returncode != 0
    assert message in said(done)
    assert "is not fit" not in said(done)  # refused by the inventory, before any host's link is read
