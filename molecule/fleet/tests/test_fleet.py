"""A fleet of two simulated Sparks: one digest everywhere, a tag that moves only when asked, the host's own
toolkit left alone, and bad input that stops the run with every host as it was.

The tests after the first ones run site.yml again themselves (with molecule's inventory and configuration), so
they run in file order and change the fleet's image pin as they go.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import testinfra
import testinfra.utils.ansible_runner
import yaml

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
LOCK_FILE = Path(INVENTORY).parent / "vllm-image.lock.yml"
VLLM_REF = "vllm/vllm-openai:cu130-nightly"
HOSTS = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("sparks")


def fleet():
    return [testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}") for name in HOSTS]


def pin() -> dict:
    return yaml.safe_load(LOCK_FILE.read_text(encoding="utf-8"))["images"][VLLM_REF]


def image_ids(host) -> set[str]:
    return set(host.check_output("docker image ls --no-trunc --quiet vllm/vllm-openai").split())


def run_site(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ansible-playbook", "-i", INVENTORY, str(PROJECT / "site.yml"), *extra],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def said(done: subprocess.CompletedProcess) -> str:
    """The play's output, failures included (molecule's configuration shows them on stderr), with line wrapping
    undone (the yaml callback folds long messages)."""
    return " ".join((done.stdout + done.stderr).split())


def changed_per_host(output: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)}


def test_every_host_holds_the_same_pinned_image():
    entry = pin()
    for host in fleet():
        image = json.loads(host.check_output(f"docker image inspect vllm/vllm-openai@{entry['digest']}"))[0]
        assert image["Id"] == entry["image_id"], host.backend.host


def test_a_host_that_ships_the_toolkit_keeps_it():
    first, second = fleet()
    assert first.package("nvidia-container-toolkit").version == "1.17.7-1"
    assert first.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list").exists
    # fleet-2 had 1.17.8-1 from its own entry for the repository: no downgrade, no second entry.
    assert second.package("nvidia-container-toolkit").version == "1.17.8-1"
    assert not second.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list").exists
    assert "nvidia" in json.loads(second.check_output("docker info --format '{{json .Runtimes}}'"))


@pytest.fixture(scope="module")
def moved_tag():
    """Push a new image under the same tag to the fleet's registry; return (old digest, new digest)."""
    first = fleet()[0]
    old = pin()["digest"]
    first.check_output(
        "printf 'FROM vllm/vllm-openai@%s\\nLABEL sparkfleet.test=moved-tag\\n' "
        "| docker build -q -t 127.0.0.1:5000/vllm/vllm-openai:cu130-nightly -",
        old,
    )
    first.check_output("docker push -q 127.0.0.1:5000/vllm/vllm-openai:cu130-nightly")
    new = first.check_output(
        "curl -fsSI -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' "
        "http://127.0.0.1:5000/v2/vllm/vllm-openai/manifests/cu130-nightly "
        "| awk 'tolower($1)==\"docker-content-digest:\" {print $2}'"
    ).strip()
    assert new.startswith("sha256:") and new != old
    return old, new


def test_a_moved_tag_changes_nothing_without_an_update(moved_tag):
    old, _ = moved_tag
    before = [image_ids(host) for host in fleet()]
    done = run_site()
    assert done.returncode == 0, done.stdout[-3000:]
    assert set(changed_per_host(done.stdout).values()) == {0}
    assert pin()["digest"] == old
    assert [image_ids(host) for host in fleet()] == before


def test_an_update_moves_every_host_and_keeps_the_old_image(moved_tag):
    old, new = moved_tag
    done = run_site("-e", "vllm_image_update=true")
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"moved from {old} to {new}" in said(done)
    entry = pin()
    assert entry["digest"] == new
    assert entry["previous_digest"] == old
    for host in fleet():
        assert host.run(f"docker image inspect vllm/vllm-openai@{new}").rc == 0
        assert host.run(f"docker image inspect vllm/vllm-openai@{old}").rc == 0, "the previous image must stay"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "vllm_image_ref=vllm/vllm-openai:no-such-tag", "-e", "vllm_image_update=true"], "no-such-tag"),
        (["-e", "vllm_image_ref=127.0.0.1:5999/vllm/vllm-openai:cu130-nightly"], "127.0.0.1:5999"),
        (["-e", "vllm_image_ref=vllm/vllm-openai@sha256:" + "0" * 64], "sha256:" + "0" * 64),
        (["-e", "vllm_image_ref=vllm/vllm-openai"], "vllm_image_ref must be repository:tag"),
        (["-e", "nvidia_container_toolkit_key_url="], "apt refuses a repository without its signing key"),
    ],
    ids=["unknown-tag", "unreachable-registry", "unknown-digest", "no-tag", "repo-without-key"],
)
def test_bad_input_fails_clearly_and_leaves_every_host_as_it_was(extra, message):
    lock_before = LOCK_FILE.read_text(encoding="utf-8")
    images_before = [image_ids(host) for host in fleet()]
    daemon_before = [host.file("/etc/docker/daemon.json").content_string for host in fleet()]
    done = run_site(*extra)
    assert done.returncode != 0
    assert message in said(done)
    assert set(changed_per_host(done.stdout).values()) <= {0}
    assert LOCK_FILE.read_text(encoding="utf-8") == lock_before
    assert [image_ids(host) for host in fleet()] == images_before
    assert [host.file("/etc/docker/daemon.json").content_string for host in fleet()] == daemon_before
