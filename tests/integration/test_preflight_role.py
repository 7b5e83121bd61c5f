"""The preflight play run by real ansible-playbook against this machine (the default local inventory), with
the stand-in nvidia-smi: every refusal names what it found and what to change. Bad input: test_bad_input.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, ansible_tool

# What makes this x86_64 container-less CI machine pass: a test host, small memory and disk floors.
FITS = {
    "spark_preflight_test_host": True,
    "spark_preflight_min_memory_gib": 1,
    "spark_preflight_disk_checks": [{"path": "/var/lib/docker", "min_free_gib": 1}],
    # Preflight also plans each served model's memory on this machine: the smallest recipe fits a CI machine.
    "vllm_server_models": [{"recipe": "qwen3-0.6b", "port": 8000}],
}


def said(done: subprocess.CompletedProcess) -> str:
    """The play's output with line wrapping undone (the yaml callback folds long messages)."""
    return " ".join(done.stdout.split())


def run_playbook(env: dict[str, str], playbook: str = "playbooks/preflight.yml", *extra: str, **overrides):
    argv = [ansible_tool("ansible-playbook"), playbook, *extra]
    if overrides:
        argv += ["-e", json.dumps(overrides)]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_a_fitting_host_passes_and_is_described(nvidia_smi_env):
    done = run_playbook(nvidia_smi_env("gb10"), **FITS)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "localhost passed preflight." in said(done)
    assert "GPU 0: NVIDIA GB10, compute capability 12.1, driver 580.95.05." in said(done)


def test_check_mode_passes_and_changes_nothing(nvidia_smi_env):
    done = run_playbook(nvidia_smi_env("gb10"), "playbooks/preflight.yml", "--check", **FITS)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "changed=0" in said(done)


def test_site_yml_on_a_machine_that_is_no_spark_lists_every_problem(nvidia_smi_env):
    # What `make site` does on a laptop or CI machine: no GPU, x86_64, little memory, all in one message.
    done = run_playbook(nvidia_smi_env(None), "site.yml")
    assert done.returncode != 0
    out = said(done)
    assert "localhost cannot become a sparkfleet vLLM server" in out
    assert "GPU: nvidia-smi was not found" in out
    assert "compute capability 12.1 (sm_121, the DGX Spark's NVIDIA GB10)" in out
    assert "Architecture: found x86_64, expected aarch64" in out
    assert "Memory: found" in out and "expected at least 100 GiB" in out


@pytest.mark.parametrize(
    ("profile", "overrides", "message"),
    [
        ("gb10", {"spark_preflight_test_host": False}, "Architecture: found x86_64, expected aarch64"),
        ("h200", {}, "GPU: GPU 0 (NVIDIA H200) has compute capability 9.0; expected compute capability 12.1"),
        ("gb10-old-driver", {}, "runs NVIDIA driver 575.57.08; expected 580.95.05 or newer"),
        ("driver-not-loaded", {}, "GPU: The NVIDIA driver did not answer: nvidia-smi exited with code 9"),
        ("gb10", {"spark_preflight_os_families": ["RedHat"]}, "OS: found Debian"),
        ("gb10", {"spark_preflight_min_memory_gib": 100000}, "expected at least 100000 GiB"),
        (
            "gb10",
            {"spark_preflight_disk_checks": [{"path": "/var/lib/docker/not-yet", "min_free_gib": 100000}]},
            "Disk: /var/lib/docker/not-yet (measured at /var/lib/docker)",
        ),
    ],
    ids=["architecture", "wrong-gpu", "old-driver", "driver-not-loaded", "os-family", "memory", "disk"],
)
def test_each_misfit_is_refused_with_what_was_found(nvidia_smi_env, profile, overrides, message):
    done = run_playbook(nvidia_smi_env(profile), **{**FITS, **overrides})
    assert done.returncode != 0
    assert message in said(done)


def test_a_docker_daemon_that_does_not_answer_is_refused(nvidia_smi_env):
    env = dict(nvidia_smi_env("gb10"), DOCKER_HOST="unix:///nonexistent/docker.sock")
    done = run_playbook(env, **FITS)
    assert done.returncode != 0
    assert "Docker: `docker version` got no answer from the Docker daemon" in said(done)


# Bad input, every role's, is table-driven in test_bad_input.py.


GOOD_REFS = [
    "vllm/vllm-openai:cu130-nightly",
    "registry.example:5000/vllm/vllm-openai:v0.24.0-ubuntu2404",
    "127.0.0.1:5000/vllm/vllm-openai:cu130-nightly",
    "vllm/vllm-openai@sha256:" + "a" * 64,
]


def test_good_image_references_pass_validation(nvidia_smi_env):
    # vllm_image's validate entry point, once per reference in one run (the table test covers the refusals).
    playbook = "tests/integration/playbooks/validate-image-refs.yml"
    done = run_playbook(nvidia_smi_env("gb10"), playbook, refs=GOOD_REFS)
    assert done.returncode == 0, done.stdout[-2000:]
    # Each reference went through the role's checks (a bad one in the list would fail the run: the table test).
    assert said(done).count("Validate | Check every value that reaches a command line") == len(GOOD_REFS)
    assert all(f"included: vllm_image for localhost => (item={ref})" in said(done) for ref in GOOD_REFS)
