"""Jinja filters for the fabric's address plan when sparkfleet configures it through netplan (spark_fabric_netplan):

- `GROUP | fabric_address_plan`: {addresses: {host: [CIDR, ...]}, problems: [...]} for a group of Sparks
  (GROUP: host -> {interfaces, subnets, addresses, rank});
- `SUBNETS | fabric_other_network_problems(HOST, OTHERS)`: the fabric subnets that overlap a network of the Spark's
  other interfaces (fabric_link_info's other_prefixes);
- `INTERFACES | fabric_netplan(CIDRS, MTU)`: the netplan document for the halves.

The rules are module_utils/fabric_addresses.py's, their one definition; it is loaded from that file, since a controller
plugin cannot import the project's module_utils as a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_fabric_addresses", Path(__file__).resolve().parents[1] / "module_utils" / "fabric_addresses.py"
)
fabric_addresses = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fabric_addresses)


def fabric_address_plan(group: dict) -> dict:
    """module_utils/fabric_addresses.py: plan."""
    addresses, problems = fabric_addresses.plan({str(host): dict(spark) for host, spark in group.items()})
    return {"addresses": addresses, "problems": problems}


def fabric_other_network_problems(subnets: list, host: str, others: dict) -> list[str]:
    """module_utils/fabric_addresses.py: other_network_problems."""
    return fabric_addresses.other_network_problems(
        str(host), list(subnets), {str(name): list(prefixes) for name, prefixes in (others or {}).items()}
    )


def fabric_netplan(interfaces: list, cidrs: list, mtu: int) -> dict:
    """module_utils/fabric_addresses.py: netplan."""
    return fabric_addresses.netplan([str(name) for name in interfaces], [str(cidr) for cidr in cidrs], int(mtu))


class FilterModule:
    def filters(self) -> dict:
        return {
            "fabric_address_plan": fabric_address_plan,
            "fabric_other_network_problems": fabric_other_network_problems,
            "fabric_netplan": fabric_netplan,
        }
