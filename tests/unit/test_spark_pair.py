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


@pytest.mark.parametrize(
    ("host", "group", "pair"),
    [
        ("spark-2", "pair_a", {"group": "pair_a", "head": "spark-2", "peer": "spark-3", "rank": 0}),
        ("spark-3", "pair_a", {"group": "pair_a", "head": "spark-2", "peer": "spark-2", "rank": 1}),
        ("spark-1", "", {}),
        ("spark-1", None, {}),
    ],
)
def test_the_head_is_first_and_each_side_names_the_other(host, group, pair):
    assert spark_pair_filter()(host, group, GROUPS) == pair


def test_a_group_that_is_no_pair_still_answers_for_validate_to_refuse():
    spark_pair = spark_pair_filter()
    assert spark_pair("spark-1", "no_such_group", GROUPS) == {
        "group": "no_such_group",
        "head": "",
        "peer": "",
        "rank": 0,
    }
    assert spark_pair("spark-1", "pair_a", GROUPS)["rank"] == 0  # not in it: spark_fabric's validate says so
    assert spark_pair("b", "trio", GROUPS) == {"group": "trio", "head": "a", "peer": "a", "rank": 1}
