"""spark_fabric_netplan in a simulated pair: two simulated Sparks (systemd containers from the simspark image, which
carries netplan.io and udev as DGX OS does) cabled by two veth links, each half of the "port" with no address. The
spark_fabric role runs as preflight runs it (the plan checked, the link only required to exist while netplan has yet
to configure it), then its netplan entry point as site.yml's fabric network stage does: the netplan file written
(root, 0600) and applied with `netplan apply` (systemd-networkd renders it), the addresses and MTU in place, every
other Spark answering on each half. A second run changes nothing; check mode changes nothing; a plan that overlaps
another network of the Spark is refused before anything is written.

A real Spark's /sys is writable, a container's is not: each container's own sysfs is remounted read-write, which
`netplan apply` needs (udevadm trigger)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool

IMAGE = "sparkfleet-test/simspark:latest"
NETPLAN_FILE = "/etc/netplan/60-sparkfleet-fabric.yaml"
SUBNETS = ["10.91.0.0/24", "10.92.0.0/24"]
JSON_OUTPUT = {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
# systemd as PID 1, as the molecule scenarios run the image (molecule/default/molecule.yml).
SYSTEMD_CONTAINER = [
    "--cgroupns", "host", "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--tmpfs", "/run:exec", "--tmpfs", "/run/lock", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
]  # fmt: skip


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def in_spark(name: str, command: str) -> str:
    return sh("docker", "exec", name, "sh", "-c", command)


@pytest.fixture(scope="module")
def pair():
    """Two simulated Sparks, nf-a (the head) and nf-b, running systemd, joined by veth links fab0 and fab1 (MTU
    1500, down, no address), removed afterwards."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.fail("the Docker engine is needed (tests/run-all.sh installs and starts it)")
    tag = uuid.uuid4().hex[:6]
    names = [f"nf-a-{tag}", f"nf-b-{tag}"]
    try:
        for name in names:
            sh(
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--hostname",
                name,
                *SYSTEMD_CONTAINER,
                IMAGE,
                "/lib/systemd/systemd",
            )
        pids = [sh("docker", "inspect", "--format", "{{.State.Pid}}", name).strip() for name in names]
        for half in ("fab0", "fab1"):
            sh("ip", "link", "add", half, "netns", pids[0], "type", "veth", "peer", "name", half, "netns", pids[1])
        for name in names:
            in_spark(name, "mount -o remount,rw /sys")
            # Up once systemd answers (degraded is fine: units a container cannot run fail).
            subprocess.run(
                ["docker", "exec", name, "systemctl", "is-system-running", "--wait"], timeout=300, check=False
            )
        yield names
    finally:
        subprocess.run(["docker", "rm", "--force", *names], capture_output=True, check=False, timeout=120)


def run_role(tmp_path: Path, names: list[str], *extra: str, **overrides) -> tuple[int, dict]:
    """Preflight's spark_fabric, then its netplan entry point, on the pair (group pair_n), through ansible-playbook
    and the docker connection; the exit status and the JSON report."""
    variables = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "spark_fabric_pair_group": "pair_n",
        "spark_fabric_interfaces": ["fab0", "fab1"],
        "spark_fabric_speed_mbps": 10000,
        "spark_fabric_netplan": True,
        "spark_fabric_subnets": SUBNETS,
        **overrides,
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"pair_n": {"hosts": dict.fromkeys(names), "vars": variables}}}})
    )
    playbook = tmp_path / "netplan.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {"name": "Preflight", "hosts": "pair_n", "gather_facts": False, "roles": [{"role": "spark_fabric"}]},
                {
                    "name": "Fabric network",
                    "hosts": "pair_n",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Configure the fabric",
                            "ansible.builtin.include_role": {"name": "spark_fabric", "tasks_from": "netplan"},
                        },
                        {"name": "Show the pair", "ansible.builtin.debug": {"var": "spark_fabric_node"}},
                    ],
                },
            ]
        )
    )
    argv = [ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook), *extra]
    env = {**os.environ, **JSON_OUTPUT}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, json.loads(done.stdout)


PREFLIGHT, FABRIC_NETWORK = 0, 1  # the plays of run_role's playbook


def results(report: dict, name: str, play: int = FABRIC_NETWORK) -> dict:
    """Each host's result of the task NAME in the play PLAY (the role's name prefixed or not)."""
    found = {}
    for task in report["plays"][play]["tasks"]:
        if task["task"]["name"] in (name, f"spark_fabric : {name}"):
            found.update(task["hosts"])
    return found


def changed(report: dict) -> int:
    return sum(stats["changed"] for stats in report["stats"].values())


def test_netplan_gives_each_half_its_planned_address_and_mtu_then_the_link_is_checked(tmp_path, pair):
    rc, report = run_role(tmp_path, pair)
    assert rc == 0, json.dumps(report)[-4000:]
    # Preflight saw the halves without their addresses: it only required them to exist, and pinged nobody.
    reads = results(report, "Link | Read both halves of the fabric port", PREFLIGHT)
    assert [result["configured"] for result in reads.values()] == [False, False], reads
    assert results(
        report, "Link | Ping every other Spark of the group through each half with full-MTU packets", PREFLIGHT
    )[pair[0]]["results"][0]["skipped"]
    for rank, name in enumerate(pair, start=1):
        links = {link["ifname"]: link for link in json.loads(in_spark(name, "ip -j -4 address show"))}
        for half, subnet in (("fab0", "10.91.0"), ("fab1", "10.92.0")):
            assert [(info["local"], info["prefixlen"]) for info in links[half]["addr_info"]] == [
                (f"{subnet}.{rank}", 24)
            ]
        assert in_spark(name, "cat /sys/class/net/fab0/mtu /sys/class/net/fab1/mtu").split() == ["9000", "9000"]
        assert in_spark(name, f"stat -c '%a %U' {NETPLAN_FILE}").strip() == "600 root"
        written = yaml.safe_load(in_spark(name, f"cat {NETPLAN_FILE}"))
        assert written["network"]["ethernets"]["fab1"] == {
            "addresses": [f"10.92.0.{rank}/24"],
            "dhcp4": False,
            "mtu": 9000,
        }
    # After the apply, every other Spark answered on each half with full 9000-byte packets.
    pings = results(report, "Link | Ping every other Spark of the group through each half with full-MTU packets")
    assert {name: [ping["peer_answers"] for ping in result["results"]] for name, result in pings.items()} == {
        name: [[True, True]] for name in pair
    }
    nodes = results(report, "Show the pair")
    assert nodes[pair[1]]["spark_fabric_node"]["env"]["MASTER_ADDR"] == "10.91.0.1"
    assert nodes[pair[1]]["spark_fabric_node"]["addresses"] == ["10.91.0.2", "10.92.0.2"]

    # A second run: preflight finds the plan in place and checks the link in full; nothing changes, nothing applies.
    rc, again = run_role(tmp_path, pair)
    assert rc == 0, json.dumps(again)[-4000:]
    reads = results(again, "Link | Read both halves of the fabric port", PREFLIGHT)
    assert [result["configured"] for result in reads.values()] == [True, True], reads
    assert changed(again) == 0
    assert results(again, "Apply the fabric's netplan") == {}


def test_check_mode_changes_neither_the_file_nor_the_link(tmp_path, pair):
    before = {name: in_spark(name, f"cat {NETPLAN_FILE} 2>/dev/null; ip -br address show dev fab0") for name in pair}
    rc, report = run_role(tmp_path, pair, "--check", spark_fabric_subnets=["10.93.0.0/24", "10.94.0.0/24"])
    assert rc == 0, json.dumps(report)[-4000:]
    assert changed(report) == 2  # the file each Spark would write
    assert {
        name: in_spark(name, f"cat {NETPLAN_FILE} 2>/dev/null; ip -br address show dev fab0") for name in pair
    } == before


def test_a_subnet_another_network_of_the_spark_uses_is_refused_before_anything_is_written(tmp_path, pair):
    # eth0 is on Docker's bridge network: a fabric subnet inside that network clashes with it.
    (eth0,) = [link for link in json.loads(in_spark(pair[0], "ip -j -4 address show")) if link["ifname"] == "eth0"]
    info = eth0["addr_info"][0]
    network = ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
    clash = str(list(network.subnets(new_prefix=max(network.prefixlen, 24)))[-1])
    before = {name: in_spark(name, f"cat {NETPLAN_FILE} 2>/dev/null || true") for name in pair}
    rc, report = run_role(tmp_path, pair, spark_fabric_subnets=[clash, "10.92.0.0/24"])
    assert rc != 0
    said = json.dumps(
        results(report, "Link | Require fabric subnets that no other network of the Spark uses", PREFLIGHT)
    )
    assert f"spark_fabric_subnets gives {clash}, which overlaps eth0's {info['local']}/{info['prefixlen']}" in said
    assert {name: in_spark(name, f"cat {NETPLAN_FILE} 2>/dev/null || true") for name in pair} == before


def test_another_netplan_file_for_the_halves_is_refused_before_anything_is_written(tmp_path, pair):
    # As after NVIDIA's "Connect two Sparks" by hand: its own file gives the halves other addresses.
    head = pair[0]
    in_spark(
        head,
        "printf 'network:\\n  version: 2\\n  ethernets:\\n    fab0:\\n      addresses: [10.99.0.1/24]\\n' "
        "> /etc/netplan/40-cx7.yaml && chmod 600 /etc/netplan/40-cx7.yaml",
    )
    try:
        before = in_spark(head, f"cat {NETPLAN_FILE} 2>/dev/null || true")
        rc, report = run_role(tmp_path, pair, spark_fabric_subnets=["10.95.0.0/24", "10.96.0.0/24"])
        assert rc != 0
        said = json.dumps(results(report, "Link | Require no other netplan file for the fabric's halves", PREFLIGHT))
        assert "but /etc/netplan/40-cx7.yaml also names fab0 or fab1, and netplan would merge both" in said
        assert in_spark(head, f"cat {NETPLAN_FILE} 2>/dev/null || true") == before
    finally:
        in_spark(head, "rm -f /etc/netplan/40-cx7.yaml")
