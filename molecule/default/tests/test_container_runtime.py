"""What site.yml's container-runtime stage left on a simulated Spark: the toolkit from the signed repository,
Docker's nvidia runtime beside the user's own daemon.json keys, and the vLLM image pinned by digest."""

import json
import os
from pathlib import Path

import testinfra.utils.ansible_runner
import yaml

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

TOOLKIT = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
VLLM_REF = "vllm/vllm-openai:cu130-nightly"
LOCK_FILE = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent / "vllm-image.lock.yml"
# The registry fixture this scenario serves (molecule.yml fixture_registry): the real engine's image.
FIXTURE_DIGEST = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], ".cache/fixtures/registry-engine/.digest")


def test_all_four_packages_are_installed_at_the_pinned_version(host):
    for name in TOOLKIT:
        package = host.package(name)
        assert package.is_installed, name
        assert package.version == "1.17.7-1", name


def test_the_packages_come_from_the_signed_repository(host):
    source = host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list").content_string
    assert "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] " in source
    assert "http://127.0.0.1:8470/stable/deb/$(ARCH) /" in source
    assert (
        "BEGIN PGP PUBLIC KEY BLOCK"
        in host.file("/usr/share/keyrings/nvidia-container-toolkit-keyring.asc").content_string
    )
    policy = host.check_output("apt-cache policy nvidia-container-toolkit")
    assert "*** 1.17.7-1" in policy
    assert "http://127.0.0.1:8470/stable/deb/amd64" in policy
    # apt keeps a repository's lists only after its signature verified.
    assert host.run("ls /var/lib/apt/lists/ | grep -q '127.0.0.1:8470.*InRelease'").rc == 0


def test_daemon_json_holds_the_runtime_and_keeps_the_users_key(host):
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert daemon["registry-mirrors"] == ["http://127.0.0.1:5000"]
    assert "default-runtime" not in daemon


def test_docker_lists_the_nvidia_runtime(host):
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes


def test_the_lock_pins_the_registry_digest():
    lock = yaml.safe_load(LOCK_FILE.read_text(encoding="utf-8"))
    entry = lock["images"][VLLM_REF]
    assert entry["digest"] == FIXTURE_DIGEST.read_text(encoding="utf-8").strip()
    assert entry["image_id"].startswith("sha256:")
    assert entry["previous_digest"] is None


def test_the_pinned_image_is_present_with_its_digest(host):
    entry = yaml.safe_load(LOCK_FILE.read_text(encoding="utf-8"))["images"][VLLM_REF]
    image = json.loads(host.check_output(f"docker image inspect vllm/vllm-openai@{entry['digest']}"))[0]
    assert image["Id"] == entry["image_id"]
    assert f"vllm/vllm-openai@{entry['digest']}" in image["RepoDigests"]
