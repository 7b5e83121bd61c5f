"""The fabric_link_info module and the spark_fabric role that uses it: two real veth links between two network
namespaces of this machine stand in for the two halves of the ConnectX-7 port cabled between two Sparks (the
kernel reports 10000 Mb/s for veth), and three namespaces on two bridges of a fourth for a group of three Sparks
through a switch. The module runs inside a namespace, so through real Ansible started with
`ip netns exec`; its functions are tested in-process in tests/unit/test_fabric_link.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from helpers.fabric import VETH_SPEED, fake_sysfs

# The two halves of the port, each in a subnet of its own; namespace A holds .1, namespace B .2.
SUBNETS = {"fab0": "10.78.0", "fab1": "10.79.0"}
BOTH_HALVES = "interfaces=fab0,fab1"
PEERS_OF_A = "peer_addresses=10.78.0.2,10.79.0.2"
JSON_OUTPUT = {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cable():
    """Namespaces A and B joined by two veth pairs at MTU 9000: fab0 (10.78.0.1 and .2) and fab1 (10.79.0.1 and .2),
    removed afterwards. Tests that change a link put it back."""
    if shutil.which("ip") is None or shutil.which("ping") is None:
        pytest.fail("iproute2 and iputils-ping are needed (tests/run-all.sh installs them)")
    tag = uuid.uuid4().hex[:6]
    a, b = f"sfa-{tag}", f"sfb-{tag}"
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    try:
        for half, subnet in SUBNETS.items():
            sh("ip", "link", "add", half, "netns", a, "type", "veth", "peer", "name", half, "netns", b)
            for namespace, host in ((a, 1), (b, 2)):
                sh("ip", "-n", namespace, "link", "set", half, "mtu", "9000", "up")
                sh("ip", "-n", namespace, "address", "add", f"{subnet}.{host}/24", "dev", half)
        yield a, b
    finally:
        for namespace in (a, b):
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)


def run_in(namespace: str, args: str, check: bool = False) -> dict:
    """fabric_link_info through real Ansible inside a namespace (`ip netns exec` also remounts /sys for it)."""
    argv = ["ip", "netns", "exec", namespace, ansible_tool("ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", "fabric_link_info", "-a", args]
    if check:
        argv.append("--check")
    env = {**JSON_OUTPUT, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_both_halves_fit_and_the_partner_answers_on_each(cable):
    a, _ = cable
    result = run_in(a, f"{BOTH_HALVES} speed_mbps={VETH_SPEED} {PEERS_OF_A}", check=True)
    assert result["problems"] == [] and result["peer_answers"] == [True, True]
    assert [link["interface"] for link in result["links"]] == ["fab0", "fab1"]
    assert [link["addresses"] for link in result["links"]] == [["10.78.0.1"], ["10.79.0.1"]]
    assert all(link["mtu"] == 9000 and link["speed_mbps"] == VETH_SPEED for link in result["links"])
    assert result["rdma_devices"] == []  # veth: no RDMA, as in a container
    assert not result.get("warnings")
    assert result["changed"] is False


def test_a_second_half_that_is_down_is_named(cable):
    a, _ = cable
    sh("ip", "-n", a, "link", "set", "fab1", "down")
    try:
        result = run_in(a, f"{BOTH_HALVES} speed_mbps={VETH_SPEED} {PEERS_OF_A}")
    finally:
        sh("ip", "-n", a, "link", "set", "fab1", "up")
    assert result["problems"] == [
        "fab1 is down (carrier off): check the cable",
        "fab1 reports no speed, expected 10000 Mb/s: reseat the QSFP cable or use a rated one",
    ]
    assert result["peer_answers"] is None  # no ping over a link that is already wrong


def test_a_second_half_without_an_address_is_named(cable):
    a, _ = cable
    sh("ip", "-n", a, "address", "del", "10.79.0.1/24", "dev", "fab1")
    try:
        result = run_in(a, f"{BOTH_HALVES} speed_mbps={VETH_SPEED} {PEERS_OF_A}")
    finally:
        sh("ip", "-n", a, "address", "add", "10.79.0.1/24", "dev", "fab1")
    assert result["links"][1]["addresses"] == []
    assert result["problems"] == [
        "fab1 has no IPv4 address: give it one on every Spark of the group, in a subnet of its own (NVIDIA's "
        "connect-two-sparks netplan, step 3)"
    ]


def test_mtu_1500_is_a_warning_and_the_ping_uses_the_real_mtu(cable):
    # NVIDIA's netplan sets no MTU: 1500 on both ends of a half works, and full 1500-byte packets must pass.
    a, b = cable
    for namespace in (a, b):
        sh("ip", "-n", namespace, "link", "set", "fab1", "mtu", "1500")
    try:
        result = run_in(a, f"{BOTH_HALVES} speed_mbps={VETH_SPEED} {PEERS_OF_A}")
    finally:
        for namespace in (a, b):
            sh("ip", "-n", namespace, "link", "set", "fab1", "mtu", "9000")
    assert result["problems"] == [] and result["peer_answers"] == [True, True]
    assert result["links"][1]["mtu"] == 1500
    (warning,) = result["warnings"]
    assert warning.startswith("fab1 has MTU 1500, below the recommended 9000 (spark_fabric_mtu): the group works")
    assert "Add `mtu: 9000` to both halves of the port in the netplan file on every Spark" in warning


def test_a_partner_behind_a_smaller_mtu_is_named(cable):
    a, b = cable
    sh("ip", "-n", b, "link", "set", "fab0", "mtu", "1500")
    try:
        result = run_in(a, f"{BOTH_HALVES} speed_mbps={VETH_SPEED} {PEERS_OF_A} ping_count=1")
    finally:
        sh("ip", "-n", b, "link", "set", "fab0", "mtu", "9000")
    assert result["peer_answers"] == [False, True]
    (problem,) = result["problems"]
    assert "the partner 10.78.0.2 does not answer on fab0 with 9000-byte packets that may not be fragmented" in problem


def test_the_wrong_speed_or_interface_is_named(cable):
    a, _ = cable
    result = run_in(a, f"{BOTH_HALVES} {PEERS_OF_A}")
    assert result["problems"] == [
        f"{half} reports 10000 Mb/s, expected 200000 Mb/s: reseat the QSFP cable or use a rated one"
        for half in ("fab0", "fab1")
    ]
    assert result["peer_answers"] is None
    missing = run_in(a, "interfaces=fab0,enP2p1s0f1np1 speed_mbps=10000")
    assert missing["problems"] == [
        "there is no network interface enP2p1s0f1np1 (ibdev2netdev lists the ConnectX-7 ports)"
    ]


def test_peer_addresses_must_pair_with_the_halves(cable):
    a, _ = cable
    result = run_in(a, f"{BOTH_HALVES} peer_addresses=10.78.0.2")
    assert result["failed"] is True
    assert "peer_addresses must give the partner's address on each of ['fab0', 'fab1']" in result["msg"]


@pytest.fixture(scope="module")
def switch():
    """Namespaces A, B and C, each with fab0 and fab1 (MTU 9000) plugged into bridges br0 and br1 of a fourth, the
    switch: fab0 in 10.88.0.0/24, fab1 in 10.89.0.0/24, host N at .N. Removed afterwards."""
    tag = uuid.uuid4().hex[:6]
    hub, members = f"sfs-{tag}", [f"sf{name}-{tag}" for name in "abc"]
    for namespace in (hub, *members):
        sh("ip", "netns", "add", namespace)
    try:
        for bridge in ("br0", "br1"):
            sh("ip", "-n", hub, "link", "add", bridge, "mtu", "9000", "type", "bridge")
            sh("ip", "-n", hub, "link", "set", bridge, "up")
        for number, namespace in enumerate(members, start=1):
            for index, (half, subnet) in enumerate((("fab0", "10.88.0"), ("fab1", "10.89.0"))):
                port = f"p{number}{index}"
                sh("ip", "link", "add", half, "netns", namespace, "type", "veth", "peer", "name", port, "netns", hub)
                sh("ip", "-n", hub, "link", "set", port, "mtu", "9000", "master", f"br{index}", "up")
                sh("ip", "-n", namespace, "link", "set", half, "mtu", "9000", "up")
                sh("ip", "-n", namespace, "address", "add", f"{subnet}.{number}/24", "dev", half)
        yield tuple(members)
    finally:
        for namespace in (*members, hub):
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)


# The role on every "Spark" at once: each host's modules run inside its namespace, through an interpreter wrapper.


def run_pair(tmp_path: Path, cable, rdma: bool = False, check: bool = False) -> tuple[int, dict]:
    """The spark_fabric role on hosts sa, sb (and sc, ...: group pair_t, one per namespace of CABLE, the head first)
    through ansible-playbook, then spark_fabric_node shown; the play's exit status and its report."""
    hosts = {}
    for host, namespace in zip(("sa", "sb", "sc", "sd")[: len(cable)], cable, strict=True):
        wrapper = tmp_path / f"python-{host}"
        inner = f'{sys.executable} "$@"'
        if rdma:  # ConnectX-7 stand-ins: the same links, seen through a /sys/class/net that has RDMA devices
            sysfs = fake_sysfs(tmp_path / f"sysfs-{host}", {"fab0": "rocep1s0f1", "fab1": "roceP2p1s0f1"})
            mount = f'mount --bind {sysfs} /sys/class/net && exec {sys.executable} "$@"'
            inner = f"unshare --mount --propagation private /bin/sh -c '{mount}' sh \"$@\""
        wrapper.write_text(f"#!/bin/sh\nexec ip netns exec {namespace} {inner}\n", encoding="ascii")
        wrapper.chmod(0o755)
        hosts[host] = {"ansible_python_interpreter": str(wrapper)}
    pair = {
        "ansible_connection": "local",
        "spark_fabric_pair_group": "pair_t",
        "spark_fabric_interfaces": ["fab0", "fab1"],
        "spark_fabric_speed_mbps": VETH_SPEED,
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"pair_t": {"hosts": hosts, "vars": pair}}}}))
    playbook = tmp_path / "pair.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Pair",
                    "hosts": "pair_t",
                    "gather_facts": False,
                    "roles": [{"role": "spark_fabric"}],
                    "tasks": [{"name": "Show the pair", "ansible.builtin.debug": {"var": "spark_fabric_node"}}],
                }
            ]
        )
    )
    argv = [ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook), *(["--check"] if check else [])]
    env = {**JSON_OUTPUT, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads(done.stdout)


def task_results(report: dict, name: str) -> dict:
    tasks = report["plays"][0]["tasks"]
    found = [task["hosts"] for task in tasks if task["task"]["name"] in (name, f"spark_fabric : {name}")]
    assert len(found) == 1, f"{name!r} ran {len(found)} times; the play ran {[task['task']['name'] for task in tasks]}"
    return found[0]


def test_the_role_checks_both_halves_and_pins_sockets_to_the_first(tmp_path, cable):
    # As in the molecule containers: no RDMA devices, so NCCL gets no NCCL_IB_HCA. Check mode changes nothing.
    rc, report = run_pair(tmp_path, cable, check=True)
    assert rc == 0, json.dumps(report)[-3000:]
    nodes = {host: result["spark_fabric_node"] for host, result in task_results(report, "Show the pair").items()}
    for host, number in (("sa", "1"), ("sb", "2")):
        node = nodes[host]
        assert node["interfaces"] == ["fab0", "fab1"] and node["interface"] == "fab0"
        assert node["addresses"] == [f"10.78.0.{number}", f"10.79.0.{number}"]
        assert node["rdma"] is False and node["hcas"] == []
        env = node["env"]
        assert env["VLLM_HOST_IP"] == f"10.78.0.{number}" and env["MASTER_ADDR"] == "10.78.0.1"
        for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            assert env[variable] == "fab0", variable
        assert "NCCL_IB_HCA" not in env
    assert nodes["sa"]["rank"] == 0 and nodes["sb"]["rank"] == 1
    pings = task_results(report, "Link | Ping every other Spark of the group through each half with full-MTU packets")
    for host, other in (("sa", "sb"), ("sb", "sa")):
        assert [(ping["item"], ping["peer_answers"]) for ping in pings[host]["results"]] == [(other, [True, True])]
    assert all(stats["changed"] == 0 for stats in report["stats"].values())


def test_nccl_gets_the_rdma_devices_of_both_halves(tmp_path, cable):
    rc, report = run_pair(tmp_path, cable, rdma=True)
    assert rc == 0, json.dumps(report)[-3000:]
    for result in task_results(report, "Show the pair").values():
        node = result["spark_fabric_node"]
        assert node["rdma"] is True and node["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
        assert node["env"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"


def test_the_ends_of_a_half_with_different_mtus_are_refused(tmp_path, cable):
    _, b = cable
    sh("ip", "-n", b, "link", "set", "fab1", "mtu", "1500")
    try:
        rc, report = run_pair(tmp_path, cable)
    finally:
        sh("ip", "-n", b, "link", "set", "fab1", "mtu", "9000")
    assert rc != 0
    refusals = task_results(report, "Link | Require the same MTU on every end of each half")
    said = json.dumps(refusals)
    assert "sa (group pair_t): fab1 has MTU 9000 here but 1500 on sb's fab1: give every end of each half" in said
    assert "sb (group pair_t): fab1 has MTU 1500 here but 9000 on sa's fab1" in said


def test_a_group_of_three_through_a_switch_pings_every_other_spark_on_each_half(tmp_path, switch):
    rc, report = run_pair(tmp_path, switch, check=True)
    assert rc == 0, json.dumps(report)[-3000:]
    nodes = {host: result["spark_fabric_node"] for host, result in task_results(report, "Show the pair").items()}
    names = ["sa", "sb", "sc"]
    for rank, host in enumerate(names):
        node = nodes[host]
        assert (node["rank"], node["size"], node["head"]) == (rank, 3, "sa")
        assert node["peers"] == [other for other in names if other != host]
        assert node["addresses"] == [f"10.88.0.{rank + 1}", f"10.89.0.{rank + 1}"]
        assert node["env"]["MASTER_ADDR"] == "10.88.0.1" and node["head_address"] == "10.88.0.1"
    pings = task_results(report, "Link | Ping every other Spark of the group through each half with full-MTU packets")
    for host in names:
        answered = {ping["item"]: ping["peer_answers"] for ping in pings[host]["results"]}
        assert answered == {other: [True, True] for other in names if other != host}


def test_a_spark_of_the_group_that_the_others_cannot_reach_on_a_half_is_named(tmp_path, switch):
    # sc's second half is unplugged from the switch: sa and sb cannot reach it there, nor it them.
    hub = switch[0].replace("sfa-", "sfs-")
    sh("ip", "-n", hub, "link", "set", "p31", "nomaster")
    try:
        rc, report = run_pair(tmp_path, switch)
    finally:
        sh("ip", "-n", hub, "link", "set", "p31", "master", "br1")
    assert rc != 0
    said = json.dumps(task_results(report, "Link | Require an answer from every other Spark on each half"))
    assert "sa (group pair_t): the partner 10.89.0.3 does not answer on fab1" in said
    assert "A group of more than two Sparks is linked through a switch, each half in one subnet shared by all" in said
