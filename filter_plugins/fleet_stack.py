"""Jinja filters for the fleet's stack (module_utils/fleet_stack.py, the one definition of the rule, loaded from that
file since a controller plugin cannot import the project's module_utils as a package):

- `TEXT | dgx_release`: the DGX OS release /etc/dgx-release names ("none" for None: no such file);
- `STACKS | fleet_stack_judge(PAIR_OF)`: {problems, warnings} for host -> {driver, kernel, dgx_os, ...} and host ->
  its pair ({group, head, peer, rank}, or {} alone: the project fact sparkfleet_pair);
- `PAIR_STACKS | fleet_stack_host_nccl(PAIR)`: what stops a pair that loads the host's NCCL.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_fleet_stack", Path(__file__).resolve().parents[1] / "module_utils" / "fleet_stack.py"
)
fleet_stack_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_stack_rules)


def dgx_release(text: str | None) -> str:
    return fleet_stack_rules.dgx_release(None if text is None else str(text))


def fleet_stack_host_nccl(stacks: dict, pair: str) -> list[str]:
    return fleet_stack_rules.host_nccl_problems({str(host): dict(stack) for host, stack in stacks.items()}, str(pair))


def fleet_stack_judge(stacks: dict, pair_of: dict) -> dict:
    problems, warnings = fleet_stack_rules.judge(
        {str(host): dict(stack) for host, stack in stacks.items()}, fleet_stack_rules.pairs(pair_of)
    )
    return {"problems": problems, "warnings": warnings}


class FilterModule:
    def filters(self) -> dict:
        return {
            "dgx_release": dgx_release,
            "fleet_stack_judge": fleet_stack_judge,
            "fleet_stack_host_nccl": fleet_stack_host_nccl,
        }
