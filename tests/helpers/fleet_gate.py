"""Run the fleet's gate (roles/fleet_router/files/fleet_gate.py) on loopback with the command line of its unit, as
rendered from the role's template, and write its keys file with the role's own rule (module_utils/gate_keys.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gate_keys

from helpers import ROOT

GATE = ROOT / "roles" / "fleet_router" / "files" / "fleet_gate.py"
INSTALLED = "/usr/local/lib/sparkfleet/fleet_gate.py"  # where the role's gate.yml puts it
KEYS_FILE = "/etc/sparkfleet/gate/keys.json"  # where it writes the keys


def write_keys(path: Path, keys: list[dict], aliases: dict[str, str] | None = None) -> None:
    """The keys file as the role writes it (an atomic replace, as ansible.builtin.copy does)."""
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps(gate_keys.keys_file(keys, aliases or {}), indent=2) + "\n")
    os.replace(staged, path)


def gate_argv(exec_start: list[str], keys_file: Path) -> list[str]:
    """The unit's ExecStart with the role's installed paths moved to this checkout's gate and a test's keys file."""
    argv = list(exec_start)
    assert argv[1] == INSTALLED and argv[argv.index("--keys") + 1] == KEYS_FILE, argv
    argv[1], argv[argv.index("--keys") + 1] = str(GATE), str(keys_file)
    return argv


def start_gate(exec_start: list[str], keys_file: Path, spark_key: str, log: Path) -> subprocess.Popen:
    """The gate as its unit runs it, the Sparks' key in its environment (the unit's EnvironmentFile)."""
    env = {**os.environ, "FLEET_SPARK_KEY": spark_key}
    with log.open("ab") as handle:
        return subprocess.Popen(gate_argv(exec_start, keys_file), stdout=handle, stderr=subprocess.STDOUT, env=env)
