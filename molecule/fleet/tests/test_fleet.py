"""A fleet of three simulated Sparks behind a router: one digest everywhere, a tag that moves only when asked
(and then through a rolling update the router's clients never notice), the host's own toolkit left alone, and
bad input that stops the run with every host as it was.

The tests after the first ones run site.yml again themselves (with molecule's inventory and configuration), so
they run in file order and change the fleet's image pin as they go.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testinfra
import testinfra.utils.ansible_runner
import yaml

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from fleet_load import Load
from playbook_runs import changed_per_host, failed_per_host, run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
LOCK_FILE = Path(INVENTORY).parent / "vllm-image.lock.yml"
VLLM_REF = "vllm/vllm-openai:cu130-nightly"
HOSTS = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("sparks")
ROUTER_URL = "http://10.77.0.20:8080"
API_KEY = "sparkfleet-fleet-test-key"


def fleet():
    return [testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}") for name in HOSTS]


def fleet_router():
    return testinfra.get_host(f"ansible://fleet-router?ansible_inventory={INVENTORY}")


def pin() -> dict:
    return yaml.safe_load(LOCK_FILE.read_text(encoding="utf-8"))["images"][VLLM_REF]


def unit_invocation(host) -> str:
    """systemd's InvocationID of the served unit: a new one for each start."""
    return host.check_output("systemctl show vllm-qwen3-0.6b --property=InvocationID --value")


def image_ids(host) -> set[str]:
    return set(host.check_output("docker image ls --no-trunc --quiet vllm/vllm-openai").split())


def test_every_host_holds_the_same_pinned_image():
    entry = pin()
    for host in fleet():
        image = json.loads(host.check_output(f"docker image inspect vllm/vllm-openai@{entry['digest']}"))[0]
        assert image["Id"] == entry["image_id"], host.backend.host


def test_a_host_that_ships_the_toolkit_keeps_it():
    first, second, third = fleet()
    for host in (first, third):
        assert host.package("nvidia-container-toolkit").version == "1.17.7-1"
        assert host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list").exists
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


def test_a_moved_tag_and_an_unreachable_spark_change_nothing_on_the_others(moved_tag):
    # One run, two checks: the tag moved in the registry but nobody asked for an update, and fleet-3 does not
    # answer (paused). The others converge without it and without moving the pin; the run says who was left out.
    old, _ = moved_tag
    before = [image_ids(host) for host in fleet()]
    subprocess.run(["docker", "pause", "fleet-3"], check=True, timeout=60)
    try:
        done = run_site()
    finally:
        subprocess.run(["docker", "unpause", "fleet-3"], check=True, timeout=60)
    out = said(done)
    assert done.returncode != 0, out[-3000:]
    assert "fleet-3 is left out of this run: unreachable" in out
    assert "Left out of this run:" in out and "fleet-3: unreachable" in out
    changed, failed = changed_per_host(done.stdout), failed_per_host(done.stdout)
    assert changed["fleet-1"] == changed["fleet-2"] == changed["fleet-router"] == 0
    assert failed["fleet-1"] == failed["fleet-2"] == failed["fleet-router"] == 0 and failed["fleet-3"] == 1
    assert pin()["digest"] == old
    assert [image_ids(host) for host in fleet()] == before
    # The router keeps the Spark it could not ask: its health check decides, not a partial run.
    registered = json.loads(fleet_router().check_output("cat /etc/sparkfleet/router/workers.json"))
    assert "http://fleet-3:8000" in [worker["url"] for worker in registered]


def test_a_rolling_update_moves_every_host_while_the_router_answers_every_request(moved_tag):
    old, new = moved_tag
    with Load(ROUTER_URL, API_KEY, "qwen3-0.6b") as load:
        time.sleep(2)
        done = run_site("-e", "vllm_image_update=true", playbook="update.yml")
        time.sleep(2)
    assert done.returncode == 0, said(done)[-3000:]
    assert f"moved from {old} to {new}" in said(done)
    # The clients behind the router saw nothing: every request of the whole update was answered in full.
    assert load.failures == [] and load.ok > 50, (load.ok, load.failures[:5])
    # The canary first (fleet-3, the first Spark that serves alone), then the pair: one batch at a time, each out of
    # the router and back before the next.
    out = said(done)
    canary, pairs = out.index("PLAY [Update | Roll the canary first"), out.index("PLAY [Update | Roll the groups")
    assert canary < out.index("Drain | Take the endpoints out of each router", canary) < pairs
    assert "Drain | Take the endpoints out of each router" in out[pairs:]
    entry = pin()
    assert entry["digest"] == new
    assert entry["previous_digest"] == old
    for host in fleet():
        assert host.run(f"docker image inspect vllm/vllm-openai@{new}").rc == 0
        assert host.run(f"docker image inspect vllm/vllm-openai@{old}").rc == 0, "the previous image must stay"
        # The served model moved with the pin: its unit was restarted on the new image and passed the gate.
        assert host.check_output("docker inspect --format '{{.Image}}' vllm-qwen3-0.6b") == entry["image_id"]


@pytest.fixture
def bad_image_under_the_tag():
    """A new image under the tag that starts, answers /health and the smoke request, and answers wrong from its
    third request on: the stand-in's VLLM_STANDIN_FAULT_WRONG_AFTER baked in, a broken build behind a green health
    check. The lock file is put back afterwards in any case (update.yml puts it back itself when the canary fails), so
    that the tests after this one start from the good pin."""
    first = fleet()[0]
    lock_before = LOCK_FILE.read_text(encoding="utf-8")
    first.check_output(
        "printf 'FROM vllm/vllm-openai@%s\\nENV VLLM_STANDIN_FAULT_WRONG_AFTER=2\\n' "
        "| docker build -q -t 127.0.0.1:5000/vllm/vllm-openai:cu130-nightly -",
        pin()["digest"],
    )
    first.check_output("docker push -q 127.0.0.1:5000/vllm/vllm-openai:cu130-nightly")
    # Only the registry keeps the build: a local child image would keep the pin from being removed later (the
    # archive test), and the hosts get the bad image as a user's would, by pulling it.
    first.check_output("docker image rm 127.0.0.1:5000/vllm/vllm-openai:cu130-nightly")
    yield
    LOCK_FILE.write_text(lock_before, encoding="utf-8")


def test_an_image_that_answers_wrong_stops_the_rollout_at_the_canary(bad_image_under_the_tag):
    good = pin()
    pair_before = [unit_invocation(host) for host in fleet()[:2]]
    # The serving stage alone (docs/stages.md), as an image update needs: reach, preflight, the image, the rollout.
    with Load(ROUTER_URL, API_KEY, "qwen3-0.6b") as load:
        time.sleep(2)
        done = run_site("--tags", "serving", "-e", "vllm_image_update=true", playbook="update.yml")
        time.sleep(2)
    out = said(done)
    assert done.returncode != 0, out[-3000:]
    # The canary (sparkfleet_update_canary unset) is the first Spark that serves alone: fleet-3.
    assert "The rolling update stopped at its canary fleet-3:" in out
    assert "qwen3-0.6b failed its quality gate: canary 'What is the capital of France? Answer in one word.'" in out
    assert "No other Spark was touched" in out
    # fleet-3's embedding model moved to the image too (it generates nothing, so the fault never shows in it): it
    # was still held to its own gate after the chat model failed and rolled back, not left serving unchecked.
    assert (
        "The other models this run (re)started passed their gates and serve their new configuration: "
        "vllm-qwen3-embedding-0.6b.service." in out
    )
    assert "PLAY [Update | Roll the groups" not in out
    # The lock pins the good image again (the next run serves it everywhere); fleet-3 is back on it; the pair was
    # never restarted; the router's clients saw nothing.
    assert pin() == good
    assert fleet()[2].check_output("docker inspect --format '{{.Image}}' vllm-qwen3-0.6b") == good["image_id"]
    assert [unit_invocation(host) for host in fleet()[:2]] == pair_before
    assert load.failures == [] and load.ok > 20, (load.ok, load.failures[:5])


def assert_every_host_is_as_it_was(done, message: str, before: dict) -> None:
    assert done.returncode != 0
    assert message in said(done)
    assert set(changed_per_host(done.stdout).values()) <= {0}
    assert fleet_state() == before


def fleet_state() -> dict:
    """What a failed run must leave alone: the lock file, each host's images and daemon.json."""
    return {
        "lock": LOCK_FILE.read_text(encoding="utf-8"),
        "images": [image_ids(host) for host in fleet()],
        "daemon": [host.file("/etc/docker/daemon.json").content_string for host in fleet()],
    }


# Found only when the registry is asked: the serving stage (as an image update runs it, docs/stages.md) gets as far
# as the pull, which a full site.yml reaches after the container runtime's roles. A tag is resolved on one host for
# the whole fleet, a fixed digest is pulled by every host: one case each. (What docker_pull says for an unreachable
# registry: tests/integration/test_docker_pull_registry.py; in the role it fails where an unknown tag does.)
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "vllm_image_ref=vllm/vllm-openai:no-such-tag", "-e", "vllm_image_update=true"], "no-such-tag"),
        (["-e", "vllm_image_ref=vllm/vllm-openai@sha256:" + "0" * 64], "sha256:" + "0" * 64),
    ],
    ids=["unknown-tag", "unknown-digest"],
)
def test_an_image_the_registry_cannot_give_fails_clearly_and_leaves_every_host_as_it_was(extra, message):
    before = fleet_state()
    assert_every_host_is_as_it_was(run_site("--tags", "serving", *extra), message, before)


# Found from the inventory and the hosts' facts alone: playbooks/preflight.yml stops them before any role runs.
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "vllm_image_ref=vllm/vllm-openai"], "vllm_image_ref must be repository:tag"),
        (
            ["-e", "vllm_server_listen_address=0.0.0.0", "-e", "vllm_server_api_key="],
            "vllm_server_listen_address is 0.0.0.0, which other machines can reach: set vllm_server_api_key",
        ),
        (
            ["-e", json.dumps({"vllm_server_models": [{"recipe": "nemotron-3-super-120b-a12b-nvfp4", "port": 8000}]})],
            "the weights (74.8 GiB) plus overhead (2.0 GiB) need 76.8 GiB",
        ),
        (
            # Four Sparks' worth (tensor x pipeline parallel) on the pair's group of two.
            [
                "-e",
                json.dumps(
                    {
                        "vllm_server_models": [
                            {
                                "recipe": "qwen3-0.6b",
                                "port": 8000,
                                "tensor_parallel_size": 2,
                                "pipeline_parallel_size": 2,
                            }
                        ]
                    }
                ),
            ],
            "its group fleet_pair holds 2 Sparks: give the model tensor_parallel_size x pipeline_parallel_size = 2, "
            "or serve it on a group of 4.",
        ),
    ],
    ids=["no-tag", "open-endpoint-without-key", "model-too-big", "model-for-a-group-of-four-on-a-pair"],
)
def test_bad_input_stops_in_preflight_with_every_host_as_it_was(extra, message):
    before = fleet_state()
    assert_every_host_is_as_it_was(run_site(*extra, playbook="playbooks/preflight.yml"), message, before)


def test_an_archive_from_the_controller_replaces_a_missing_image_and_prune_keeps_the_pin_and_the_one_before(
    tmp_path,
):
    # One run, two checks. Air-gapped path: a `docker save` archive on the controller; fleet-1 loses its image and
    # loads it back from the copy (vllm_image_archive_path, an archive already on the host, is the same load: the
    # next test). Prune: after the update the fleet holds the pin and the one before it (the rollback); an image of
    # the same repository that no pin names (a leftover of a hand-run pull) is what prune removes, without any
    # update. The role prunes after it loads (roles/vllm_image/tasks/main.yml), so both meet in one run as in two.
    entry = pin()
    first = fleet()[0]
    for host in fleet():
        host.check_output(f"docker save -o /var/tmp/vllm.tar vllm/vllm-openai@{entry['digest']}")
        # The leftover is built on the image before the pin, through a name outside the repository: fleet-1's pin
        # is removed below, and Docker keeps an image that another is built on.
        host.check_output(
            "docker tag vllm/vllm-openai@%s sparkfleet-test/leftover-base && printf 'FROM sparkfleet-test/leftover-base"
            "\\nLABEL sparkfleet.test=leftover\\n' | docker build -q -t vllm/vllm-openai:leftover -",
            entry["previous_digest"],
        )
    archive = tmp_path / "vllm.tar"
    subprocess.run(["docker", "cp", "fleet-1:/var/tmp/vllm.tar", str(archive)], check=True, timeout=300)
    # Docker keeps an image a running container uses: the served model stops first, site.yml starts it again.
    first.check_output("systemctl stop vllm-qwen3-0.6b")
    first.check_output(f"docker image rm -f {entry['image_id']}")
    lock_before = LOCK_FILE.read_text(encoding="utf-8")
    # The pair's worker leaves with its head (vLLM's multi-node mode; test_pair.py) and systemd restarts it:
    # fleet-3's unit is the one that must not move.
    single_before = unit_invocation(fleet()[2])
    done = run_site("-e", f"vllm_image_archive_src={archive}", "-e", "vllm_image_prune=true")
    assert done.returncode == 0, said(done)[-3000:]
    changed = changed_per_host(done.stdout)
    # fleet-3 and the router held the image: the archive was copied to the Sparks (0600) but loaded on fleet-1 only,
    # and no other unit was restarted by the run.
    assert changed["fleet-1"] > 0 and changed["fleet-router"] == 0
    assert unit_invocation(fleet()[2]) == single_before
    assert entry["image_id"] in first.check_output("docker image ls --no-trunc --quiet")
    assert LOCK_FILE.read_text(encoding="utf-8") == lock_before
    assert first.service("vllm-qwen3-0.6b").is_running
    assert pin() == entry
    for host in fleet():
        assert host.run("docker image inspect vllm/vllm-openai:leftover").rc != 0, host.backend.host
        assert host.run(f"docker image inspect vllm/vllm-openai@{entry['previous_digest']}").rc == 0
        # By ID: fleet-1 loaded the pin from an archive, which keeps no RepoDigests.
        assert host.run(f"docker image inspect {entry['image_id']}").rc == 0


def test_an_archive_that_differs_from_the_pin_is_refused_before_loading():
    entry = pin()
    # The image the tag pointed at before the update: a real image, but not the pinned one.
    for host in fleet():
        host.check_output(f"docker save -o /var/tmp/other.tar vllm/vllm-openai@{entry['previous_digest']}")
    images_before = [image_ids(host) for host in fleet()]
    # The serving stage loads the image before it starts anything (the image role runs first in it).
    done = run_site("--tags", "serving", "-e", "vllm_image_archive_path=/var/tmp/other.tar")
    assert done.returncode != 0
    assert f"pins {VLLM_REF} to {entry['image_id']}" in said(done)
    assert [image_ids(host) for host in fleet()] == images_before
