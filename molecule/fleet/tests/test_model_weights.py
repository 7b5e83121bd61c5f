"""Fan-out of the weights across the fleet: fleet-1 (model_weights_origin) alone fetches from the Hub; fleet-2
copies from it over the containers' network and verifies against fleet-1's manifest. Each byte crosses the Hub
once, both hosts hold the same files at the same path, and nothing is left listening afterwards.

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
from hub_fixture import FixtureModel, hub_stats
from playbook_runs import changed_per_host, run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
# The fleet serves the stand-in vLLM's qwen3-0.6b, whose fixture repo has two shards.
QWEN = FixtureModel("qwen3-0.6b")
SHARD = "model-00001-of-00002.safetensors"


def host_named(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


ORIGIN, PEER = host_named("fleet-1"), host_named("fleet-2")


def test_only_the_origin_fetched_from_the_hub_and_each_byte_once():
    served = hub_stats(ORIGIN)["bytes_served_total"]
    # The goal of issue 5: bytes the origin served / model size <= 1.05; with nothing lost on the way it is 1.
    assert served / QWEN.files_bytes() <= 1.05
    assert served == QWEN.files_bytes()
    assert hub_stats(PEER)["bytes_served_total"] == 0


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

    repaired = run_site()
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
