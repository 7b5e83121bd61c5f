"""acceptance.yml's own setting, checked before any host changes: sparkfleet_acceptance_compare_speculation must be a
yes or a no (text from `-e` included), and a bad one stops the run naming it. With no Spark in the inventory the
run reaches no host, so what stops it is the check alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, ansible_tool


@pytest.mark.parametrize(("value", "stops"), [("maybe", True), ("2", True), ("false", False), ("True", False)])
def test_the_speculation_comparison_setting_is_checked_first(tmp_path: Path, value: str, stops: bool) -> None:
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[sparks]\n")
    argv = [ansible_tool("ansible-playbook"), "-i", str(inventory), "acceptance.yml"]
    argv += ["-e", f"sparkfleet_acceptance_compare_speculation={value}"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert (done.returncode != 0) == stops, output[-2000:]
    named = "sparkfleet_acceptance_compare_speculation must be true (measure each speculative model"
    assert (named in output) == stops, output[-2000:]
