"""Fixtures for tests that run real Ansible in processes of its own (`ansible`, `ansible-playbook`) or live
services on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, STANDIN_NVIDIA_SMI, ansible_tool
from helpers.playbook_runs import PlaybookRuns
from helpers.vllm_engine import SHARED_ENGINE_KEY, SMOLLM2, real_model, running_engine


@pytest.fixture
def run_ansible_module():
    """Run one of library/'s modules ad hoc against localhost through real Ansible (`ansible localhost -m`) and
    return its result (the json callback: ansible-core 2.19's --tree output drops the "failed" key). For what
    needs the whole machinery or a process of its own; tests/unit's `run_module` runs a module in-process."""

    def run(module: str, env: dict[str, str], args: str = "", check: bool = False) -> dict:
        argv = [ansible_tool("ansible"), "localhost", "-i", "localhost,", "-c", "local"]
        argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", module]
        if args:
            argv += ["-a", args]
        if check:
            argv.append("--check")
        env = dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"ansible printed no JSON report (exit {done.returncode}):\n{done.stderr}") from None
        return report["plays"][0]["tasks"][0]["hosts"]["localhost"]

    return run


@pytest.fixture(scope="module")
def nvidia_smi_env(tmp_path_factory):
    """Environment for an Ansible process whose PATH finds the stand-in nvidia-smi; call it with a recorded
    profile's name, or with None for a host that has no nvidia-smi at all. Module-scoped, so that the runs a module
    starts at once (`playbook_runs`) can use it."""
    folder = tmp_path_factory.mktemp("nvidia-smi")

    def make(profile: str | None) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = folder / ("standin" if profile is not None else "none")
        bin_dir.mkdir(exist_ok=True)
        if profile is not None:
            if not (bin_dir / "nvidia-smi").exists():
                (bin_dir / "nvidia-smi").symlink_to(STANDIN_NVIDIA_SMI)
            env["NVIDIA_SMI_STANDIN_PROFILE"] = profile
        # Only the stand-in directory and the system's own; a real nvidia-smi elsewhere must not leak in.
        env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
        env["ANSIBLE_FORCE_COLOR"] = "0"
        return env

    return make


@pytest.fixture(scope="module")
def playbook_runs(tmp_path_factory):
    """A test module's ansible-playbook runs, started side by side and read by each test that needs one
    (tests/helpers/playbook_runs.py); whatever is still running when the module ends is stopped."""
    runs = PlaybookRuns(tmp_path_factory.mktemp("runs"))
    yield runs
    runs.stop()


@pytest.fixture(scope="session")
def smollm2_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real vLLM engine serving SmolLM2-135M-Instruct as "smollm2" behind SHARED_ENGINE_KEY on loopback, shared
    by the tests that ask the real engine (one 30-60 s start for all of them, at the first that needs it); its
    base URL. Tests only ask it: none restarts or reconfigures it."""
    with running_engine(
        real_model(SMOLLM2),
        served_name="smollm2",
        api_key=SHARED_ENGINE_KEY,
        workdir=tmp_path_factory.mktemp("smollm2-engine"),
    ) as (base_url, _):
        yield base_url
