"""The memory planner against vLLM 0.33.0's own KV cache plan (tests/contracts/vllm/kv-cache-plans.json).

The contract holds, for every recipe and for test shapes of each attention kind (dense GQA, sliding window, dense
MLA, Mamba-2 and Gated DeltaNet hybrids, tensor parallel), with and without prefix caching and speculative tokens,
what vLLM's real spec classes and planning functions answer: block size, page, groups, blocks and bytes per
max_model_len request, and for budgets on both sides of the admission edge whether one sequence is admitted, the
blocks, the concurrency and the KV cache size vLLM logs. tests/contracts/vllm/kv_cache_plans.py writes it from the
release (regenerate.sh); CI only reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from memory_plan import PlanInputs, batching, groups, speculative_tokens
from recipe_rules import resolved_kv_cache_dtype

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = json.loads((ROOT / "tests/contracts/vllm/kv-cache-plans.json").read_text())
PLANS = CONTRACT["plans"]
RECIPE_KEYS = ("tensor_parallel_size", "max_model_len", "kv_cache_dtype", "serve_flags", "architecture")


def plan_id(entry: dict) -> str:
    return f"{entry['case']['name']}-pc{int(entry['prefix_caching'])}-spec{entry['speculative_tokens']}"


def inputs_for(entry: dict) -> PlanInputs:
    """The planner's inputs for one contract case (only the KV figures matter; the rest is filler)."""
    case = entry["case"]
    architecture = case["architecture"]
    flags = dict(case.get("serve_flags") or {})
    speculative = {"method": "mtp", "num_speculative_tokens": entry["speculative_tokens"]}
    flags["enable-prefix-caching"] = entry["prefix_caching"]
    batched, batches = batching({"serve_flags": flags})
    kv_cache_dtype = case.get("kv_cache_dtype") or "auto"
    return PlanInputs(
        name=case["name"],
        memory_total_bytes=128 * 2**30,
        gpu_memory_utilization=0.5,
        max_model_len=case["max_model_len"],
        max_num_seqs=1,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_dtype_resolved=resolved_kv_cache_dtype({"kv_cache_dtype": kv_cache_dtype, **case}),
        tensor_parallel_size=case.get("tensor_parallel_size") or 1,
        weight_bytes=1.0,
        attention_layers=architecture["attention_layers"],
        kv_heads=architecture["kv_heads"],
        head_dim=architecture["head_dim"],
        active_params_b=1.0,
        bytes_per_param=1.0,
        max_context=case["max_model_len"],
        attention_kind=architecture.get("attention_kind") or "full",
        full_attention_layers=architecture.get("full_attention_layers"),
        full_attention_kv_heads=architecture.get("full_attention_kv_heads"),
        full_attention_head_dim=architecture.get("full_attention_head_dim"),
        sliding_window=architecture.get("sliding_window"),
        sliding_window_layers=architecture.get("sliding_window_layers") or 0,
        dtype=architecture["dtype"],
        mamba_kind=architecture.get("mamba_kind"),
        mamba_layers=architecture.get("mamba_layers") or 0,
        mamba_dims=architecture.get("mamba_dims"),
        max_num_batched_tokens=batched,
        concurrent_batches=batches,
        prefix_caching=entry["prefix_caching"],
        speculative_tokens=speculative_tokens({"speculative": speculative}),
    )


def test_the_contract_covers_every_attention_kind_and_every_recipe():
    kinds = {group["kind"] for entry in PLANS for group in entry["vllm"]["groups"]}
    assert kinds == {"full", "sliding", "mla", "mamba"}
    assert {entry["vllm"]["mamba_cache_mode"] for entry in PLANS} == {None, "align", "none"}
    recipes = {path.stem for path in (ROOT / "recipes").glob("*.yml")}
    assert {entry["case"]["recipe"] for entry in PLANS if entry["case"]["recipe"]} == recipes


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yml")), ids=lambda path: path.stem)
def test_the_contract_was_generated_from_the_recipes_as_they_are(path: Path):
    recipe = yaml.safe_load(path.read_text())
    recorded = next(entry["case"] for entry in PLANS if entry["case"]["recipe"] == recipe["name"])
    for key in RECIPE_KEYS:
        assert recorded.get(key) == recipe.get(key), (
            f"{path.name}: {key} changed since the contract was written; run "
            "`bash tests/contracts/vllm/regenerate.sh 0.33.0`"
        )


@pytest.mark.parametrize("entry", PLANS, ids=plan_id)
def test_pages_and_blocks_per_request_are_vllms(entry: dict):
    found, expected = groups(inputs_for(entry)), entry["vllm"]
    assert found.block_size == expected["block_size"]
    # vLLM's pages before unifying (Gemma 4 has two sizes), and the common page the groups then share.
    kinds_present = [kind for kind, _ in found.groups if kind in ("full", "sliding")]
    raw = {found.block_size * found.layers.bytes_per_token(kind) for kind in kinds_present}
    assert sorted(raw) == expected["page_bytes"] or found.layers.hybrid or found.layers.mla
    assert found.page_bytes == max(expected["page_bytes"])
    assert found.bytes_per_block == expected["bytes_per_block"]
    assert found.blocks_per_request == expected["blocks_per_request"]
    assert found.bytes_per_sequence == pytest.approx(expected["bytes_per_sequence"], rel=1e-3)
    assert found.layers.mamba_state_bytes == expected["mamba_state_bytes"]
    kinds = [(group["kind"], group["layers"]) for group in expected["groups"]]
    assert sum(number for _, number in found.groups) == len(kinds)
    assert max(layers for _, layers in kinds) == found.slots_per_group


@pytest.mark.parametrize("entry", PLANS, ids=plan_id)
def test_sequences_held_on_a_budget_are_vllms(entry: dict):
    found = groups(inputs_for(entry))
    for row in entry["vllm"]["budgets"]:
        budget = row["kv_budget_bytes"]
        assert found.admits_one_sequence(budget) == row["admits_one_sequence"], budget
        if not row["admits_one_sequence"]:
            assert found.sequences_held(budget) == 0
            continue
        held = (row["num_blocks"] - 1) // entry["vllm"]["blocks_per_request"]  # all but vLLM's null block
        assert found.num_blocks(budget) == row["num_blocks"]
        assert found.sequences_held(budget) == held >= 1
        assert round(found.max_concurrency(budget), 6) == row["max_concurrency"]
        assert found.kv_cache_size_tokens(budget) == row["kv_cache_size_tokens"]


def old_rule_bytes_per_sequence(entry: dict) -> int:
    """What the planner counted before vLLM's page rules: 16-token blocks of full attention plus one unpadded
    Mamba state per layer (kept here to show that the contract tells the rules apart)."""
    found = groups(inputs_for(entry))
    layers = found.layers
    tokens = -(-entry["case"]["max_model_len"] // 16) * 16
    return layers.full_attention_layers * layers.attention_bytes_per_token * tokens + layers.mamba_layers * (
        layers.mamba_state_bytes
    )


def test_the_old_mamba_rule_under_counts_what_vllm_holds():
    nano = next(
        entry
        for entry in PLANS
        if entry["case"]["recipe"] == "nemotron-3-nano-30b-a3b-fp8"
        and entry["prefix_caching"]
        and not entry["speculative_tokens"]
    )
    vllm_bytes = nano["vllm"]["bytes_per_sequence"]
    assert old_rule_bytes_per_sequence(nano) < vllm_bytes * 0.92  # the "about 11 % more per long sequence"
    assert nano["vllm"]["block_size"] > 1000  # a hybrid's block is raised until a page holds a Mamba state
    assert groups(inputs_for(nano)).bytes_per_sequence == vllm_bytes


SPARK_MEM_TOTAL = 127_601_400 * 1024  # a DGX Spark's MemTotal (121.7 GiB)
CATALOG_ROW = re.compile(r"^\| `(?P<recipe>[^`]+)`[^|]*\|[^|]*\|[^|]*\|[^|]*\| (?P<planned>[^|]+) \|", re.MULTILINE)


def test_the_catalog_table_shows_each_recipes_plan():
    from memory_plan import build_inputs, plan

    rows = {match["recipe"]: match["planned"] for match in CATALOG_ROW.finditer((ROOT / "docs/recipes.md").read_text())}
    assert set(rows) == {path.stem for path in (ROOT / "recipes").glob("*.yml")}
    for name, planned in rows.items():
        recipe = yaml.safe_load((ROOT / "recipes" / f"{name}.yml").read_text())
        inputs, problems = build_inputs(recipe, memory_total_bytes=SPARK_MEM_TOTAL, name=name)
        assert not problems
        found = plan(inputs)
        assert planned == (
            f"{found.max_full_length_seqs:,} x {inputs.max_model_len:,} tokens, "
            f"{found.kv_bytes_per_sequence / 2**30:,.2f} GiB each (block {found.groups.block_size:,})"
        ), f"docs/recipes.md row {name}"
