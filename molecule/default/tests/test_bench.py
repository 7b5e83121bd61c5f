"""The simulated-Spark bench itself: fixtures later roles rely on answer as the real services would."""

import json
import os

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

VLLM_IMAGE = "vllm/vllm-openai:cu130-nightly"


def test_systemd_is_pid_1_and_healthy(host):
    assert host.check_output("ps -o comm= -p 1") == "systemd"
    assert host.check_output("systemctl is-system-running") == "running"


def test_fixture_apt_repository_is_served_on_loopback(host):
    key = host.check_output("curl -fsS http://127.0.0.1:8470/gpgkey")
    assert "BEGIN PGP PUBLIC KEY BLOCK" in key
    arch = host.check_output("dpkg --print-architecture")
    release = host.check_output(f"curl -fsS http://127.0.0.1:8470/stable/deb/{arch}/InRelease")
    assert "BEGIN PGP SIGNED MESSAGE" in release


def test_fixture_registry_mirrors_the_vllm_image(host):
    catalog = json.loads(host.check_output("curl -fsS http://127.0.0.1:5000/v2/_catalog"))
    assert "vllm/vllm-openai" in catalog["repositories"]
    # Pulled by its real name: dockerd asks the mirror first.
    host.run_expect([0], f"docker pull -q {VLLM_IMAGE}")
    refused = host.run(f"docker run --rm {VLLM_IMAGE} some/model --no-such-flag")
    assert refused.rc == 2
    assert "--no-such-flag" in refused.stderr
