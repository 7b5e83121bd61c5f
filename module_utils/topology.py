"""Topology advice: a model served by a group of Sparks that one Spark could hold alone.

The group is then a choice, not a need, and which choice is right depends on the load: a group splits each token's
work (faster single streams, tensor parallelism), while the same Sparks serving alone behind the router each take
their own requests (more streams at once). For gpt-oss-120b on two Sparks the published measurement has the
group ahead up to 32 concurrent streams and two solo Sparks ahead from 64 (a recipe's `published_topology`). The
advice says which the plan chose, that the other exists, and the published figures where a source has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ansible.module_utils.memory_plan import build_inputs, nodes, safe_utilization_holding


def advice(label: str, recipe: Mapping, *, memory_total_bytes: int, settings: Mapping) -> str | None:
    """The note for a model on a group that one Spark holds at the same context (None otherwise)."""
    inputs, problems = build_inputs(recipe, memory_total_bytes=memory_total_bytes, name=label, **settings)
    if problems or inputs is None or nodes(inputs) == 1:
        return None
    alone = replace(inputs, tensor_parallel_size=1, pipeline_parallel_size=1)
    utilization = safe_utilization_holding(alone, inputs.max_model_len)
    if utilization is None:
        return None
    size = nodes(inputs)
    note = (
        f"{label}: {recipe.get('name')} runs on a group of {size} Sparks, but one Spark holds it alone "
        f"(gpu_memory_utilization {utilization:.2f} for a {inputs.max_model_len:,}-token sequence): the group decodes "
        f"each stream faster, while {size} Sparks serving alone behind the router (tensor_parallel_size 1 on each) "
        "serve more streams at once"
    )
    return note + "; " + _published(recipe.get("published_topology"), size)


def _published(published: object, size: int) -> str:
    if not isinstance(published, Mapping) or published.get("sparks") != size or not published.get("rows"):
        return "no published comparison for this model: measure both with bench.yml before you choose"
    rows = "; ".join(
        f"{row['concurrency']} streams: group {row['group_tok_s']:g}, solo Sparks {row['solo_tok_s']:g} tok/s"
        for row in published["rows"]
    )
    return f"published decode throughput ({published['measured']}; {published['source']}): {rows}"
