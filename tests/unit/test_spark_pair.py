"""module_utils/spark_pair.py (through its filter, filter_plugins/spark_pair.py): who is a Spark's pair partner."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import ROOT

GROUPS = {"all": ["spark-1", "spark-2", "spark-3"], "pair_a": ["spark-2", "spark-3"], "trio": ["a", "b", "c"]}


def spark_pair_filter():
    """The filter as Ansible loads it (filter_plugins/spark_pair.py), which calls module_utils/spark_pair.py."""
    spec = importlib.util.spec_from_file_location("spark_pair_plugin", ROOT / "filter_plugins" / "spark_pair.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin.FilterModule().filters()["spark_pair"]


def spark_group_problems_filter():
    spec = importlib.util.spec_from_file_location("spark_pair_plugin", ROOT / "filter_plugins" / "spark_pair.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin.FilterModule().filters()["spark_group_problems"]


@pytest.mark.parametrize(
    ("host", "group", "pair"),
    [
        (
            "spark-2",
            "pair_a",
            {
                "group": "pair_a",
                "head": "spark-2",
                "members": ["spark-2", "spark-3"],
                "peers": ["spark-3"],
                "rank": 0,
                "size": 2,
            },
        ),
        (
            "spark-3",
            "pair_a",
            {
                "group": "pair_a",
                "head": "spark-2",
                "members": ["spark-2", "spark-3"],
                "peers": ["spark-2"],
                "rank": 1,
                "size": 2,
            },
        ),
        ("spark-1", "", {}),
        ("spark-1", None, {}),
    ],
)
def test_the_head_is_first_and_each_side_names_the_other(host, group, pair):
    assert spark_pair_filter()(host, group, GROUPS) == pair


def test_a_group_of_more_sparks_ranks_each_by_its_place_and_names_all_the_others():
    spark_pair = spark_pair_filter()
    assert spark_pair("c", "trio", GROUPS) == {
        "group": "trio",
        "head": "a",
        "members": ["a", "b", "c"],
        "peers": ["a", "b"],
        "rank": 2,
        "size": 3,
    }
    eight = {"octet": [f"s{number}" for number in range(8)]}
    assert [spark_pair(host, "octet", eight)["rank"] for host in eight["octet"]] == list(range(8))
    assert spark_pair_filter()("s5", "octet", eight)["peers"] == ["s0", "s1", "s2", "s3", "s4", "s6", "s7"]


def test_a_wrong_group_still_answers_for_validate_to_refuse():
    spark_pair = spark_pair_filter()
    assert spark_pair("spark-1", "no_such_group", GROUPS) == {
        "group": "no_such_group",
        "head": "",
        "members": [],
        "peers": [],
        "rank": 0,
        "size": 0,
    }
    assert spark_pair("spark-1", "pair_a", GROUPS)["rank"] == 0  # not in it: spark_fabric's validate says so


@pytest.mark.parametrize(
    ("host", "group", "groups", "expected"),
    [
        ("a", "", {}, []),
        ("a", "trio", {"trio": ["a", "b", "c"]}, []),
        ("a", "pair", {"pair": ["a", "b"]}, []),
        ("a", "octet", {"octet": ["a", *"bcdefgh"]}, []),
        (
            "a",
            "missing",
            {"trio": ["a", "b", "c"]},
            ['a: spark_fabric_pair_group is "missing", which names no inventory group'],
        ),
        ("a", "pair", {"pair": ["b", "c"]}, ["a: its group pair (spark_fabric_pair_group) does not hold it"]),
        (
            "a",
            "solo",
            {"solo": ["a"]},
            ["a: its group solo holds 1 Spark (a), but a group serves one model on 2 to 8"],
        ),
        (
            "a",
            "nine",
            {"nine": ["a", *"bcdefghi"]},
            ["a: its group nine holds 9 Sparks (a, b, c, d, e, f, g, h, i), but a group serves one model on 2 to 8"],
        ),
    ],
)
def test_group_problems_name_what_is_wrong(host, group, groups, expected):
    assert spark_group_problems_filter()(host, group, groups) == expected


def spark_rollout_filter():
    spec = importlib.util.spec_from_file_location("spark_pair_plugin", ROOT / "filter_plugins" / "spark_pair.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin.FilterModule().filters()["spark_rollout"]


# A fleet of two single Sparks, a group of three through a switch and a pair, as reach.yml publishes it.
FLEET_GROUPS = {"trio": ["t1", "t2", "t3"], "pair": ["p1", "p2"]}
FLEET = ["s1", "t1", "t2", "t3", "p1", "p2", "s2"]


def groups_of(fleet: list[str]) -> dict:
    spark_pair = spark_pair_filter()
    group_of = {host: name for name, members in FLEET_GROUPS.items() for host in members}
    return {host: spark_pair(host, group_of.get(host, ""), FLEET_GROUPS) for host in fleet}


def test_the_rollout_moves_each_group_as_one_batch_of_its_own_size():
    order = spark_rollout_filter()(FLEET, groups_of(FLEET), [], "")
    assert order == {
        "canary": "s1",
        "canary_batch": ["s1"],
        "groups": ["t1", "t2", "t3", "p1", "p2"],
        "group_sizes": [3, 2],
        "singles": ["s2"],
    }


def test_a_canary_in_a_group_takes_its_whole_group_first():
    order = spark_rollout_filter()(FLEET, groups_of(FLEET), [], "t2")
    assert order["canary_batch"] == ["t1", "t2", "t3"]
    assert order["groups"] == ["p1", "p2"] and order["group_sizes"] == [2]
    assert order["singles"] == ["s1", "s2"]


def test_a_group_left_out_is_no_batch_and_without_singles_the_first_group_is_the_canary():
    fleet = ["t1", "t2", "t3", "p1", "p2"]
    # reach leaves out a whole group when one of its Sparks is unreachable
    order = spark_rollout_filter()(fleet, groups_of(fleet), ["t1", "t2", "t3"], "")
    assert order == {"canary": "p1", "canary_batch": ["p1", "p2"], "groups": [], "group_sizes": [], "singles": []}
    order = spark_rollout_filter()(fleet, groups_of(fleet), [], "")
    assert order["canary_batch"] == ["t1", "t2", "t3"] and order["group_sizes"] == [2]
