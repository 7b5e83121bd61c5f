"""Runs of ansible-playbook that go side by side, and what the json callback says about each host.

A test file whose cases each need a run of their own hands all its runs over at once (`PlaybookRuns.start`), and
each test waits for the one it reads (`PlaybookRuns.result`). As many runs go at a time as the machine has CPUs
(at least two): a run keeps about one CPU busy, or more with several hosts, and more runs would only take turns
and cost CPU time for it. The others wait their turn in the order they were handed over: a file hands over its
longest run first. The fixture `playbook_runs` (tests/integration/conftest.py) gives each test module one, and
stops whatever is still running when the module ends. A test run alone still runs every run of its module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import ROOT

# One run's limit once started: sized for a loaded 2-core CI machine.
RUN_TIMEOUT_S = 600
IN_FLIGHT = max(2, len(os.sched_getaffinity(0)))


class PlaybookRuns:
    """Ansible commands run side by side in the checkout, each one's output kept in FOLDER."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._waiting: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._started: dict[str, tuple[subprocess.Popen, float]] = {}
        self._finished: dict[str, subprocess.CompletedProcess] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        """Run ARGV (in the checkout, with ENV) as the run called NAME, now or as soon as it is its turn."""
        assert name not in self._waiting and name not in self._started, f"run {name} is handed over twice"
        self._waiting[name] = argv, env
        self._start_the_next()

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The run called NAME once it has ended, as subprocess.run would return it."""
        assert name in self._waiting or name in self._started, f"no run {name} was handed over"
        while name not in self._finished:
            self._start_the_next()
            if name in self._started:
                process, started_at = self._started[name]
                if process.poll() is not None:
                    stdout, stderr = self._log(name, "out").read_text(), self._log(name, "err").read_text()
                    self._finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
                    break
                if time.monotonic() - started_at > RUN_TIMEOUT_S:
                    raise AssertionError(f"run {name} did not end within {RUN_TIMEOUT_S} s: {process.args}")
            time.sleep(0.2)
        return self._finished[name]

    def stop(self) -> None:
        """End the runs that are still going (their tests failed, timed out or were not selected)."""
        self._waiting.clear()
        for process, _ in self._started.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def _start_the_next(self) -> None:
        """Start waiting runs, in order, while fewer than IN_FLIGHT are going."""
        while self._waiting and sum(process.poll() is None for process, _ in self._started.values()) < IN_FLIGHT:
            name = next(iter(self._waiting))
            argv, env = self._waiting.pop(name)
            with self._log(name, "out").open("w") as stdout, self._log(name, "err").open("w") as stderr:
                # A session of its own: stop() ends the run with its workers and modules.
                process = subprocess.Popen(
                    argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True
                )
            self._started[name] = process, time.monotonic()

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
