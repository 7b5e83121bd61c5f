"""Read a ConnectX-7 fabric link from sysfs and iproute2, and judge it (plain functions, no Ansible).

What a pair of Sparks needs from its link (NVIDIA dgx-spark-playbooks, connect-two-sparks): the port up, at
200000 Mb/s, jumbo frames (MTU 9000) on both ends, an IPv4 address, and the RDMA devices NCCL reads behind it.
"""

from __future__ import annotations

import json
from pathlib import Path


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


def ipv4_addresses(ip_json: str) -> list[str]:
    """The IPv4 addresses in `ip -j -4 address show dev IF` output, in the order ip lists them."""
    addresses = []
    for link in json.loads(ip_json or "[]"):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and info.get("local"):
                addresses.append(info["local"])
    return addresses


def link_problems(link: dict, speed_mbps: int, mtu: int, addresses: list[str]) -> list[str]:
    """What is wrong with the link for a two-Spark pair; empty when it is fit."""
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
    if link["mtu"] != mtu:
        problems.append(f"{name} has MTU {link['mtu']}, expected {mtu}: set it (netplan mtu) on both Sparks")
    if not addresses:
        problems.append(f"{name} has no IPv4 address: give both Sparks an address on the fabric")
    return problems
