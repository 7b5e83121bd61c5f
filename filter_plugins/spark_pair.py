"""Jinja filters for the group of Sparks that serve one model together:

- `HOST | spark_pair(PAIR_GROUP, groups)`: HOST's group {group, head, members, peers, rank, size}, or {} when it
  serves alone;
- `HOST | spark_group_problems(PAIR_GROUP, groups)`: what is wrong with that group in the inventory;
- `SPARKS | spark_rollout(GROUPS_OF, LEFT_OUT, CANARY)`: update.yml's batches, each group together.

The rules are module_utils/spark_pair.py's, their one definition; it is loaded from that file, since a controller
plugin cannot import the project's module_utils as a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_spark_pair", Path(__file__).resolve().parents[1] / "module_utils" / "spark_pair.py"
)
spark_pair_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spark_pair_rules)


def spark_pair(host: str, pair_group: str | None, groups: dict) -> dict:
    """HOST's pair (module_utils/spark_pair.py: pair_of)."""
    return spark_pair_rules.pair_of(
        str(host), str(pair_group or ""), {name: list(hosts) for name, hosts in groups.items()}
    )


def spark_group_problems(host: str, pair_group: str | None, groups: dict) -> list[str]:
    """What is wrong with HOST's group in the inventory (module_utils/spark_pair.py: group_problems)."""
    return spark_pair_rules.group_problems(
        str(host), str(pair_group or ""), {name: list(hosts) for name, hosts in groups.items()}
    )


def spark_rollout(sparks: list, groups_of: dict, left_out: list, canary: str | None = "") -> dict:
    """update.yml's batches (module_utils/spark_pair.py: rollout)."""
    return spark_pair_rules.rollout(
        [str(host) for host in sparks],
        {str(host): dict(group or {}) for host, group in groups_of.items()},
        [str(host) for host in left_out],
        str(canary or ""),
    )


class FilterModule:
    def filters(self) -> dict:
        return {"spark_pair": spark_pair, "spark_group_problems": spark_group_problems, "spark_rollout": spark_rollout}
