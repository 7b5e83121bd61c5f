"""module_utils/fabric_link.py: reading a link from /sys/class/net and `ip -j`, and judging it. The module
itself, on real veth links between network namespaces, is tested in tests/integration/test_fabric_link_info.py."""

from __future__ import annotations

from pathlib import Path

from fabric_link import (
    ipv4_addresses,
    ipv4_prefixes,
    ipv4_prefixes_by_interface,
    link_problems,
    mtu_advice,
    netplan_in_place,
    ping_payload,
    read_link,
    shared_subnet_advice,
)
from helpers.fabric import fake_sysfs


def test_read_link_finds_the_rdma_devices_behind_each_half(tmp_path: Path):
    fake_sysfs(tmp_path, {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}, speed=200000, mtu=1500)
    first, second = (read_link(tmp_path, name) for name in ("enp1s0f1np1", "enP2p1s0f1np1"))
    assert first["rdma_devices"] == ["rocep1s0f1"] and second["rdma_devices"] == ["roceP2p1s0f1"]
    assert link_problems(first, 200000, ["192.168.100.10"]) == []  # MTU 1500 is no problem
    assert link_problems(second, 200000, [])[0].startswith("enP2p1s0f1np1 has no IPv4 address")
    assert mtu_advice(first, 9000).startswith("enp1s0f1np1 has MTU 1500, below the recommended 9000")
    assert mtu_advice(first, 1500) is None
    assert mtu_advice(read_link(tmp_path, "absent0"), 9000) is None


def test_ipv4_addresses_and_prefixes_read_ip_json():
    out = '[{"ifname":"fab0","addr_info":[{"family":"inet","local":"10.78.0.1","prefixlen":24}]}]'
    assert ipv4_addresses(out) == ["10.78.0.1"]
    assert ipv4_prefixes(out) == ["10.78.0.1/24"]
    assert ipv4_addresses("[]") == [] and ipv4_prefixes("") == []


def test_halves_in_one_subnet_are_warned_about():
    assert shared_subnet_advice({"fab0": ["10.78.0.1/24"], "fab1": ["10.79.0.1/24"]}) == []
    assert shared_subnet_advice({"fab0": ["10.78.0.1/24"], "fab1": ["10.78.0.7/24"]}) == [
        "fab0 and fab1 both have addresses in 10.78.0.0/24: give each half of the port an address in a subnet of "
        "its own (NVIDIA's connect-two-sparks netplan, step 3)"
    ]
    assert ping_payload(9000) == 8972 and ping_payload(1500) == 1472


def test_the_other_interfaces_prefixes_are_read_by_name():
    ip_json = (
        '[{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},'
        ' {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "192.168.1.102", "prefixlen": 24}]},'
        ' {"ifname": "fab0", "addr_info": []}]'
    )
    assert ipv4_prefixes_by_interface(ip_json) == {
        "lo": ["127.0.0.1/8"],
        "enP7s7": ["192.168.1.102/24"],
        "fab0": [],
    }


def test_netplan_is_in_place_only_with_every_planned_address_and_the_mtu():
    links = [
        {"exists": True, "interface": "fab0", "addresses": ["10.0.0.1"], "mtu": 9000},
        {"exists": True, "interface": "fab1", "addresses": ["10.0.1.1"], "mtu": 9000},
    ]
    assert netplan_in_place(links, [], 9000)  # no netplan: the owner's network, judged as it is
    assert netplan_in_place(links, ["10.0.0.1", "10.0.1.1"], 9000)
    assert not netplan_in_place(links, ["10.0.0.1", "10.0.1.2"], 9000)
    assert not netplan_in_place(links, ["10.0.0.1", "10.0.1.1"], 1500)
    assert not netplan_in_place([links[0], {"exists": False, "interface": "fab1"}], ["10.0.0.1", "10.0.1.1"], 9000)
