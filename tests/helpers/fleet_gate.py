"""Run the fleet's gate (roles/fleet_router/files/fleet_gate.py) on loopback with the command line of its unit, as
rendered from the role's template, and write its keys file with the role's own rule (module_utils/gate_keys.py);
`gated_router` runs it in front of vllm-router as the role does on a loopback endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gate_keys

from helpers import READY_TIMEOUT_S, ROOT, log_tails
from helpers.fleet_router import GATE_UNIT, TOOL, TOOL_TIMEOUT_S, UNIT, command_of, rendered, start_router
from helpers.vllm_standin import free_port

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


@contextmanager
def gated_router(
    tmp: Path, workers: list[dict], keys: list[dict], aliases: dict, spark_key: str, settings: dict | None = None
) -> Iterator[dict]:
    """vllm-router and the gate as the role runs them for a loopback endpoint (their units' command lines, rendered
    from the role's templates, with SETTINGS over the test's own ports), the workers ({host, url, model}) registered
    by the router unit's own helper. Yields the endpoint's port and base URL, the gate's metrics port, its keys file,
    the gate's process and the logs."""
    port, gate_metrics = free_port(), free_port()
    variables = {
        "fleet_router_port": port,
        "fleet_router_internal_port": free_port(),
        "fleet_router_metrics_port": free_port(),
        "fleet_router_gate_metrics_port": gate_metrics,
        "fleet_router_venv": str(Path(sys.executable).parent.parent),
        "fleet_router_health_interval_s": 1,
    } | (settings or {})
    port, gate_metrics = variables["fleet_router_port"], variables["fleet_router_gate_metrics_port"]
    unit, gate_unit = rendered(tmp, UNIT, variables), rendered(tmp, GATE_UNIT, variables)
    keys_file = tmp / "keys.json"
    write_keys(keys_file, keys, aliases)
    router = start_router(unit, tmp / "router.log")
    gate = start_gate(command_of(gate_unit, "ExecStart"), keys_file, spark_key, tmp / "gate.log")
    (tmp / "workers.json").write_text(json.dumps(workers))
    post = command_of(unit, "ExecStartPost")
    post[1], post[post.index("--workers") + 1] = str(TOOL), str(tmp / "workers.json")
    post[post.index("--wait") + 1] = str(READY_TIMEOUT_S)
    logs = [tmp / "gate.log", tmp / "router.log"]
    try:
        started = subprocess.run([sys.executable, *post[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        assert started.returncode == 0, started.stderr + log_tails(logs)
        base = f"http://127.0.0.1:{port}"
        yield {"port": port, "base": base, "metrics_port": gate_metrics, "keys": keys_file, "gate": gate, "logs": logs}
    finally:
        for process in (gate, router):
            process.terminate()
            process.wait(timeout=10)
