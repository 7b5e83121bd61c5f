"""The address plan of a group's ConnectX-7 fabric, when sparkfleet configures it through netplan
(spark_fabric_netplan): the one rule, as plain functions.

Each half of the port is one subnet shared by every Spark of the group (spark_fabric_subnets, in the order of
spark_fabric_interfaces): a pair by its cable, or more Sparks through a switch. NVIDIA's two-Spark netplan gives each
half a /24 of its own (192.168.100.10/24 and 192.168.101.10/24 on one Spark, .11 on the other: connect-two-sparks,
step 3); two halves in one subnet make the kernel answer for either address on either half, and RoCE traffic may
take the wrong one. A Spark's address on a half is its own spark_fabric_addresses entry, or else the subnet's host
number rank + 1 (the head .1, the next .2, ...). The plan is checked before any host changes (spark_fabric's
validate), and each Spark's other networks against it once its interfaces are read (link.yml): a fabric subnet that
overlaps the management network would take its routes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

# The narrowest subnet that holds a group of 8 Sparks with its network and broadcast addresses is a /28; a /30 holds
# a pair. Anything wider than a /8 is a typo.
WIDEST_PREFIX, NARROWEST_PREFIX = 8, 30


def _subnet(value: object) -> ipaddress.IPv4Network | None:
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        return None
    return network if isinstance(network, ipaddress.IPv4Network) else None


def subnet_problems(host: str, interfaces: list[str], subnets: list[object]) -> list[str]:
    """What is wrong with one Spark's spark_fabric_subnets on their own (one per half, real, apart)."""
    if len(subnets) != len(interfaces):
        return [
            f"{host}: spark_fabric_subnets must give one IPv4 subnet per interface of spark_fabric_interfaces, in the "
            f"same order (got {subnets} for {interfaces}), e.g. [192.168.100.0/24, 192.168.101.0/24]"
        ]
    found = []
    parsed = []
    for index, value in enumerate(subnets):
        network = _subnet(value)
        if network is None or not WIDEST_PREFIX <= network.prefixlen <= NARROWEST_PREFIX:
            found.append(
                f"{host}: spark_fabric_subnets[{index}] is {value!r}, which is no IPv4 subnet in CIDR form with its "
                f"host bits zero and a prefix from /{WIDEST_PREFIX} to /{NARROWEST_PREFIX} (e.g. 192.168.100.0/24)"
            )
        else:
            parsed.append(network)
    for index, first in enumerate(parsed):
        for second in parsed[index + 1 :]:
            if first.overlaps(second):
                found.append(
                    f"{host}: spark_fabric_subnets gives {first} and {second}, which overlap: each half of the port "
                    "needs a subnet of its own"
                )
    return found


def plan(group: Mapping[str, Mapping]) -> tuple[dict[str, list[str]], list[str]]:
    """Every Spark's address on each half, in CIDR form ({host: ["192.168.100.1/24", ...]}), and what is wrong with
    the group's plan. GROUP: host -> {interfaces, subnets, addresses (its own, or []), rank}."""
    problems: list[str] = []
    for host, spark in group.items():
        problems += subnet_problems(host, list(spark["interfaces"]), list(spark["subnets"]))
    if problems:
        return {}, problems
    shared = {tuple(str(_subnet(value)) for value in spark["subnets"]) for spark in group.values()}
    if len(shared) > 1:
        listed = "; ".join(f"{host}: {', '.join(map(str, spark['subnets']))}" for host, spark in group.items())
        return {}, [
            f"the Sparks of one group must give the same spark_fabric_subnets, each half one subnet shared by all "
            f"(got {listed}): set it in the group's group_vars"
        ]
    planned: dict[str, list[str]] = {}
    for host, spark in group.items():
        cidrs, found = _addresses(host, spark)
        planned[host], problems = cidrs, problems + found
    problems += _clashes(planned)
    return ({} if problems else planned), problems


def _addresses(host: str, spark: Mapping) -> tuple[list[str], list[str]]:
    subnets = [_subnet(value) for value in spark["subnets"]]
    own = list(spark.get("addresses") or [])
    if own and len(own) != len(subnets):
        return [], [
            f"{host}: spark_fabric_addresses must be empty or give one address per interface (got {own} for "
            f"{list(spark['interfaces'])})"
        ]
    cidrs, found = [], []
    for index, network in enumerate(subnets):
        if own:
            try:
                address = ipaddress.IPv4Address(str(own[index]))
            except ValueError:
                found.append(f"{host}: spark_fabric_addresses[{index}] is {own[index]!r}, which is no IPv4 address")
                continue
        else:
            number = int(spark["rank"]) + 1
            if number >= network.num_addresses - 1:
                found.append(
                    f"{host}: {network} has no host number {number} for rank {spark['rank']}: give a wider subnet in "
                    "spark_fabric_subnets, or this Spark's own spark_fabric_addresses"
                )
                continue
            address = network.network_address + number
        if address not in network or address in (network.network_address, network.broadcast_address):
            found.append(
                f"{host}: {address} on {spark['interfaces'][index]} is not a host address of {network}, the subnet "
                "spark_fabric_subnets gives that half: correct spark_fabric_addresses"
            )
            continue
        cidrs.append(f"{address}/{network.prefixlen}")
    return cidrs, found


def _clashes(planned: Mapping[str, list[str]]) -> list[str]:
    owners: dict[str, list[str]] = {}
    for host, cidrs in planned.items():
        for cidr in cidrs:
            owners.setdefault(cidr.split("/", 1)[0], []).append(host)
    return [
        f"{address} is planned for {' and '.join(hosts)}: every Spark of the group needs addresses of its own "
        "(spark_fabric_addresses)"
        for address, hosts in sorted(owners.items())
        if len(hosts) > 1
    ]


def other_network_problems(host: str, subnets: list[object], others: Mapping[str, list[str]]) -> list[str]:
    """The fabric subnets that overlap a network of the Spark's other interfaces (OTHERS: interface -> its IPv4
    addresses with prefix, as `ip -j -4 address` lists them)."""
    found = []
    for value in subnets:
        network = _subnet(value)
        for interface, prefixes in sorted(others.items()):
            for prefix in prefixes:
                theirs = ipaddress.ip_interface(prefix).network
                if network is not None and network.overlaps(theirs):
                    found.append(
                        f"{host}: spark_fabric_subnets gives {network}, which overlaps {interface}'s {prefix}: the "
                        "fabric needs subnets that no other network of the Spark uses"
                    )
    return found


def netplan(interfaces: list[str], cidrs: list[str], mtu: int) -> dict:
    """The netplan document that gives each half its address and MTU (NVIDIA's connect-two-sparks file, with the MTU
    the fabric check recommends)."""
    return {
        "network": {
            "version": 2,
            "ethernets": {
                interface: {"dhcp4": False, "addresses": [cidr], "mtu": int(mtu)}
                for interface, cidr in zip(interfaces, cidrs, strict=True)
            },
        }
    }
