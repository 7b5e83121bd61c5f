"""Code the tests share; no test lives here. tests/conftest.py puts tests/ on sys.path, so a test file imports
`from helpers import ROOT`, `from helpers import hf_standin` or `from helpers.vllm_standin import start_server`.

(A conftest.py cannot be imported by name: pytest loads one per folder, all called `conftest`.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN_NVIDIA_SMI = ROOT / "tests" / "standins" / "nvidia-smi" / "nvidia-smi"


def ansible_tool(name: str) -> str:
    """An Ansible command from the project's venv when there is one, else from the PATH."""
    in_venv = ROOT / ".venv" / "bin" / name
    return str(in_venv) if in_venv.exists() else name


# How long a test waits for a service to come up or to reach a state: sized for a loaded 2-core CI machine. A slow
# machine only waits longer; a service that never gets there fails with the end of its own log.
READY_TIMEOUT_S = 300.0


def wait_until(check: Callable[[], object], what: str, logs: Iterable[Path] = (), seconds: float = READY_TIMEOUT_S):
    """Poll check() until it is true; an OSError from it (refused, reset, timed out) counts as not yet. After
    SECONDS, fail naming WHAT, with the last lines of each of LOGS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {seconds} s{log_tails(logs)}")


def log_tails(logs: Iterable[Path], lines: int = 30) -> str:
    """The last LINES lines of each log, for a failure message."""
    tails = []
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else "(no log written)"
        tails.append(f"\n--- {log}:\n" + "\n".join(text.splitlines()[-lines:]))
    return "".join(tails)
