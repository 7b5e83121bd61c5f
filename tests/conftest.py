"""Shared pytest fixtures: paths of the project, and a PATH holding the stand-in nvidia-smi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN_NVIDIA_SMI = ROOT / "tests" / "standins" / "nvidia-smi" / "nvidia-smi"


def ansible_tool(name: str) -> str:
    """An Ansible command from the project's venv when there is one, else from the PATH."""
    in_venv = ROOT / ".venv" / "bin" / name
    return str(in_venv) if in_venv.exists() else name


def run_ansible_module(module: str, env: dict[str, str], args: str = "", check: bool = False) -> dict:
    """Run one of library/'s modules ad hoc against localhost through real Ansible and return its result
    (the json callback: ansible-core 2.19's --tree output drops the "failed" key)."""
    argv = [
        ansible_tool("ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-m",
        module,
    ]
    if args:
        argv += ["-a", args]
    if check:
        argv.append("--check")
    env = dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


# module_utils holds plain functions; tests import them without Ansible's loader.
sys.path.insert(0, str(ROOT / "module_utils"))


@pytest.fixture
def nvidia_smi_env(tmp_path: Path):
    """Environment whose PATH finds the stand-in nvidia-smi; call it with a recorded profile's name,
    or with None for a host that has no nvidia-smi at all."""

    def make(profile: str | None) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        if profile is not None:
            (bin_dir / "nvidia-smi").symlink_to(STANDIN_NVIDIA_SMI)
            env["NVIDIA_SMI_STANDIN_PROFILE"] = profile
        # Only the stand-in directory and the system's own; a real nvidia-smi elsewhere must not leak in.
        env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
        env["ANSIBLE_FORCE_COLOR"] = "0"
        return env

    return make
