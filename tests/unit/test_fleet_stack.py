"""The same stack on every Spark (module_utils/fleet_stack.py): a pair whose two Sparks differ stops the run naming
both values, a mixed fleet of Sparks that serve alone gets a warning listing each group, a known-bad driver (590.x
on a GB10) is named with its source; /etc/dgx-release gives its last update's release and nothing else."""

from __future__ import annotations

from fleet_stack import dgx_release, host_nccl_problems, judge, pairs

SAME = {"driver": "580.95.05", "kernel": "6.11.0-1016-nvidia", "dgx_os": "7.2.3"}
# A real Spark's file (research for issue 33: each OTA update appends a DGX_OTA_VERSION line), serial redacted.
RELEASE = """DGX_NAME="DGX Spark"
DGX_PRETTY_NAME="NVIDIA DGX Spark"
DGX_SWBUILD_DATE="2025-09-10-13-50-03"
DGX_SWBUILD_VERSION="7.2.3"
DGX_COMMIT_ID="833b4a7"
DGX_PLATFORM="DGX Server for KVM"
DGX_SERIAL_NUMBER="SERIAL-DO-NOT-SHOW"

DGX_OTA_VERSION="7.4.0"
DGX_OTA_DATE="Thu Jan 15 10:00:00 EST 2026"
DGX_OTA_VERSION="7.5.0"
DGX_OTA_DATE="Thu Jun 18 17:40:28 EDT 2026"
"""


def test_the_release_is_the_last_update_else_the_factory_build():
    assert dgx_release(RELEASE) == "7.5.0"
    factory = "\n".join(line for line in RELEASE.splitlines() if "OTA" not in line)
    assert dgx_release(factory) == "7.2.3"
    assert dgx_release("DGX_SWBUILD_VERSION=7.1.0\n") == "7.1.0"  # some OEM units write values unquoted
    assert dgx_release(None) == "none" and dgx_release("") == "unknown"


def test_one_stack_says_nothing():
    assert judge({"a": SAME, "b": SAME, "c": SAME}, {"p": ["a", "b"]}) == ([], [])


def test_a_pair_on_two_drivers_stops_naming_both_and_a_mixed_fleet_is_a_warning():
    stacks = {"a": SAME, "b": {**SAME, "driver": "580.126.09"}, "c": {**SAME, "kernel": "6.14.0-1015-nvidia"}}
    problems, warnings = judge(stacks, {"pair-x": ["a", "b"]})
    assert problems == [
        "pair pair-x: its Sparks run different NVIDIA drivers (580.126.09 on b; 580.95.05 on a); a group serves one "
        "model together, so every Spark of it must run the same NVIDIA driver: bring them to one version"
    ]
    assert warnings == [
        "the fleet runs 2 NVIDIA drivers: 580.126.09 on b; 580.95.05 on a, c",
        "the fleet runs 2 kernels: 6.11.0-1016-nvidia on a, b; 6.14.0-1015-nvidia on c",
    ]
    # Sparks that serve alone may differ: a warning only.
    assert judge(stacks, {})[0] == []


def test_a_590_driver_is_named_with_its_source():
    problems, warnings = judge({"a": {**SAME, "driver": "590.48.01"}}, {})
    assert problems == []
    (warning,) = warnings
    assert warning.startswith("NVIDIA driver 590.48.01 on a: driver 590.x has a CUDA-graph capture deadlock")
    assert "eugr/spark-vllm-docker README" in warning


def test_pairs_come_from_each_hosts_pair_fact():
    pair_of = {"a": {"group": "p1", "rank": 0}, "b": {"group": "p1", "rank": 1}, "c": {}, "d": None}
    assert pairs(pair_of) == {"p1": ["a", "b"]}


IMAGE = "vllm/vllm-openai@sha256:" + "a" * 64


def test_a_pair_on_two_images_stops_naming_the_variable_that_fixes_it():
    moving = "vllm/vllm-openai:v0.33.0 (resolved at the runtime stage)"
    stacks = {"a": {**SAME, "image": IMAGE}, "b": {**SAME, "image": moving}}
    (problem,) = judge(stacks, {"p": ["a", "b"]})[0]
    assert problem.startswith("pair p: its Sparks run different vLLM images (")
    assert IMAGE + " on a" in problem and "set one vllm_image_ref for both" in problem


def test_the_hosts_nccl_differs_without_stopping_a_pair_that_uses_the_images_own():
    """The pair's NCCL is the image's (the digest stands for it); DGX OS's libnccl2 is only reported for now."""
    stacks = {"a": {**SAME, "host_nccl": "2.28.3-1+cuda13.0"}, "b": {**SAME, "host_nccl": "none"}}
    problems, warnings = judge(stacks, {"p": ["a", "b"]})
    assert problems == []
    assert warnings == ["the fleet runs 2 host libnccl2 versions: 2.28.3-1+cuda13.0 on a; none on b"]


def test_a_pair_that_loads_the_hosts_nccl_needs_one_libnccl2_on_both():
    one = {"a": {**SAME, "host_nccl": "2.28.9-1+cuda13.0"}, "b": {**SAME, "host_nccl": "2.28.9-1+cuda13.0"}}
    assert host_nccl_problems(one, "p") == []
    two = {**one, "b": {**SAME, "host_nccl": "2.28.3-1+cuda13.0"}}
    assert host_nccl_problems(two, "p") == [
        "pair p: its Sparks run different host libnccl2 versions (2.28.3-1+cuda13.0 on b; 2.28.9-1+cuda13.0 on a); "
        "bring all of them to one libnccl2 (apt)"
    ]
    assert host_nccl_problems({**one, "b": {**SAME, "host_nccl": "none"}}, "p") == [
        "b has no libnccl2 package (install DGX OS's libnccl2)"
    ]
