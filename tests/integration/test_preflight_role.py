"""The preflight play run by real ansible-playbook against this machine, with the stand-in nvidia-smi: every
refusal names what it found and what to change. Bad input: test_bad_input.py.

How it runs: the module's runs go side by side (`runs`), and each test reads its own. A fitting host, check mode and
site.yml run on the default local inventory (localhost). The misfits are synthetic hosts of one run of
playbooks/preflight.yml: each is this machine over the local connection, with an environment of its own (what its
nvidia-smi answers, a Docker daemon that does not answer) set by its interpreter, a wrapper around this venv's
python, as another machine would have its own. The judge refuses every misfit in one task, so any_errors_fatal
stops none of them before its own message, and the ansible.posix.json callback reports each host's messages
apart."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ansible_tool
from helpers.playbook_runs import failures_by_host, json_report

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


def playbook_argv(playbook: str = "playbooks/preflight.yml", *extra: str, **overrides) -> list[str]:
    argv = [ansible_tool("ansible-playbook"), playbook, *extra]
    if overrides:
        argv += ["-e", json.dumps(overrides)]
    return argv


# The misfits, each a synthetic host named by its case: (what its nvidia-smi answers, its variables over FITS, what
# its refusal must say).
MISFITS = {
    "architecture": ("gb10", {"spark_preflight_test_host": False}, "Architecture: found x86_64, expected aarch64"),
    "wrong-gpu": ("h200", {}, "GPU: GPU 0 (NVIDIA H200) has compute capability 9.0; expected compute capability 12.1"),
    "old-driver": ("gb10-old-driver", {}, "runs NVIDIA driver 575.57.08; expected 580.95.05 or newer"),
    "driver-not-loaded": (
        "driver-not-loaded",
        {},
        "GPU: The NVIDIA driver did not answer: nvidia-smi exited with code 9",
    ),
    "os-family": ("gb10", {"spark_preflight_os_families": ["RedHat"]}, "OS: found Debian"),
    "memory": ("gb10", {"spark_preflight_min_memory_gib": 100000}, "expected at least 100000 GiB"),
    "disk": (
        "gb10",
        {"spark_preflight_disk_checks": [{"path": "/var/lib/docker/not-yet", "min_free_gib": 100000}]},
        "Disk: /var/lib/docker/not-yet (measured at /var/lib/docker)",
    ),
}
# One more misfit of that run: a host whose Docker daemon does not answer.
SILENT_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def host_with_its_own_environment(folder: Path, host: str, environment: dict[str, str]) -> dict[str, str]:
    """The connection variables of HOST, this machine over the local connection, whose modules run with
    ENVIRONMENT as another machine has its own: its interpreter, written to FOLDER, is a wrapper around this venv's
    python that exports it."""
    wrapper = folder / f"{host}-python"
    lines = ["#!/bin/sh", f"# Synthetic host {host}: this venv's python, in the host's own environment."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in environment.items()]
    lines.append(f'exec {shlex.quote(sys.executable)} "$@"')
    wrapper.write_text("\n".join(lines) + "\n", encoding="utf-8")
    wrapper.chmod(0o755)
    return {"ansible_connection": "local", "ansible_python_interpreter": str(wrapper)}


def misfits_inventory(folder: Path) -> Path:
    """An inventory in FOLDER of every misfit host, and of `silent-docker`, each with FITS and its own variables."""
    hosts = {
        host: {**host_with_its_own_environment(folder, host, {"NVIDIA_SMI_STANDIN_PROFILE": profile}), **FITS, **own}
        for host, (profile, own, _) in MISFITS.items()
    }
    hosts["silent-docker"] = {**host_with_its_own_environment(folder, "silent-docker", SILENT_DOCKER), **FITS}
    path = folder / "misfits.yml"
    path.write_text(json.dumps({"all": {"children": {"sparks": {"hosts": hosts}}}}), encoding="utf-8")
    return path


REACH_AND_PREFLIGHT = "tests/integration/playbooks/reach-and-preflight.yml"
OWN_IMAGE = "vllm/vllm-openai@sha256:" + "b" * 64


def two_drivers_inventory(folder: Path, paired: bool) -> Path:
    """Two fitting Sparks on two drivers (580.95.05 and 580.126.09, both recorded on GB10s) and two images (spark-b
    names its own digest): serving alone, or as the pair pair_x."""
    profiles = {"spark-a": "gb10", "spark-b": "gb10-580.126"}
    hosts = {
        host: {**host_with_its_own_environment(folder, host, {"NVIDIA_SMI_STANDIN_PROFILE": profile}), **FITS}
        for host, profile in profiles.items()
    }
    hosts["spark-b"]["vllm_image_ref"] = OWN_IMAGE
    children: dict = {"sparks": {"hosts": hosts}}
    if paired:
        children["sparks"]["children"] = {"pair_x": {"hosts": {host: {} for host in hosts}}}
        children["sparks"]["vars"] = {"spark_fabric_pair_group": "pair_x"}
    path = folder / f"two-drivers-{'pair' if paired else 'alone'}.yml"
    path.write_text(json.dumps({"all": {"children": children}}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(playbook_runs, nvidia_smi_env, tmp_path_factory):
    """Every run of this module, handed over at once, the longest first."""
    gb10 = nvidia_smi_env("gb10")
    inventory = misfits_inventory(tmp_path_factory.mktemp("misfits"))
    reported = dict(gb10, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    playbook_runs.start("misfits", playbook_argv("playbooks/preflight.yml", "-i", str(inventory)), reported)
    playbook_runs.start("fits", playbook_argv(**FITS), gb10)
    playbook_runs.start("check-mode", playbook_argv("playbooks/preflight.yml", "--check", **FITS), gb10)
    playbook_runs.start("site.yml-on-no-spark", playbook_argv("site.yml"), nvidia_smi_env(None))
    playbook_runs.start("good-image-refs", playbook_argv(VALIDATE_IMAGE_REFS, refs=GOOD_REFS), gb10)
    folder = tmp_path_factory.mktemp("two-drivers")
    for paired in (False, True):
        inventory = two_drivers_inventory(folder, paired)
        argv = playbook_argv(REACH_AND_PREFLIGHT, "-i", str(inventory))
        playbook_runs.start(f"two-drivers-{'pair' if paired else 'alone'}", argv, gb10)
    return playbook_runs


@pytest.fixture(scope="module")
def misfits(runs) -> dict[str, list[str]]:
    """Each misfit host's own failure messages."""
    return failures_by_host(json_report(runs.result("misfits")))


def test_a_fitting_host_passes_and_is_described(runs):
    done = runs.result("fits")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "localhost passed preflight." in said(done)
    assert "GPU 0: NVIDIA GB10, compute capability 12.1, driver 580.95.05." in said(done)


def test_check_mode_passes_and_changes_nothing(runs):
    done = runs.result("check-mode")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "changed=0" in said(done)


def test_site_yml_on_a_machine_that_is_no_spark_lists_every_problem(runs):
    # What `make site` does on a laptop or CI machine: no GPU, x86_64, little memory, all in one message.
    done = runs.result("site.yml-on-no-spark")
    assert done.returncode != 0
    out = said(done)
    assert "localhost cannot become a sparkfleet vLLM server" in out
    assert "GPU: nvidia-smi was not found" in out
    assert "compute capability 12.1 (sm_121, the DGX Spark's NVIDIA GB10)" in out
    assert "Architecture: found x86_64, expected aarch64" in out
    assert "Memory: found" in out and "expected at least 100 GiB" in out


@pytest.mark.parametrize("host", list(MISFITS))
def test_each_misfit_is_refused_with_what_was_found(misfits, host):
    message = MISFITS[host][2]
    assert misfits.get(host), f"misfit {host} passed preflight"
    assert any(message in failure for failure in misfits[host]), f"{message!r} not in {host}'s {misfits[host]}"


def test_a_docker_daemon_that_does_not_answer_is_refused(misfits):
    message = "Docker: `docker version` got no answer from the Docker daemon"
    assert misfits.get("silent-docker"), "silent-docker passed preflight"
    assert any(message in failure for failure in misfits["silent-docker"]), misfits["silent-docker"]


# Bad input, every role's, is table-driven in test_bad_input.py.


VALIDATE_IMAGE_REFS = "tests/integration/playbooks/validate-image-refs.yml"
GOOD_REFS = [
    "vllm/vllm-openai:cu130-nightly",
    "registry.example:5000/vllm/vllm-openai:v0.24.0-ubuntu2404",
    "127.0.0.1:5000/vllm/vllm-openai:cu130-nightly",
    "vllm/vllm-openai@sha256:" + "a" * 64,
]


def test_good_image_references_pass_validation(runs):
    # vllm_image's validate entry point, once per reference in one run (the table test covers the refusals).
    done = runs.result("good-image-refs")
    assert done.returncode == 0, done.stdout[-2000:]
    # Each reference went through the role's checks (a bad one in the list would fail the run: the table test).
    assert said(done).count("Validate | Check every value that reaches a command line") == len(GOOD_REFS)
    assert all(f"included: vllm_image for localhost => (item={ref})" in said(done) for ref in GOOD_REFS)


def test_sparks_alone_on_two_drivers_pass_with_a_warning_naming_each_group(runs):
    done = runs.result("two-drivers-alone")
    assert done.returncode == 0, said(done)[-3000:]
    assert "WARNING: the fleet is not one stack (the run goes on):" in said(done)
    assert "the fleet runs 2 NVIDIA drivers: 580.126.09 on spark-b; 580.95.05 on spark-a" in said(done)
    # The image each will run: spark-b's own digest, spark-a's default reference still to be pinned.
    assert (
        f"the fleet runs 2 vLLM images: vllm/vllm-openai:cu130-nightly (resolved at the runtime stage) on spark-a; "
        f"{OWN_IMAGE} on spark-b" in said(done)
    )


def test_a_pair_on_two_drivers_stops_naming_both(runs):
    done = runs.result("two-drivers-pair")
    assert done.returncode != 0
    assert "pair pair_x: its Sparks run different NVIDIA drivers (580.126.09 on spark-b; 580.95.05 on spark-a)" in said(
        done
    ), said(done)[-3000:]
    assert "pair pair_x: its Sparks run different vLLM images (" in said(done)
    assert "set one vllm_image_ref for both" in said(done)
