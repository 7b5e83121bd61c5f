"""The fleet gate's keys and aliases (roles/fleet_router/files/fleet_gate.py reads the file this writes).

- `problems(keys, spark_key)`: what is wrong with fleet_router_keys and fleet_router_spark_key, each message
  naming the entry by its index and name, never showing a key.
- `warnings(keys, spark_key)`: what is allowed but unwise (a client key that is the Sparks' own key).
- `aliases(endpoints)`: the served-name aliases the Sparks published (fact vllm_server_endpoints), as alias ->
  served name, and what clashes (an alias of two models, or an alias that is another model's served name).
- `keys_file(keys, aliases)`: the gate's file: each key's name, SHA-256 and limits, and the aliases. It holds no key.

A key entry: {name, key, requests_per_minute (0: no limit), concurrent (0: no limit), enabled (true)}.
"""

from __future__ import annotations

import hashlib

try:
    from ansible.module_utils import input_rules
except ImportError:  # loaded by file path (filter_plugins/fleet_gate.py, the unit tests)
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location("input_rules", Path(__file__).with_name("input_rules.py"))
    input_rules = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(input_rules)

ENTRY_KEYS = {"name", "key", "requests_per_minute", "concurrent", "enabled"}
LIMITS = ("requests_per_minute", "concurrent")
# A key shorter than this is guessable; a generated one (openssl rand -hex 24) is far longer.
MIN_KEY_LENGTH = 16
VARIABLE = "fleet_router_keys"
SPARK_KEY_VARIABLE = "fleet_router_spark_key"


def problems(keys: object, spark_key: object) -> list[str]:
    found = _spark_key_problems(spark_key)
    if not isinstance(keys, list):
        return [*found, f"{VARIABLE}: expected a list of {{name, key}} entries (keys from Ansible Vault)"]
    if not keys:
        found.append(
            f"{VARIABLE} is empty, so no one could use the endpoint: give each person or team an entry {{name, key}}"
            " (keys in Ansible Vault), or set sparkfleet_api_key (the default is one key named fleet)"
        )
    names: set[str] = set()
    digests: set[str] = set()
    for index, entry in enumerate(keys):
        label = f"{VARIABLE}[{index}]"
        if not isinstance(entry, dict):
            found.append(f"{label}: expected a mapping with name and key")
            continue
        name = entry.get("name")
        why = input_rules.folder_name(name)
        if why:
            found.append(f"{label}.name={name!r}: the key's name (in logs and metrics) {why}")
        else:
            label = f"{VARIABLE}[{index}] ({name})"
            if name in names:
                found.append(f"{label}: the name {name} is used twice; each key has a name of its own")
            names.add(name)
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            found.append(f"{label}: unknown keys {', '.join(unknown)}; an entry has {', '.join(sorted(ENTRY_KEYS))}")
        found += _key_problems(label, entry.get("key"), digests)
        for limit in LIMITS:
            value = entry.get(limit, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                found.append(f"{label}.{limit}={value!r}: a whole number, 0 for no limit")
        if not isinstance(entry.get("enabled", True), bool):
            found.append(f"{label}.enabled={entry.get('enabled')!r}: true or false")
    return found


def warnings(keys: list[dict], spark_key: str) -> list[str]:
    """A client key that is also the Sparks' key: its holder can reach a Spark directly, past the gate's limits,
    usage and revocation. The default (one key, named fleet, the fleet's shared key) is such a key."""
    return [
        f"{VARIABLE}[{index}] ({entry.get('name')}) is the Sparks' own key (fleet_router_spark_key): whoever holds it"
        " can reach the Sparks directly, past the gate's limits, usage and revocation. Give people and teams keys of"
        " their own in fleet_router_keys, and keep the Sparks' key to the router and the Sparks."
        for index, entry in enumerate(keys)
        if isinstance(entry, dict) and spark_key and entry.get("key") == spark_key and entry.get("enabled", True)
    ]


def _spark_key_problems(key: object) -> list[str]:
    fix = "set it to the key the Sparks check (vllm_server_api_key; by default both are sparkfleet_api_key)"
    if not isinstance(key, str) or not key:
        return [f"{SPARK_KEY_VARIABLE} is empty: {fix}"]
    why = input_rules.secret(key)
    return [f"{SPARK_KEY_VARIABLE} {why}: {fix}"] if why else []


def _key_problems(label: str, key: object, digests: set[str]) -> list[str]:
    """What is wrong with one key; the messages never hold the key."""
    if not isinstance(key, str) or not key:
        return [f"{label}.key: missing; put the key in Ansible Vault and name it here"]
    why = input_rules.secret(key)
    if why:
        return [f"{label}.key {why}"]
    if len(key) < MIN_KEY_LENGTH:
        return [f"{label}.key is shorter than {MIN_KEY_LENGTH} characters: generate one, e.g. openssl rand -hex 24"]
    digest = digest_of(key)
    if digest in digests:
        return [f"{label}.key is another entry's key too; each person or team has a key of its own"]
    digests.add(digest)
    return []


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def aliases(endpoints: list[dict]) -> tuple[dict[str, str], list[str]]:
    """alias -> served name from the Sparks' endpoints ({served, aliases}), and the clashes."""
    served = {endpoint["served"] for endpoint in endpoints}
    found: dict[str, str] = {}
    clashes: list[str] = []
    for endpoint in endpoints:
        for alias in endpoint.get("aliases") or []:
            if alias in served:
                clashes.append(f"{alias} is an alias of {endpoint['served']} and the served name of another model")
            elif found.setdefault(alias, endpoint["served"]) != endpoint["served"]:
                clashes.append(f"{alias} is an alias of both {found[alias]} and {endpoint['served']}")
    return found, sorted(set(clashes))


def keys_file(keys: list[dict], alias_map: dict[str, str]) -> dict:
    """What the gate reads: names, SHA-256 of the keys, limits, enabled; and the aliases."""
    return {
        "keys": [
            {
                "name": entry["name"],
                "sha256": digest_of(entry["key"]),
                "enabled": entry.get("enabled", True),
                **{limit: int(entry.get(limit, 0)) for limit in LIMITS},
            }
            for entry in keys
        ],
        "aliases": dict(sorted(alias_map.items())),
    }
