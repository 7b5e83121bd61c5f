#!/usr/bin/python
"""Ansible module fabric_link_info: both halves of the ConnectX-7 link of a two-Spark pair, read and judged, and the
partner pinged through each."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_link_info
short_description: Check both halves of the ConnectX-7 link two Sparks share, and that the partner answers on each
description:
  - A Spark's cabled ConnectX-7 port shows as two halves, each its own network interface and RDMA device (e.g.
    C(enp1s0f1np1)/C(rocep1s0f1) and C(enP2p1s0f1np1)/C(roceP2p1s0f1)); a pair needs both for NCCL's full
    bandwidth.
  - Reads each of O(interfaces) from sysfs (state, carrier, speed, MTU, the RDMA devices behind it) and its IPv4
    addresses from C(ip -j -4 address).
  - Reports each way a half falls short of what a two-Spark pair needs (up, at O(speed_mbps), an IPv4 address) in
    C(problems), naming the interface and what to do.
  - An MTU below O(mtu) is no problem (NVIDIA's netplan sets none, so 1500) but a warning that says how to set jumbo
    frames; so are two halves with addresses in one subnet.
  - With O(peer_addresses), pings the partner through each half, at that half's address on the partner, with
    packets of the half's own full MTU that may not be fragmented (C(ping -M do)), so an MTU mismatch anywhere on
    the path shows up here rather than as a hung NCCL collective.
  - Read-only; never reports a change, never fails for a problem (the caller decides).
version_added: "0.1.0"
author: sparkfleet
options:
  interfaces:
    description:
      - Network interfaces of the halves of the cabled ConnectX-7 port, e.g. C([enp1s0f1np1, enP2p1s0f1np1])
        (C(ibdev2netdev) lists them).
    type: list
    elements: str
    required: true
  speed_mbps:
    description: Speed each half must report, in Mb/s.
    type: int
    default: 200000
  mtu:
    description: Recommended MTU; a half below it gets a warning, not a problem.
    type: int
    default: 9000
  peer_addresses:
    description:
      - The partner's address on each of O(interfaces), in the same order; empty skips the ping.
    type: list
    elements: str
    default: []
  ping_count:
    description: Echo requests sent to the partner through each half.
    type: int
    default: 3
  netplan_addresses:
    description:
      - The address each of O(interfaces) is to have (spark_fabric_netplan configures them, with the MTU O(mtu)), in
        the same order. Until every half has its address and that MTU, only each interface's existence is judged
        (C(configured) false, no warnings, no ping); then everything is, as without it.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check both halves of the fabric link and the partner on each
  fabric_link_info:
    interfaces: [enp1s0f1np1, enP2p1s0f1np1]
    peer_addresses: [192.168.100.11, 192.168.200.11]
  register: link
"""

RETURN = r"""
links:
  description: What sysfs and C(ip) say about each of O(interfaces), in the same order.
  returned: always
  type: list
  elements: dict
  sample:
    - {exists: true, interface: enp1s0f1np1, operstate: up, carrier: true, speed_mbps: 200000, mtu: 9000,
       rdma_devices: [rocep1s0f1], addresses: [192.168.100.10]}
    - {exists: true, interface: enP2p1s0f1np1, operstate: up, carrier: true, speed_mbps: 200000, mtu: 9000,
       rdma_devices: [roceP2p1s0f1], addresses: [192.168.200.10]}
rdma_devices:
  description: The RDMA devices behind all of O(interfaces), in their order (what C(NCCL_IB_HCA) needs).
  returned: always
  type: list
  elements: str
  sample: [rocep1s0f1, roceP2p1s0f1]
peer_answers:
  description:
    - Per interface, whether the partner answered full-MTU unfragmented pings through it; null when no peer was
      given or a half has a problem already.
  returned: always
  type: list
  elements: bool
configured:
  description:
    - False while O(netplan_addresses) are not all in place with the MTU O(mtu) (only a missing interface is judged
      then); true otherwise.
  returned: always
  type: bool
other_prefixes:
  description:
    - The IPv4 addresses, with their prefix length, of every other interface of the host but the loopback, by
      interface (what the fabric's subnets must not overlap).
  returned: always
  type: dict
  sample: {enP7s7: [192.168.1.102/24], docker0: [172.17.0.1/16]}
problems:
  description: One message per shortfall, naming the interface and the fix; empty when both halves are fit.
  returned: always
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fabric_link import (
    ipv4_prefixes,
    ipv4_prefixes_by_interface,
    link_problems,
    mtu_advice,
    netplan_in_place,
    ping_payload,
    read_link,
    shared_subnet_advice,
)

SYS_CLASS_NET = Path("/sys/class/net")


def read_half(module: AnsibleModule, interface: str) -> dict:
    """One half from sysfs, with its IPv4 addresses and their prefixes (the prefixes only for the subnet check)."""
    link = read_link(SYS_CLASS_NET, interface)
    prefixes: list[str] = []
    if link["exists"]:
        rc, out, err = module.run_command(["ip", "-j", "-4", "address", "show", "dev", interface])
        if rc != 0:
            module.fail_json(msg=f"ip -j -4 address show dev {interface} failed: {err.strip()}")
        prefixes = ipv4_prefixes(out)
    return {**link, "addresses": [prefix.split("/", 1)[0] for prefix in prefixes], "prefixes": prefixes}


def other_prefixes(module: AnsibleModule, interfaces: list[str]) -> dict[str, list[str]]:
    """The IPv4 prefixes of the host's other interfaces, the loopback left out."""
    rc, out, err = module.run_command(["ip", "-j", "-4", "address", "show"])
    if rc != 0:
        module.fail_json(msg=f"ip -j -4 address show failed: {err.strip()}")
    return {
        name: prefixes
        for name, prefixes in ipv4_prefixes_by_interface(out).items()
        if name not in interfaces and name != "lo" and prefixes
    }


def ping_problem(module: AnsibleModule, link: dict, peer_address: str) -> str | None:
    """Ping the partner through one half with packets of that half's whole MTU; a message when it does not answer."""
    name, mtu = link["interface"], link["mtu"] or 1500  # sysfs always has an MTU; 1500 is Linux's default
    argv = ["ping", "-c", str(module.params["ping_count"]), "-W", "2", "-I", name, "-M", "do"]
    rc, out, err = module.run_command([*argv, "-s", str(ping_payload(mtu)), peer_address])
    if rc == 0:
        return None
    last = (err or out).strip().splitlines()[-1:] or ["no answer"]
    return (
        f"the partner {peer_address} does not answer on {name} with {mtu}-byte packets that may not be fragmented "
        f"({last[0]}): check the cable, the partner's address on this half and that both ends of {name}'s half "
        "have the same MTU"
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interfaces": {"type": "list", "elements": "str", "required": True},
            "speed_mbps": {"type": "int", "default": 200000},
            "mtu": {"type": "int", "default": 9000},
            "peer_addresses": {"type": "list", "elements": "str", "default": []},
            "ping_count": {"type": "int", "default": 3},
            "netplan_addresses": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    interfaces, peers = params["interfaces"], params["peer_addresses"]
    if not interfaces or len(set(interfaces)) != len(interfaces):
        module.fail_json(msg=f"interfaces must name each half of the port once (got {interfaces})")
    if peers and len(peers) != len(interfaces):
        module.fail_json(
            msg=f"peer_addresses must give the partner's address on each of {interfaces}, in that order (got {peers})"
        )

    links = [read_half(module, interface) for interface in interfaces]
    configured = netplan_in_place(links, params["netplan_addresses"], params["mtu"])
    if not configured:  # configured later: only a missing interface is a problem now
        problems = [problem for link in links if not link["exists"] for problem in link_problems(link, 0, [])]
    else:
        problems = [
            problem for link in links for problem in link_problems(link, params["speed_mbps"], link["addresses"])
        ]
        advice = [mtu_advice(link, params["mtu"]) for link in links]
        advice += shared_subnet_advice({link["interface"]: link["prefixes"] for link in links if link["exists"]})
        for message in filter(None, advice):
            module.warn(message)

    peer_answers = None
    if peers and configured and not problems:  # no ping over a link that is already wrong
        answers = [ping_problem(module, link, peer) for link, peer in zip(links, peers, strict=True)]
        peer_answers = [answer is None for answer in answers]
        problems += filter(None, answers)
    for link in links:
        del link["prefixes"]
    rdma_devices = [device for link in links for device in link.get("rdma_devices", [])]
    module.exit_json(
        changed=False,
        links=links,
        rdma_devices=rdma_devices,
        peer_answers=peer_answers,
        configured=configured,
        other_prefixes=other_prefixes(module, interfaces),
        problems=problems,
    )


if __name__ == "__main__":
    main()
