"""Jinja filter `HOST | spark_pair(PAIR_GROUP, groups)`: HOST's pair {group, head, peer, rank}, or {} when it serves
alone.

The rule is module_utils/spark_pair.py's pair_of, its one definition; it is loaded from that file, since a controller
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


class FilterModule:
    def filters(self) -> dict:
        return {"spark_pair": spark_pair}
