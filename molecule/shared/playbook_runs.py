"""Helpers for verify steps that run site.yml again themselves, with molecule's inventory and configuration."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])


def run_site(*extra: str, playbook: str = "site.yml", timeout: int = 900) -> subprocess.CompletedProcess:
    """ansible-playbook site.yml (or another playbook of the project) against the scenario's hosts."""
    return subprocess.run(
        ["ansible-playbook", "-i", INVENTORY, str(PROJECT / playbook), *extra],
        cwd=PROJECT,
        env=dict(os.environ, ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def said(done: subprocess.CompletedProcess) -> str:
    """The play's output, failures included (molecule's configuration shows them on stderr), with line wrapping
    undone (the yaml callback folds long messages)."""
    return " ".join((done.stdout + done.stderr).split())


# The controller runs site.yml's last play (playbooks/summary.yml) on itself; it is no host of a scenario.
CONTROLLER = "localhost"


def changed_per_host(output: str) -> dict[str, int]:
    """changed= of each of the scenario's hosts in the play recap."""
    found = re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)
    return {m.group(1): int(m.group(2)) for m in found if m.group(1) != CONTROLLER}


def failed_per_host(output: str) -> dict[str, int]:
    """failed= of each of the scenario's hosts in the play recap."""
    found = re.finditer(r"^(\S+)\s+:\s+ok=.*?\bfailed=(\d+)", output, re.M)
    return {m.group(1): int(m.group(2)) for m in found if m.group(1) != CONTROLLER}
