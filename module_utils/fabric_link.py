"""Read the ConnectX-7 fabric link of a Spark from sysfs and iproute2, and judge it (plain functions, no Ansible).

What a pair of Sparks needs from its link (NVIDIA dgx-spark-playbooks, connect-two-sparks): the cabled port shows
as two halves, each its own network interface and RDMA device (e.g. enp1s0f1np1/rocep1s0f1 and
enP2p1s0f1np1/roceP2p1s0f1); each half up at 200000 Mb/s with an IPv4 address in its own subnet, and NCCL given
the RDMA devices of both (one half carries only about half the bandwidth). Jumbo frames (MTU 9000) are optional
tuning: NVIDIA's own netplan sets none (1500).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

# An IPv4 header (20 bytes) and an ICMP header (8) come on top of ping's payload.
ICMP_OVERHEAD = 28


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:  # EINVAL: a link that is down has no speed; ENOENT: no such attribute
        return None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_link(sys_class_net: Path, interface: str) -> dict:
    """State, speed (Mb/s; None when the kernel reports none), MTU and RDMA devices of one interface."""
    base = sys_class_net / interface
    if not base.is_dir():
        return {"exists": False, "interface": interface}
    speed = _int_or_none(_read(base / "speed"))
    rdma_dir = base / "device" / "infiniband"
    return {
        "exists": True,
        "interface": interface,
        "operstate": _read(base / "operstate") or "unknown",
        "carrier": _read(base / "carrier") == "1",
        # The kernel reports -1 (or nothing) when it does not know the speed, e.g. with the link down.
        "speed_mbps": speed if speed is not None and speed > 0 else None,
        "mtu": _int_or_none(_read(base / "mtu")),
        "rdma_devices": sorted(entry.name for entry in rdma_dir.iterdir()) if rdma_dir.is_dir() else [],
    }


def ipv4_prefixes(ip_json: str) -> list[str]:
    """The IPv4 addresses with their prefix length (10.78.0.1/24) in `ip -j -4 address show dev IF` output, in the
    order ip lists them."""
    prefixes = []
    for link in json.loads(ip_json or "[]"):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and info.get("local"):
                prefixes.append(f"{info['local']}/{info.get('prefixlen', 32)}")
    return prefixes


def ipv4_prefixes_by_interface(ip_json: str) -> dict[str, list[str]]:
    """The IPv4 addresses with their prefix length of each interface in `ip -j -4 address show` output."""
    return {
        str(link.get("ifname")): ipv4_prefixes(json.dumps([link]))
        for link in json.loads(ip_json or "[]")
        if link.get("ifname")
    }


def ipv4_addresses(ip_json: str) -> list[str]:
    """The IPv4 addresses in `ip -j -4 address show dev IF` output, in the order ip lists them."""
    return [prefix.split("/", 1)[0] for prefix in ipv4_prefixes(ip_json)]


def link_problems(link: dict, speed_mbps: int, addresses: list[str]) -> list[str]:
    """What is wrong with one half of the link for a two-Spark pair; empty when it is fit. The MTU is no problem:
    see mtu_advice."""
    name = link["interface"]
    if not link["exists"]:
        return [f"there is no network interface {name} (ibdev2netdev lists the ConnectX-7 ports)"]
    problems = []
    # A port that has carrier but no operstate support (veth, some drivers) reports "unknown".
    if link["operstate"] not in ("up", "unknown") or not link["carrier"]:
        carrier = "on" if link["carrier"] else "off"
        problems.append(f"{name} is {link['operstate']} (carrier {carrier}): check the cable")
    if link["speed_mbps"] != speed_mbps:
        found = f"{link['speed_mbps']} Mb/s" if link["speed_mbps"] else "no speed"
        problems.append(f"{name} reports {found}, expected {speed_mbps} Mb/s: reseat the QSFP cable or use a rated one")
    if not addresses:
        problems.append(
            f"{name} has no IPv4 address: give it one on every Spark of the group, in a subnet of its own (NVIDIA's "
            "connect-two-sparks netplan, step 3)"
        )
    return problems


def netplan_in_place(links: list[dict], netplan_addresses: list[str], mtu: int) -> bool:
    """Whether every half has the address netplan is to give it (same order) and the MTU; true when netplan is to
    give none (spark_fabric_netplan off)."""
    if not netplan_addresses:
        return True
    return len(netplan_addresses) == len(links) and all(
        link["exists"] and address in link["addresses"] and link["mtu"] == mtu
        for link, address in zip(links, netplan_addresses, strict=True)
    )


def mtu_advice(link: dict, recommended_mtu: int) -> str | None:
    """A warning when one half's MTU is below the recommended one (jumbo frames are tuning, not a requirement);
    None when it is not."""
    if not link["exists"] or link["mtu"] is None or link["mtu"] >= recommended_mtu:
        return None
    return (
        f"{link['interface']} has MTU {link['mtu']}, below the recommended {recommended_mtu} (spark_fabric_mtu): the "
        f"group works, but NCCL's traffic over the fabric is faster with jumbo frames. Add `mtu: {recommended_mtu}` "
        "to both halves of the port in the netplan file on every Spark and run `sudo netplan apply`, or set "
        f"spark_fabric_mtu: {link['mtu']} to keep this MTU without this warning"
    )


def shared_subnet_advice(prefixes_by_interface: dict[str, list[str]]) -> list[str]:
    """A warning for each two halves that have addresses in one subnet (each half needs its own, or the kernel
    answers for both on either and RoCE traffic may take the wrong half)."""
    advice = []
    names = list(prefixes_by_interface)
    for index, first in enumerate(names):
        for second in names[index + 1 :]:
            shared = {
                str(ipaddress.ip_interface(a).network)
                for a in prefixes_by_interface[first]
                for b in prefixes_by_interface[second]
                if ipaddress.ip_interface(a).network.overlaps(ipaddress.ip_interface(b).network)
            }
            if shared:
                advice.append(
                    f"{first} and {second} both have addresses in {', '.join(sorted(shared))}: give each half of "
                    "the port an address in a subnet of its own (NVIDIA's connect-two-sparks netplan, step 3)"
                )
    return advice


def ping_payload(mtu: int) -> int:
    """The ping payload (`ping -s`) that fills a packet of the interface's whole MTU."""
    return mtu - ICMP_OVERHEAD
