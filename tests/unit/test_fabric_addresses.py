"""module_utils/fabric_addresses.py: the fabric's address plan when sparkfleet configures it through netplan
(spark_fabric_netplan), and the netplan document. Applied in a simulated pair by
tests/integration/test_fabric_netplan.py."""

from __future__ import annotations

import pytest
from fabric_addresses import netplan, other_network_problems, plan

HALVES = ["enp1s0f1np1", "enP2p1s0f1np1"]
SUBNETS = ["192.168.100.0/24", "192.168.101.0/24"]


def group(*hosts: str, **spark_of: dict) -> dict:
    """A group of HOSTS (head first), each with both halves in SUBNETS, changed by SPARK_OF[host]."""
    return {
        host: {"interfaces": HALVES, "subnets": SUBNETS, "addresses": [], "rank": rank, **spark_of.get(host, {})}
        for rank, host in enumerate(hosts)
    }


def test_each_spark_gets_its_rank_plus_one_on_each_half():
    addresses, problems = plan(group("s1", "s2", "s3"))
    assert problems == []
    assert addresses == {
        "s1": ["192.168.100.1/24", "192.168.101.1/24"],
        "s2": ["192.168.100.2/24", "192.168.101.2/24"],
        "s3": ["192.168.100.3/24", "192.168.101.3/24"],
    }


def test_a_spark_may_give_its_own_addresses_as_nvidias_netplan_does():
    addresses, problems = plan(
        group(
            "s1",
            "s2",
            s1={"addresses": ["192.168.100.10", "192.168.101.10"]},
            s2={"addresses": ["192.168.100.11", "192.168.101.11"]},
        )
    )
    assert problems == []
    assert addresses["s1"] == ["192.168.100.10/24", "192.168.101.10/24"]
    assert addresses["s2"] == ["192.168.100.11/24", "192.168.101.11/24"]


@pytest.mark.parametrize(
    ("spark_of", "message"),
    [
        (
            {"s1": {"subnets": ["192.168.100.0/24"]}},
            "s1: spark_fabric_subnets must give one IPv4 subnet per interface of spark_fabric_interfaces, in the "
            "same order",
        ),
        (
            {"s1": {"subnets": ["192.168.100.1/24", "192.168.101.0/24"]}},
            "s1: spark_fabric_subnets[0] is '192.168.100.1/24', which is no IPv4 subnet in CIDR form with its host "
            "bits zero",
        ),
        ({"s1": {"subnets": ["fd00::/64", "192.168.101.0/24"]}}, "s1: spark_fabric_subnets[0] is 'fd00::/64'"),
        ({"s1": {"subnets": ["10.0.0.0/31", "192.168.101.0/24"]}}, "a prefix from /8 to /30"),
        (
            {"s1": {"subnets": ["10.0.0.0/16", "10.0.5.0/24"]}},
            "s1: spark_fabric_subnets gives 10.0.0.0/16 and 10.0.5.0/24, which overlap: each half of the port "
            "needs a subnet of its own",
        ),
        (
            {"s2": {"subnets": ["192.168.100.0/24", "192.168.102.0/24"]}},
            "the Sparks of one group must give the same spark_fabric_subnets, each half one subnet shared by all",
        ),
        (
            {"s2": {"addresses": ["192.168.100.1", "192.168.101.7"]}},
            "192.168.100.1 is planned for s1 and s2: every Spark of the group needs addresses of its own",
        ),
        (
            {"s2": {"addresses": ["192.168.100.255", "192.168.101.7"]}},
            "s2: 192.168.100.255 on enp1s0f1np1 is not a host address of 192.168.100.0/24",
        ),
        (
            {"s2": {"addresses": ["192.168.101.7", "192.168.100.7"]}},
            "s2: 192.168.101.7 on enp1s0f1np1 is not a host address of 192.168.100.0/24",
        ),
        ({"s2": {"addresses": ["192.168.100.7"]}}, "s2: spark_fabric_addresses must be empty or give one address"),
        ({"s2": {"addresses": ["spark", "192.168.101.7"]}}, "s2: spark_fabric_addresses[0] is 'spark'"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_spark_and_the_fix(spark_of, message):
    addresses, problems = plan(group("s1", "s2", **spark_of))
    assert addresses == {}
    assert any(message in problem for problem in problems), problems


def test_a_subnet_too_narrow_for_the_group_says_so():
    narrow = ["10.0.0.0/30", "10.0.1.0/30"]
    sparks = {f"s{rank}": {"subnets": narrow} for rank in range(3)}
    addresses, problems = plan(group("s0", "s1", "s2", **sparks))
    assert addresses == {}
    assert problems == [
        f"s2: {subnet} has no host number 3 for rank 2: give a wider subnet in spark_fabric_subnets, or this "
        "Spark's own spark_fabric_addresses"
        for subnet in narrow
    ]
    assert plan(group("s0", "s1", s0={"subnets": narrow}, s1={"subnets": narrow}))[1] == []  # a /30 holds a pair


def test_a_fabric_subnet_that_another_network_uses_is_named():
    others = {"enP7s7": ["192.168.1.102/24"], "docker0": ["172.17.0.1/16"]}
    assert other_network_problems("s1", SUBNETS, others) == []
    assert other_network_problems("s1", ["192.168.0.0/16", "10.9.0.0/24"], others) == [
        "s1: spark_fabric_subnets gives 192.168.0.0/16, which overlaps enP7s7's 192.168.1.102/24: the fabric needs "
        "subnets that no other network of the Spark uses"
    ]


def test_the_netplan_document_is_nvidias_with_the_mtu():
    assert netplan(HALVES, ["192.168.100.1/24", "192.168.101.1/24"], 9000) == {
        "network": {
            "version": 2,
            "ethernets": {
                "enp1s0f1np1": {"dhcp4": False, "addresses": ["192.168.100.1/24"], "mtu": 9000},
                "enP2p1s0f1np1": {"dhcp4": False, "addresses": ["192.168.101.1/24"], "mtu": 9000},
            },
        }
    }
