"""What site.yml left on a simulated Spark after preflight: the GPU module's view, and no change to the host."""

import os
import sys
from pathlib import Path

import testinfra.utils.ansible_runner

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import changed_per_host, run_site, said

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")


def test_spark_gpu_info_reports_the_gb10(host):
    result = host.ansible("spark_gpu_info", check=False)
    assert "msg" not in result, result["msg"]
    assert result["gpu_count"] == 1
    gpu = result["gpus"][0]
    assert gpu["name"] == "NVIDIA GB10"
    assert gpu["compute_capability"] == "12.1"
    assert gpu["driver_version"] == "580.95.05"
    # A GB10 has no dedicated memory: nvidia-smi says [N/A], which the module reports as null.
    assert gpu["memory_total_mib"] is None


def test_spark_gpu_info_reports_the_hosts_unified_memory(host):
    result = host.ansible("spark_gpu_info", check=False)
    meminfo_kib = int(host.check_output("awk '/^MemTotal:/ {print $2}' /proc/meminfo"))
    assert result["memory"]["mem_total_bytes"] == meminfo_kib * 1024
    assert 0 < result["memory"]["mem_available_bytes"] <= result["memory"]["mem_total_bytes"]


def test_spark_gpu_info_refuses_another_compute_capability(host):
    # ansible-core 2.19's --tree output, which testinfra reads, drops the "failed" key, so testinfra does not
    # raise; a spark_gpu_info result carries "msg" only when it failed.
    message = host.ansible("spark_gpu_info", "required_compute_capability=9.0", check=False)["msg"]
    assert "has compute capability 12.1" in message
    assert "expected compute capability 9.0 (sm_90)" in message


def test_preflight_changes_nothing(host):
    # Preflight only reads, even on a host that site.yml has not provisioned yet: the path it checks for space
    # is not created, Docker keeps its configuration.
    host.run("mv /var/lib/sparkfleet /var/lib/sparkfleet.aside")
    try:
        done = run_site(playbook="playbooks/preflight.yml")
        assert done.returncode == 0, said(done)[-2000:]
        assert changed_per_host(done.stdout) == {"simspark-1": 0}
        assert not host.file("/var/lib/sparkfleet").exists
    finally:
        host.run("mv /var/lib/sparkfleet.aside /var/lib/sparkfleet")
    assert host.file("/etc/docker/daemon.json").content_string.count("registry-mirrors") == 1
    assert host.service("docker").is_running
