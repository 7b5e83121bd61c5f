"""Runs of ansible-playbook that go side by side, and what the json callback says about each host.

A test file whose cases each need a run of their own starts all its runs at once (`PlaybookRuns.start`), and each
test waits for the one it reads (`PlaybookRuns.result`): Ansible's forks already run the hosts of one run
together, and separate runs share the CPUs the same way. The fixture `playbook_runs` (tests/integration/conftest.py)
gives each test module one, and stops whatever a failed test left running."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import ROOT

# One run's limit: sized for a loaded 2-core CI machine, where the runs of a file share the CPUs.
RUN_TIMEOUT_S = 600


class PlaybookRuns:
    """Ansible commands started side by side in the checkout, each one's output kept in FOLDER."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._started: dict[str, tuple[subprocess.Popen, list[str]]] = {}
        self._finished: dict[str, subprocess.CompletedProcess] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        """Start ARGV (in the checkout, with ENV) as the run called NAME, without waiting for it."""
        assert name not in self._started, f"run {name} is started twice"
        with self._log(name, "out").open("w") as stdout, self._log(name, "err").open("w") as stderr:
            self._started[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr), argv

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The run called NAME once it has ended, as subprocess.run would return it."""
        if name not in self._finished:
            process, argv = self._started[name]
            process.wait(timeout=RUN_TIMEOUT_S)
            stdout, stderr = self._log(name, "out").read_text(), self._log(name, "err").read_text()
            self._finished[name] = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
        return self._finished[name]

    def stop(self) -> None:
        """End the runs that are still going (a test failed, or timed out, before reading them)."""
        for process, _ in self._started.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def _log(self, name: str, stream: str) -> Path:
        return self.folder / f"{name}.{stream}"


def json_report(done: subprocess.CompletedProcess) -> dict:
    """The report of the ansible.posix.json callback (ANSIBLE_STDOUT_CALLBACK) that a run printed."""
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"ansible printed no JSON report (exit {done.returncode}):\n{done.stderr}") from None


def failures_by_host(report: dict) -> dict[str, list[str]]:
    """Each host's failure messages in a json callback's REPORT, a loop's failed items' included, with line breaks
    and indentation folded into single spaces (a message that lists problems one a line reads as one line)."""
    failures: dict[str, list[str]] = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                failed = [item for item in [result, *result.get("results", [])] if item.get("failed")]
                messages = [" ".join(str(item.get("msg", "")).split()) for item in failed]
                failures.setdefault(host, []).extend(message for message in messages if message)
    return failures
