"""module_utils/speculative.py: a recipe's speculative block checked against vLLM 0.33.0's SpeculativeConfig
(recipes/vllm-speculative-config.json, generated from the release) and rendered as --speculative-config; the
draft model fetched like the main weights."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT
from memory_plan import build_inputs, plan, summary
from recipe_rules import checked_recipe, load_recipe, serve_args
from speculative import config, draft, load_contract, problems
from vllm_flags import load_flag_list

RECIPES_DIR = ROOT / "recipes"
CONTRACT = load_contract(RECIPES_DIR)
FLAGS = load_flag_list(RECIPES_DIR / "vllm-serve-flags.txt")
DRAFT = {"hf_repo": "RedHatAI/gpt-oss-120b-speculator.eagle3", "hf_revision": "a" * 40}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def test_the_contract_is_the_releases():
    assert CONTRACT["vllm_version"] == "0.33.0"
    assert {"mtp", "eagle3", "draft_model", "ngram", "suffix", "dflash"} <= set(CONTRACT["methods"])
    assert "qwen3_5_mtp" in CONTRACT["mtp_aliases"] and "mtp" not in CONTRACT["mtp_aliases"]
    assert {"num_speculative_tokens", "prompt_lookup_max", "moe_backend", "draft_tensor_parallel_size"} <= set(
        CONTRACT["keys"]
    )
    # The engine's own configs are no user's keys.
    assert "target_model_config" not in CONTRACT["keys"]


@pytest.mark.parametrize(
    "block",
    [
        {"method": "mtp", "num_speculative_tokens": 3, "moe_backend": "triton"},
        NGRAM,
        {"method": "eagle3", "num_speculative_tokens": 3, "draft": DRAFT},
        {"method": "draft_model", "num_speculative_tokens": 4, "draft": DRAFT, "draft_tensor_parallel_size": 1},
    ],
    ids=["mtp", "ngram", "eagle3", "draft-model"],
)
def test_good_blocks_pass(block):
    assert problems(block, CONTRACT, "r.speculative") == []


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ("mtp", "r.speculative: expected a mapping with method, num_speculative_tokens and"),
        ({"num_speculative_tokens": 3}, "r.speculative.method is missing: one of ngram, draft_model,"),
        (
            {"method": "mpt", "num_speculative_tokens": 3},
            "is not a speculative method of vLLM 0.33.0; did you mean 'mtp'?",
        ),
        (
            {"method": "qwen3_5_mtp", "num_speculative_tokens": 3},
            "r.speculative.method='qwen3_5_mtp': vLLM 0.33.0 takes it as a deprecated name of 'mtp': write mtp",
        ),
        ({"method": "custom_class", "num_speculative_tokens": 3}, "not supported, it loads the Python class"),
        ({"method": "mtp"}, "r.speculative.num_speculative_tokens=None: expected a positive integer"),
        ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens=0: expected a positive integer"),
        (
            {"method": "eagle3", "num_speculative_tokens": 3},
            "r.speculative.draft is missing: method 'eagle3' needs a draft model, as {hf_repo, hf_revision}",
        ),
        ({**NGRAM, "draft": DRAFT}, "r.speculative.draft: method 'ngram' uses no draft model; remove it"),
        (
            {"method": "eagle3", "num_speculative_tokens": 3, "draft": {**DRAFT, "hf_revision": "main"}},
            "r.speculative.draft.hf_revision='main': expected a pinned commit of the draft's repository",
        ),
        (
            {"method": "mtp", "num_speculative_tokens": 3, "moe_backen": "triton"},
            "r.speculative.moe_backen: not a key of vLLM 0.33.0's SpeculativeConfig; did you mean 'moe_backend'?",
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 3, "draft": DRAFT, "model": "org/x"},
            "r.speculative.model: set r.speculative.draft.hf_repo instead",
        ),
        ({"method": "mtp", "num_speculative_tokens": 3, "moe_backend": "a\nb"}, "r.speculative.moe_backend="),
        ({"method": "mtp", "num_speculative_tokens": 3, "moe_backend": {"a": 1}}, "expected a value or a list"),
    ],
)
def test_bad_blocks_are_named_with_the_fix(block, expected):
    found = problems(block, CONTRACT, "r.speculative")
    assert any(expected in problem for problem in found), found


def test_a_draft_renders_as_model_and_revision():
    block = {"method": "eagle3", "num_speculative_tokens": 3, "draft": DRAFT, "draft_tensor_parallel_size": 1}
    assert draft(block) == DRAFT
    assert config(block) == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": DRAFT["hf_repo"],
        "revision": DRAFT["hf_revision"],
        "draft_tensor_parallel_size": 1,
    }
    assert draft(NGRAM) is None and config(NGRAM) == NGRAM


def test_a_recipe_with_a_speculative_block_gets_speculative_config():
    recipe, found = checked_recipe("smollm2-135m-instruct", RECIPES_DIR, {"speculative": NGRAM}, FLAGS, "r")
    assert found == []
    args = serve_args(recipe, FLAGS)
    assert args[-2] == "--speculative-config"
    assert json.loads(args[-1]) == NGRAM


def test_speculative_config_in_serve_flags_is_sent_to_the_block():
    overrides = {"serve_flags": {"speculative-config": NGRAM}}
    recipe, found = checked_recipe("smollm2-135m-instruct", RECIPES_DIR, overrides, FLAGS, "r")
    assert recipe is None
    assert found == [
        "r.serve_flags.speculative-config: write it as r.speculative (method, num_speculative_tokens, draft), "
        "which preflight checks against vLLM's SpeculativeConfig and the memory planner counts"
    ]


def test_a_bad_block_stops_the_recipe():
    recipe, found = checked_recipe("smollm2-135m-instruct", RECIPES_DIR, {"speculative": {"method": "x"}}, FLAGS, "r")
    assert recipe is None and any(problem.startswith("r.speculative.method='x'") for problem in found)


def test_the_draft_is_fetched_with_the_model(run_module):
    # An EAGLE-3 head of SmolLM2's attention shape: one layer.
    draft_figures = {"weight_bytes": 20_000_000, "attention_layers": 1, "kv_heads": 3, "head_dim": 64}
    entry = {
        "recipe": "smollm2-135m-instruct",
        "port": 8000,
        "speculative": {
            "method": "eagle3",
            "num_speculative_tokens": 3,
            "draft": {**DRAFT, "architecture": draft_figures},
        },
    }
    result = run_module(
        "vllm_models",
        {
            "models": [entry],
            "recipes_dir": str(RECIPES_DIR),
            "listen_address": "127.0.0.1",
            "data_dir": "/var/lib/sparkfleet",
            "config_dir": "/etc/sparkfleet/vllm",
            "host": "spark-1",
            "memory_total_bytes": 127_601_400 * 1024,
        },
        check_mode=True,
    )
    assert not result.get("failed"), result
    (model,) = result["models"]
    assert result["snapshots"] == [{"hf_repo": model["hf_repo"], "hf_revision": model["hf_revision"]}, DRAFT]
    # The unit runs offline only when both are in the cache (vllm_server looks for each of these folders).
    draft_folder = f"/var/lib/sparkfleet/huggingface/hub/models--{DRAFT['hf_repo'].replace('/', '--')}"
    assert model["snapshots"] == [model["snapshot"], f"{draft_folder}/snapshots/{DRAFT['hf_revision']}"]
    assert (
        json.loads(model["serve_args"][model["serve_args"].index("--speculative-config") + 1])["model"]
        == (DRAFT["hf_repo"])
    )


def test_speculation_off_serves_the_recipe_without_its_block_draft_or_fetch(run_module):
    """vllm_server_speculation false (acceptance.yml's comparison): the same entry resolves without
    --speculative-config, without the draft's snapshot and without the draft in the memory plan."""
    draft_figures = {"weight_bytes": 20_000_000, "attention_layers": 1, "kv_heads": 3, "head_dim": 64}
    entry = {
        "recipe": "smollm2-135m-instruct",
        "port": 8000,
        "speculative": {
            "method": "eagle3",
            "num_speculative_tokens": 3,
            "draft": {**DRAFT, "architecture": draft_figures},
        },
    }
    params = {
        "models": [entry],
        "recipes_dir": str(RECIPES_DIR),
        "listen_address": "127.0.0.1",
        "data_dir": "/var/lib/sparkfleet",
        "config_dir": "/etc/sparkfleet/vllm",
        "host": "spark-1",
        "memory_total_bytes": 127_601_400 * 1024,
    }
    on = run_module("vllm_models", params, check_mode=True)
    off = run_module("vllm_models", {**params, "speculation": False}, check_mode=True)
    assert not on.get("failed") and not off.get("failed"), (on, off)
    (model,) = off["models"]
    assert "--speculative-config" not in model["serve_args"]
    assert "speculative" not in model["settings"]
    assert off["snapshots"] == [{"hf_repo": model["hf_repo"], "hf_revision": model["hf_revision"]}]
    assert model["snapshots"] == [model["snapshot"]]
    # Everything else is the recipe's: the same command line less the block.
    (speculating,) = on["models"]
    at = speculating["serve_args"].index("--speculative-config")
    assert model["serve_args"] == speculating["serve_args"][:at] + speculating["serve_args"][at + 2 :]
    # The plan is made from the settings: the draft's weights and layers are in it only with speculation.
    assert planned(speculating["settings"])[0].draft_weight_bytes == draft_figures["weight_bytes"]
    assert (planned(model["settings"])[0].draft_weight_bytes, planned(model["settings"])[0].draft_attention_layers) == (
        0,
        0,
    )


# --- what the draft costs ---------------------------------------------------------------------------------------

SMOLLM2 = load_recipe("smollm2-135m-instruct", RECIPES_DIR)
SPARK = 127_601_400 * 1024
MTP = {"method": "mtp", "num_speculative_tokens": 3}


def planned(recipe: dict, memory_total_bytes: int = SPARK):
    inputs, found = build_inputs(recipe, memory_total_bytes=memory_total_bytes, name="r")
    return inputs, found


def test_mtp_needs_the_checkpoints_measured_mtp_figures():
    _, found = planned({**SMOLLM2, "speculative": MTP})
    assert found == [
        "r.architecture.mtp_layers and mtp_weight_bytes: MTP loads the checkpoint's MTP layers as its draft, and the "
        "planner counts their weights and KV cache: run library/hf_model_figures at the pinned revision (it reports "
        "mtp_layers and mtp_weight_bytes apart) and copy them into the architecture"
    ]


def test_the_mtp_layer_adds_its_weights_and_one_layer_of_kv_cache():
    architecture = {**SMOLLM2["architecture"], "mtp_layers": 1, "mtp_weight_bytes": 9_000_000}
    inputs, found = planned({**SMOLLM2, "architecture": architecture, "speculative": MTP})
    assert found == []
    alone, _ = planned(SMOLLM2)
    with_draft, without = plan(inputs), plan(alone)
    assert with_draft.weights_bytes == without.weights_bytes + 9_000_000
    # 31 attention layers of SmolLM2's shape instead of 30: one more layer's K and V per token.
    assert with_draft.kv_bytes_per_token == without.kv_bytes_per_token * 31 // 30
    assert with_draft.max_full_length_seqs < without.max_full_length_seqs
    lost = without.max_full_length_seqs - with_draft.max_full_length_seqs
    assert (
        f"speculative decoding (3 tokens): the draft takes 0.0 GiB of weights and 1 attention layer of KV cache, "
        f"{lost:,} {SMOLLM2['max_model_len']:,}-token sequences fewer" in summary(with_draft)
    )


def test_ngram_costs_nothing():
    inputs, found = planned({**SMOLLM2, "speculative": NGRAM})
    alone, _ = planned(SMOLLM2)
    assert found == [] and plan(inputs).max_full_length_seqs == plan(alone).max_full_length_seqs
    assert "speculative decoding" not in summary(plan(inputs))


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (None, "r.speculative.draft.architecture is missing: the planner counts the draft's weights and KV cache"),
        (
            {"weight_bytes": 1e9, "attention_layers": 1, "kv_heads": 8, "head_dim": 64},
            "r.speculative.draft.architecture: 8 KV heads of 64 differ from the model's 3 of 64",
        ),
        (
            {"weight_bytes": 1e9, "attention_layers": 0, "kv_heads": 3, "head_dim": 64},
            "r.speculative.draft.architecture.attention_layers=0: expected a positive integer",
        ),
    ],
)
def test_a_draft_model_needs_figures_of_the_models_attention_shape(figures, expected):
    draft_block = {**DRAFT, **({"architecture": figures} if figures else {})}
    _, found = planned(
        {**SMOLLM2, "speculative": {"method": "eagle3", "num_speculative_tokens": 3, "draft": draft_block}}
    )
    assert any(problem.startswith(expected) for problem in found), found


def test_a_plan_that_fits_only_without_its_draft_says_so():
    # A 10 GiB machine at 0.5: its 5 GiB pool holds SmolLM2 (0.25 GiB), the 2 GiB estimate and the KV cache, but
    # not a 3 GiB draft on top.
    figures = {"weight_bytes": 3 * 2**30, "attention_layers": 1, "kv_heads": 3, "head_dim": 64}
    block = {"method": "eagle3", "num_speculative_tokens": 3, "draft": {**DRAFT, "architecture": figures}}
    recipe = {**SMOLLM2, "gpu_memory_utilization": 0.5, "speculative": block}
    inputs, found = build_inputs(recipe, memory_total_bytes=10 * 2**30, name="r", os_reserve_min_gib=1.0)
    assert found == []
    reasons = plan(inputs).reasons
    assert reasons and "and without it the plan fits (" in reasons[-1], reasons
    assert "or do without speculative decoding: the draft takes 3.0 GiB of weights" in reasons[-1]
    assert reasons[-1].endswith(
        "(drop the entry's speculative block, or set vllm_server_speculation: false for the host)"
    )
