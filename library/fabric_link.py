#!/usr/bin/python
"""Ansible module fabric_link: the ConnectX-7 link of a two-Spark pair, read and judged, and its peer pinged."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_link
short_description: Check the ConnectX-7 link two Sparks share, and that the partner answers on it
description:
  - Reads O(interface) from sysfs (state, carrier, speed, MTU, the RDMA devices behind it) and its IPv4
    addresses from C(ip -j -4 address).
  - Reports each way it falls short of what a two-Spark pair needs (up, at O(speed_mbps), with MTU O(mtu), an
    IPv4 address) in C(problems), naming the interface and what to do.
  - With O(peer_address), pings the partner through O(interface) with packets of the full MTU that may not be
    fragmented (C(ping -M do)), so a jumbo-frame mismatch anywhere on the path shows up here rather than as a
    hung NCCL collective.
  - Read-only; never reports a change, never fails for a problem (the caller decides).
version_added: "0.1.0"
author: sparkfleet
options:
  interface:
    description: Network interface of the ConnectX-7 port, e.g. C(enp1s0f1np1).
    type: str
    required: true
  speed_mbps:
    description: Speed the link must report, in Mb/s.
    type: int
    default: 200000
  mtu:
    description: MTU the interface must have.
    type: int
    default: 9000
  peer_address:
    description: The partner's address on the fabric; empty skips the ping.
    type: str
    default: ""
  ping_count:
    description: Echo requests sent to the partner.
    type: int
    default: 3
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the fabric link and the partner on it
  fabric_link:
    interface: enp1s0f1np1
    peer_address: 192.168.100.11
  register: link
"""

RETURN = r"""
link:
  description: What sysfs says about the interface.
  returned: always
  type: dict
  sample: {exists: true, interface: enp1s0f1np1, operstate: up, carrier: true, speed_mbps: 200000, mtu: 9000,
           rdma_devices: [rocep1s0f1]}
addresses:
  description: IPv4 addresses of the interface.
  returned: always
  type: list
  elements: str
peer_answers:
  description: The partner answered full-MTU unfragmented pings; null when no peer was given or the link failed.
  returned: always
  type: bool
problems:
  description: One message per shortfall, naming the interface; empty when the link is fit.
  returned: always
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fabric_link_info import ipv4_addresses, link_problems, read_link

SYS_CLASS_NET = Path("/sys/class/net")
# An IPv4 header (20 bytes) and an ICMP header (8) come on top of ping's payload.
ICMP_OVERHEAD = 28


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interface": {"type": "str", "required": True},
            "speed_mbps": {"type": "int", "default": 200000},
            "mtu": {"type": "int", "default": 9000},
            "peer_address": {"type": "str", "default": ""},
            "ping_count": {"type": "int", "default": 3},
        },
        supports_check_mode=True,
    )
    params = module.params
    link = read_link(SYS_CLASS_NET, params["interface"])
    addresses = []
    if link["exists"]:
        rc, out, err = module.run_command(["ip", "-j", "-4", "address", "show", "dev", params["interface"]])
        if rc != 0:
            module.fail_json(msg=f"ip -j -4 address show dev {params['interface']} failed: {err.strip()}")
        addresses = ipv4_addresses(out)
    problems = link_problems(link, params["speed_mbps"], params["mtu"], addresses)

    peer_answers = None
    if params["peer_address"] and not problems:
        payload = str(params["mtu"] - ICMP_OVERHEAD)
        argv = ["ping", "-c", str(params["ping_count"]), "-W", "2", "-I", params["interface"], "-M", "do"]
        rc, out, err = module.run_command([*argv, "-s", payload, params["peer_address"]])
        peer_answers = rc == 0
        if not peer_answers:
            last = (err or out).strip().splitlines()[-1:] or ["no answer"]
            problems.append(
                f"the partner {params['peer_address']} does not answer on {params['interface']} with {params['mtu']}"
                f"-byte packets that may not be fragmented ({last[0]}): check the cable, both addresses and that "
                "both ends have the same MTU"
            )
    module.exit_json(changed=False, link=link, addresses=addresses, peer_answers=peer_answers, problems=problems)


if __name__ == "__main__":
    main()
