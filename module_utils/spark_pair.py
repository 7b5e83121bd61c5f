"""Who serves a model together with a Spark: the one rule, as a plain function.

Two to eight Sparks linked by ConnectX-7 (a pair by one cable, or more through a switch) serve one model together;
the inventory puts them in a group of their own, named by each one's spark_fabric_pair_group, the head first. Every
place that asks "who are the others of my group, which of us is the head" (playbooks/reach.yml, which publishes the
project fact sparkfleet_pair; update.yml's batches; roles/spark_fabric, which publishes spark_fabric_node for the
vLLM units) reads it through the filter `spark_pair` (filter_plugins/spark_pair.py), which calls pair_of here.
"""

from __future__ import annotations

# The fewest and the most Sparks of one group: NVIDIA's multi-Spark setup script takes 2 to 4 through a switch, and
# community clusters run 8 (module_utils/parallel_layout.py checks a model's TP x PP against the same bounds).
SMALLEST_GROUP = 2
MAX_GROUP = 8


def pair_of(host: str, pair_group: str, groups: dict[str, list[str]]) -> dict:
    """HOST's group: {group, head, members, peers, rank, size}, or {} for a Spark that serves alone (no group).

    The head is the group's first host (node rank 0), each other member's rank its place in the group; peers are the
    members other than HOST, in the group's order. A group that does not hold HOST, or holds too few, still gives an
    answer (rank 0 when HOST is not in it): spark_fabric's validate refuses such a group, naming the fix, before
    anything reads it."""
    if not pair_group:
        return {}
    members = list(dict.fromkeys(groups.get(pair_group) or []))
    return {
        "group": pair_group,
        "head": members[0] if members else "",
        "members": members,
        "peers": [member for member in members if member != host],
        "rank": members.index(host) if host in members else 0,
        "size": len(members),
    }


def group_problems(host: str, pair_group: str, groups: dict[str, list[str]]) -> list[str]:
    """What is wrong with HOST's group as the inventory describes it, one message each naming the fix ([] alone)."""
    if not pair_group:
        return []
    if pair_group not in groups:
        return [f'{host}: spark_fabric_pair_group is "{pair_group}", which names no inventory group']
    members = list(groups.get(pair_group) or [])
    found = []
    if host not in members:
        found.append(f"{host}: its group {pair_group} (spark_fabric_pair_group) does not hold it")
    count = len(set(members))
    if not SMALLEST_GROUP <= count <= MAX_GROUP:
        found.append(
            f"{host}: its group {pair_group} holds {count} Spark{'' if count == 1 else 's'} "
            f"({', '.join(members) or 'none'}), but a group serves one model on {SMALLEST_GROUP} to {MAX_GROUP}"
        )
    return found


def rollout(sparks: list[str], groups_of: dict[str, dict], left_out: list[str], canary: str = "") -> dict:
    """update.yml's order of the Sparks SPARKS (each one's group from GROUPS_OF, pair_of's answer; LEFT_OUT: those the
    run does not reach): {canary, canary_batch, groups, group_sizes, singles}.

    The canary is CANARY, else the first single Spark reached (the cheapest batch to lose), else the first Spark
    reached; its batch is its whole group. Then every other group, each one batch of its own size, head first (its
    play's serial is group_sizes); then the single Sparks. A group with a Spark left out is no batch: reach leaves out
    all of it, since its Sparks only serve together."""
    members_of: dict[str, list[str]] = {}
    for host in sparks:
        group = (groups_of.get(host) or {}).get("group")
        if group:
            members_of.setdefault(group, list((groups_of.get(host) or {}).get("members") or []))
    grouped = {member for members in members_of.values() for member in members}
    reached = [host for host in sparks if host not in left_out]
    canary = canary or next(iter([host for host in reached if host not in grouped] + reached), "")
    canary_group = (groups_of.get(canary) or {}).get("group", "")
    canary_batch = members_of.get(canary_group, [canary]) if canary_group else [canary]
    batches = [
        members for group, members in members_of.items() if group != canary_group and not set(members) & set(left_out)
    ]
    return {
        "canary": canary,
        "canary_batch": canary_batch,
        "groups": [host for members in batches for host in members],
        "group_sizes": [len(members) for members in batches],
        "singles": [host for host in reached if host not in grouped and host not in canary_batch],
    }
