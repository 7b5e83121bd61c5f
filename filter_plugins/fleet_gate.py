"""Jinja filters for roles/fleet_router's gate (module_utils/gate_keys.py, the one definition of the rules, loaded
from that file since a controller plugin cannot import the project's module_utils as a package):

- `KEYS | fleet_gate_key_problems(SPARK_KEY)`: what is wrong with fleet_router_keys and fleet_router_spark_key
  (messages name entries, never keys);
- `KEYS | fleet_gate_key_warnings(SPARK_KEY)`: what is allowed but unwise (a client key that is the Sparks' key);
- `WORKERS | fleet_gate_aliases`: {aliases: {alias: served name}, clashes: [...]} from the router's workers;
- `KEYS | fleet_gate_keys_file(ALIASES)`: the gate's keys file (names, SHA-256 of the keys, limits, aliases).
- `WEBUI | fleet_webui_problems(KEYS)`: what is wrong with Open WebUI's settings (fleet_router_webui_*);
- `KEY | fleet_webui_key_entry`: the UI's entry among the gate's keys (named open-webui).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_gate_keys", Path(__file__).resolve().parents[1] / "module_utils" / "gate_keys.py"
)
gate_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate_keys)


def fleet_gate_key_problems(keys: object, spark_key: object) -> list[str]:
    return gate_keys.problems(_plain(keys), _plain(spark_key))


def fleet_gate_key_warnings(keys: object, spark_key: object) -> list[str]:
    plain = _plain(keys)
    return gate_keys.warnings(plain, str(spark_key or "")) if isinstance(plain, list) else []


def fleet_gate_aliases(workers: list) -> dict:
    found, clashes = gate_keys.aliases(
        [{"served": w["model"], "aliases": list(w.get("aliases") or [])} for w in workers]
    )
    return {"aliases": found, "clashes": clashes}


def fleet_gate_keys_file(keys: list, aliases: dict) -> dict:
    return gate_keys.keys_file(_plain(keys), {str(alias): str(name) for alias, name in dict(aliases).items()})


def fleet_webui_problems(webui: dict, keys: object) -> list[str]:
    return gate_keys.webui_problems(_plain(webui), _plain(keys))


def fleet_webui_key_entry(key: object) -> dict:
    return gate_keys.webui_entry(str(key or ""))


def _plain(value: object) -> object:
    """Ansible's lazy containers and tagged strings as plain Python values."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, str):
        return str(value)
    return value


class FilterModule:
    def filters(self) -> dict:
        return {
            "fleet_gate_key_problems": fleet_gate_key_problems,
            "fleet_gate_key_warnings": fleet_gate_key_warnings,
            "fleet_gate_aliases": fleet_gate_aliases,
            "fleet_gate_keys_file": fleet_gate_keys_file,
            "fleet_webui_problems": fleet_webui_problems,
            "fleet_webui_key_entry": fleet_webui_key_entry,
        }
