"""Fan-out of the weights across the fleet: fleet-1 (model_weights_origin) alone fetches from the Hub; fleet-2
copies from it over the containers' network and verifies against fleet-1's manifest. Each byte crosses the Hub
once, both hosts hold the same files at the same path, and nothing is left listening afterwards. fleet-3's
speculative draft model travels the same way: fetched by the origin, copied and verified on fleet-3 alone, and
fleet-3's unit starts offline with both snapshots in its cache.

Runs after test_fleet.py (file order), whose reruns of site.yml must not have moved a byte either.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import testinfra
import testinfra.utils.ansible_runner

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from hub_fixture import FixtureRepo, hub_stats, recipe_repo
from playbook_runs import changed_per_host, run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
# The fleet serves the stand-in vLLM's qwen3-0.6b, whose fixture repo has two shards.
QWEN = recipe_repo("qwen3-0.6b")
SHARD = "model-00001-of-00002.safetensors"


def host_named(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


ORIGIN, PEER, SPECULATING = host_named("fleet-1"), host_named("fleet-2"), host_named("fleet-3")
# fleet-3's draft model, as its inventory pins it (molecule.yml).
_DRAFT = SPECULATING.ansible.get_variables()["vllm_server_models"][0]["speculative"]["draft"]
DRAFT = FixtureRepo(_DRAFT["hf_repo"], _DRAFT["hf_revision"])


def test_only_the_origin_fetched_from_the_hub_and_each_byte_once():
    served = hub_stats(ORIGIN)["bytes_served_total"]
    # The goal of issue 5: bytes the origin served / model size <= 1.05; with nothing lost on the way it is 1.
    # The model and fleet-3's draft, each once.
    assert served == QWEN.files_bytes() + DRAFT.files_bytes()
    assert hub_stats(PEER)["bytes_served_total"] == hub_stats(SPECULATING)["bytes_served_total"] == 0


def test_the_draft_model_was_fanned_out_verified_to_the_spark_that_speculates_only():
    expected = DRAFT.files_sha256()
    assert DRAFT.snapshot_sha256(ORIGIN) == DRAFT.snapshot_sha256(SPECULATING) == expected
    marker = json.loads(SPECULATING.file(DRAFT.marker).content_string)
    assert marker["commit"] == DRAFT.revision and marker["verify"] == "full"
    assert not PEER.file(DRAFT.repo_folder).exists


def test_the_speculating_unit_started_offline_with_the_draft_from_the_cache():
    """HF_HUB_OFFLINE=1 in the unit; the stand-in, like vLLM, then loads the draft named in --speculative-config
    from the cache or does not start at all. It serves, and counts its drafts."""
    unit = SPECULATING.file("/etc/systemd/system/vllm-qwen3-0.6b.service").content_string
    assert "HF_HUB_OFFLINE=1" in unit
    command = SPECULATING.check_output("docker inspect --format '{{json .Args}}' vllm-qwen3-0.6b")
    args = json.loads(command)
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert (config["method"], config["model"], config["revision"]) == ("draft_model", DRAFT.repo, DRAFT.revision)
    assert SPECULATING.service("vllm-qwen3-0.6b.service").is_running
    metrics = SPECULATING.check_output("curl -fsS http://127.0.0.1:8000/metrics")
    drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].split()[-1]) > 0, drafts


def test_both_hosts_hold_the_hubs_bytes_at_the_same_path():
    expected = QWEN.files_sha256()
    assert QWEN.snapshot_sha256(ORIGIN) == expected
    assert QWEN.snapshot_sha256(PEER) == expected


def test_the_peer_verified_what_it_received():
    marker = json.loads(PEER.file(QWEN.marker).content_string)
    assert marker["commit"] == QWEN.revision and marker["verify"] == "full"
    assert marker["files"] == json.loads(ORIGIN.file(QWEN.marker).content_string)["files"]


def test_nothing_is_left_listening_or_lying_around_after_the_copy():
    assert not ORIGIN.socket("tcp://0.0.0.0:8873").is_listening
    assert ORIGIN.run("systemctl is-active sparkfleet-weights-share").stdout.strip() != "active"
    for host in (ORIGIN, PEER):
        assert not host.file("/etc/sparkfleet/weights-share/rsyncd.secrets").exists
        assert not host.file("/etc/sparkfleet/weights-share/password").exists


def test_a_damaged_copy_on_the_peer_is_copied_again_and_the_hub_is_not_asked():
    hub_bytes = hub_stats(ORIGIN)["bytes_served_total"]
    # Bit rot: one byte changed, size and modification time kept, so rsync's quick check sees nothing; the
    # verification must find it, remove it, and the second copy must bring it back.
    blob = PEER.check_output(f"readlink -f {QWEN.snapshot}/{SHARD}")
    PEER.check_output(
        "python3 -c \"import os, sys; p = sys.argv[1]; s = os.stat(p); f = open(p, 'r+b'); f.seek(4096); "
        "b = f.read(1); f.seek(4096); f.write(bytes([b[0] ^ 0xFF])); f.close(); "
        f'os.utime(p, ns=(s.st_atime_ns, s.st_mtime_ns))" {blob}'
    )
    PEER.check_output(f"rm {QWEN.marker}")

    # The weights stage alone (docs/stages.md): reach, preflight and model_weights, as an owner repairs a copy.
    repaired = run_site("--tags", "weights")
    output = said(repaired)
    assert repaired.returncode == 0, output[-3000:]
    # Copied twice: the first copy moved nothing, its verification failed and removed the damaged shard, and the
    # second copy sent the shard again (rsync listed it: changed).
    assert output.count("Copy | Receive the snapshot over rsync]") == 1
    second_copy = r"Copy \| Receive the files that failed verification once more\] \*+ (?:skipping: \[\S+\] )*changed: "
    assert re.search(second_copy, output), output[-3000:]
    assert QWEN.snapshot_sha256(PEER) == QWEN.files_sha256()
    assert hub_stats(ORIGIN)["bytes_served_total"] == hub_bytes
    # Only the origin (its share) and the peer (its copy) had anything to do.
    changed = changed_per_host(repaired.stdout)
    assert changed["fleet-3"] == changed["fleet-router"] == 0
