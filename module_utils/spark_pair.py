"""Who is a Spark's pair partner: the one rule, as a plain function.

Two Sparks linked by ConnectX-7 serve one model together; the inventory puts them in a group of their own, named by
each one's spark_fabric_pair_group, the head first. Every place that asks "who is my partner, which of us is the
head" (playbooks/reach.yml, which publishes the project fact sparkfleet_pair; update.yml's batches; roles/spark_fabric,
which publishes spark_fabric_node for the vLLM units) reads it through the filter `spark_pair`
(filter_plugins/spark_pair.py), which calls pair_of here.
"""

from __future__ import annotations


def pair_of(host: str, pair_group: str, groups: dict[str, list[str]]) -> dict:
    """HOST's pair: {group, head, peer, rank}, or {} for a Spark that serves alone (no pair group).

    The head is the group's first host (node rank 0), the peer the other one. A group that is no pair of two with
    HOST in it still gives an answer (peer "" when there is no other host, rank 0 when HOST is not in it):
    spark_fabric's validate refuses such a group, naming the fix, before anything reads it."""
    if not pair_group:
        return {}
    members = list(groups.get(pair_group) or [])
    others = [member for member in members if member != host]
    return {
        "group": pair_group,
        "head": members[0] if members else "",
        "peer": others[0] if others else "",
        "rank": members.index(host) if host in members else 0,
    }
