"""The fabric_link module and its functions: a real veth link between two network namespaces of this machine
stands in for the ConnectX-7 cable between two Sparks (the kernel reports 10000 Mb/s for veth)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, ansible_tool
from fabric_link_info import ipv4_addresses, link_problems, read_link

VETH_SPEED = 10000


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cable():
    """Namespaces A and B joined by a veth pair at MTU 9000, 10.78.0.1 and 10.78.0.2 (removed afterwards)."""
    if shutil.which("ip") is None or shutil.which("ping") is None:
        pytest.fail("iproute2 and iputils-ping are needed (tests/run-all.sh installs them)")
    tag = uuid.uuid4().hex[:6]
    a, b = f"sfa-{tag}", f"sfb-{tag}"
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    try:
        sh("ip", "link", "add", "fab0", "netns", a, "type", "veth", "peer", "name", "fab0", "netns", b)
        for namespace, address in ((a, "10.78.0.1/24"), (b, "10.78.0.2/24")):
            sh("ip", "-n", namespace, "link", "set", "fab0", "mtu", "9000", "up")
            sh("ip", "-n", namespace, "address", "add", address, "dev", "fab0")
        yield a, b
    finally:
        for namespace in (a, b):
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)


def run_in(namespace: str, args: str, check: bool = False) -> dict:
    """fabric_link through real Ansible inside a namespace (`ip netns exec` also remounts /sys for it)."""
    argv = ["ip", "netns", "exec", namespace, ansible_tool("ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", "fabric_link", "-a", args]
    if check:
        argv.append("--check")
    env = {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_a_fit_link_and_a_partner_that_answers_full_mtu_pings(cable):
    a, _ = cable
    result = run_in(a, f"interface=fab0 speed_mbps={VETH_SPEED} peer_address=10.78.0.2", check=True)
    assert result["problems"] == [] and result["peer_answers"] is True
    assert result["addresses"] == ["10.78.0.1"]
    assert result["link"]["mtu"] == 9000 and result["link"]["speed_mbps"] == VETH_SPEED
    assert result["changed"] is False


def test_a_partner_behind_a_smaller_mtu_is_named(cable):
    a, b = cable
    sh("ip", "-n", b, "link", "set", "fab0", "mtu", "1500")
    try:
        result = run_in(a, f"interface=fab0 speed_mbps={VETH_SPEED} peer_address=10.78.0.2 ping_count=1")
    finally:
        sh("ip", "-n", b, "link", "set", "fab0", "mtu", "9000")
    assert result["peer_answers"] is False
    assert "10.78.0.2 does not answer on fab0 with 9000-byte packets" in result["problems"][0]


def test_the_wrong_speed_mtu_or_interface_is_named(cable):
    a, _ = cable
    result = run_in(a, "interface=fab0 mtu=1500 peer_address=10.78.0.2")
    assert result["problems"] == [
        "fab0 reports 10000 Mb/s, expected 200000 Mb/s: reseat the QSFP cable or use a rated one",
        "fab0 has MTU 9000, expected 1500: set it (netplan mtu) on both Sparks",
    ]
    assert result["peer_answers"] is None  # no ping over a link that is already wrong
    missing = run_in(a, "interface=enp1s0f1np1")
    assert missing["problems"] == [
        "there is no network interface enp1s0f1np1 (ibdev2netdev lists the ConnectX-7 ports)"
    ]


def test_a_link_that_is_down_has_no_speed(cable):
    a, _ = cable
    sh("ip", "-n", a, "link", "set", "fab0", "down")
    try:
        result = run_in(a, f"interface=fab0 speed_mbps={VETH_SPEED}")
    finally:
        sh("ip", "-n", a, "link", "set", "fab0", "up")
    assert result["link"]["operstate"] == "down"
    assert result["problems"][0].startswith("fab0 is down (carrier off): check the cable")
    assert "fab0 reports no speed, expected 10000 Mb/s" in result["problems"][1]


def test_read_link_finds_the_rdma_devices_behind_a_port(tmp_path: Path):
    port = tmp_path / "enp1s0f1np1"
    (port / "device" / "infiniband" / "rocep1s0f1").mkdir(parents=True)
    for name, value in {"operstate": "up", "carrier": "1", "speed": "200000", "mtu": "9000"}.items():
        (port / name).write_text(value + "\n")
    link = read_link(tmp_path, "enp1s0f1np1")
    assert link["rdma_devices"] == ["rocep1s0f1"]
    assert link_problems(link, 200000, 9000, ["192.168.100.10"]) == []
    assert link_problems(link, 200000, 9000, [])[0].startswith("enp1s0f1np1 has no IPv4 address")


def test_ipv4_addresses_reads_ip_json():
    out = '[{"ifname":"fab0","addr_info":[{"family":"inet","local":"10.78.0.1","prefixlen":24}]}]'
    assert ipv4_addresses(out) == ["10.78.0.1"]
    assert ipv4_addresses("[]") == []
