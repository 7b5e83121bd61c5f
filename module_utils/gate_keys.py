"""The fleet gate's keys and aliases (roles/fleet_router/files/fleet_gate.py reads the file this writes).

- `problems(keys, spark_key)`: what is wrong with fleet_router_keys and fleet_router_spark_key, each message
  naming the entry by its index and name, never showing a key.
- `warnings(keys, spark_key)`: what is allowed but unwise (a client key that is the Sparks' own key).
- `aliases(endpoints)`: the served-name aliases the Sparks published (fact vllm_server_endpoints), as alias ->
  served name, and what clashes (an alias of two models, or an alias that is another model's served name).
- `keys_file(keys, aliases)`: the gate's file: each key's name, SHA-256 and limits, and the aliases. It holds no key.
- `webui_problems(webui, keys)`: what is wrong with Open WebUI's settings (fleet_router_webui_*): the UI is one more
  client of the gate, with a key of its own (named open-webui), a session secret and a first admin.

A key entry: {name, key, requests_per_minute (0: no limit), concurrent (0: no limit), enabled (true)}.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

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
        found += _key_problems(f"{label}.key", entry.get("key"), digests)
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


def _key_problems(what: str, key: object, digests: set[str]) -> list[str]:
    """What is wrong with one key (WHAT names it): a secret of its own; the messages never hold the key."""
    found = _long_secret(what, key, MIN_KEY_LENGTH)
    if found:
        return found
    digest = digest_of(key)
    if digest in digests:
        return [f"{what} is another entry's key too; each person or team has a key of its own"]
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


# --- Open WebUI, the gate's client on the router host --------------------------------------------------------------

WEBUI_KEY_NAME = "open-webui"  # the UI's key at the gate, in logs and metrics
MIN_WEBUI_SECRET_LENGTH = 32  # WEBUI_SECRET_KEY signs sessions: a guessable one lets anyone forge a login
MIN_WEBUI_PASSWORD_LENGTH = 12
FERNET_KEY_LENGTH = 44  # a Fernet key: 32 bytes in URL-safe base64
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def webui_entry(key: str) -> dict:
    """The UI's entry among the gate's keys."""
    return {"name": WEBUI_KEY_NAME, "key": key}


def webui_problems(webui: dict, keys: object) -> list[str]:
    """WEBUI: {key, secret_key, admin_email, admin_password, network (the endpoint beyond loopback), tls}. KEYS:
    fleet_router_keys. The messages name the variable, never show a secret."""
    found = []
    others = [entry for entry in keys if isinstance(entry, dict)] if isinstance(keys, list) else []
    digests = {digest_of(entry["key"]) for entry in others if isinstance(entry.get("key"), str)}
    found += _key_problems("fleet_router_webui_key", webui.get("key"), digests)
    if any(entry.get("name") == WEBUI_KEY_NAME for entry in others):
        found.append(
            f"fleet_router_keys has an entry named {WEBUI_KEY_NAME}, the name of the UI's own key"
            " (fleet_router_webui_key): rename that entry"
        )
    found += _long_secret("fleet_router_webui_secret_key", webui.get("secret_key"), MIN_WEBUI_SECRET_LENGTH)
    found += _fernet_length_problems(webui.get("secret_key"))
    found += _long_secret("fleet_router_webui_admin_password", webui.get("admin_password"), MIN_WEBUI_PASSWORD_LENGTH)
    email = webui.get("admin_email")
    if not isinstance(email, str) or not EMAIL.match(email):
        found.append(
            f"fleet_router_webui_admin_email={email!r} is not an e-mail address: the UI's first admin logs in with it"
        )
    if webui.get("network") and not webui.get("tls"):
        found.append(
            "fleet_router_webui is on and the endpoint is on the network, where people would log in over plain HTTP:"
            " set fleet_router_tls_certificate (HAProxy then serves the UI over TLS), or keep the endpoint on loopback"
        )
    return found


def _fernet_length_problems(secret: object) -> list[str]:
    """Open WebUI 0.12.4 encrypts its OAuth sessions with WEBUI_SECRET_KEY (OAUTH_SESSION_TOKEN_ENCRYPTION_KEY's
    default): a secret of exactly 44 characters is taken as a Fernet key as it is (open_webui/models/oauth_sessions.py),
    and unless it is 32 bytes in URL-safe base64 the UI stops at its start; any other length is hashed into one."""
    if not isinstance(secret, str) or len(secret) != FERNET_KEY_LENGTH:
        return []
    try:
        if len(base64.urlsafe_b64decode(secret.encode())) == 32:
            return []
    except (binascii.Error, ValueError):
        pass
    return [
        f"fleet_router_webui_secret_key has {FERNET_KEY_LENGTH} characters, which Open WebUI takes as a Fernet key"
        " (32 bytes in URL-safe base64), and it is none: Open WebUI would stop at its start. Use a secret of another"
        " length, e.g. openssl rand -hex 32"
    ]


def _long_secret(variable: str, value: object, least: int) -> list[str]:
    """A secret from Ansible Vault: set, one printable word, at least LEAST characters."""
    if not isinstance(value, str) or not value:
        return [f"{variable} is empty: set it from Ansible Vault (at least {least} characters)"]
    why = input_rules.secret(value)
    if why:
        return [f"{variable} (value hidden) {why}"]
    if len(value) < least:
        return [f"{variable} is shorter than {least} characters: generate one, e.g. openssl rand -hex 24"]
    return []
