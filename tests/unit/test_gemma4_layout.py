"""Gemma 4's attention in the figures module and the planner: sliding and full layers of different heads (the full
layers' global_head_dim and, with attention_k_eq_v, num_global_key_value_heads; vLLM 0.33 models/gemma4.py reads
them through transformers' per_layer_config), and the last num_kv_shared_layers layers without a cache of their own.
The planner's pages for such a model are held to vLLM's own planner in test_memory_plan_contract.py."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT
from memory_plan import build_inputs, plan
from model_config_figures import FiguresError, attention_layout, kv_bytes_per_token, sliding_window_kv_bytes_per_token

SPARK_MEM_TOTAL = 127_601_400 * 1024


def pattern(layers: int, every: int) -> list[str]:
    """Gemma's layer_types: every EVERY-th layer global, the rest sliding (Gemma4TextConfig's default rule)."""
    return ["full_attention" if (index + 1) % every == 0 else "sliding_attention" for index in range(layers)]


def gemma4_26b_a4b() -> dict:
    """The 26B-A4B's text config as its GGUF metadata describes it (recipes/gemma-4-26b-a4b.yml names the source)."""
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text",
            "num_hidden_layers": 30,
            "layer_types": pattern(30, 6),
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "global_head_dim": 512,
            "attention_k_eq_v": True,
            "num_global_key_value_heads": 2,
            "num_kv_shared_layers": 0,
            "sliding_window": 1024,
            "max_position_embeddings": 262144,
        },
    }


def test_the_global_layers_have_their_own_heads():
    layout = attention_layout(gemma4_26b_a4b())
    assert (layout.full_attention_layers, layout.sliding_window_layers, layout.sliding_window) == (5, 25, 1024)
    assert (layout.kv_heads, layout.head_dim) == (8, 256)
    assert (layout.full_attention_kv_heads, layout.full_attention_head_dim) == (2, 512)
    # K and V, bfloat16: the 5 global layers 2 x 2 x 512 x 2 B each, the 25 sliding 8 x 2 x 256 x 2 B each.
    assert kv_bytes_per_token(layout, "bfloat16") == 5 * 4096
    assert sliding_window_kv_bytes_per_token(layout, "bfloat16") == 25 * 8192
    assert layout.sources["full_attention_kv_heads"].startswith("config.json:text_config.num_global_key_value_heads")


def test_without_k_eq_v_the_global_layers_keep_the_kv_heads():
    config = gemma4_26b_a4b()
    config["text_config"]["attention_k_eq_v"] = False
    layout = attention_layout(config)
    assert (layout.full_attention_kv_heads, layout.full_attention_head_dim) == (8, 512)


def test_kv_shared_layers_hold_no_cache_of_their_own():
    """E2B-like: the last 20 of 35 layers read an earlier layer's cache (kv_sharing_target_layer_name)."""
    config = gemma4_26b_a4b()
    text = config["text_config"]
    text.update(num_hidden_layers=35, layer_types=pattern(35, 5), num_kv_shared_layers=20, sliding_window=512)
    layout = attention_layout(config)
    assert (layout.full_attention_layers, layout.sliding_window_layers) == (3, 12)  # layers 0-14 only
    assert "less the last 20 num_kv_shared_layers" in layout.sources["full_attention_layers"]
    text["num_kv_shared_layers"] = 35
    with pytest.raises(FiguresError, match="leaves no layer with a cache"):
        attention_layout(config)


def test_the_recipe_states_what_the_rule_reads_from_its_config():
    recipe = yaml.safe_load((ROOT / "recipes" / "gemma-4-26b-a4b.yml").read_text())
    architecture, layout = recipe["architecture"], attention_layout(gemma4_26b_a4b())
    for key in ("full_attention_layers", "sliding_window_layers", "sliding_window", "kv_heads", "head_dim"):
        assert architecture[key] == getattr(layout, key), key
    assert architecture["full_attention_kv_heads"] == layout.full_attention_kv_heads
    assert architecture["full_attention_head_dim"] == layout.full_attention_head_dim


def test_the_plan_unifies_the_two_page_sizes_as_vllm_does():
    """FP8 KV: a sliding page is 16 x 8 x 2 x 256 B = 65,536 B, a global page 16 x 2 x 2 x 512 B = 32,768 B; vLLM
    doubles the global layers' block size to 32 so that every page is 65,536 B (unify_kv_cache_spec_page_size)."""
    recipe = yaml.safe_load((ROOT / "recipes" / "gemma-4-26b-a4b.yml").read_text())
    inputs, problems = build_inputs(recipe, memory_total_bytes=SPARK_MEM_TOTAL, name="gemma-4-26b-a4b")
    assert problems == []
    groups = plan(inputs).groups
    assert (groups.page_bytes, dict(groups.kind_block_sizes)) == (65536, {"full": 32})
    # One 65,536-token sequence: the global group 65,536 / 32 blocks, each of 5 sliding groups (1,024 - 1 + the
    # tokens in flight) / 16 + 1 blocks; a block is 5 layers x 65,536 B.
    in_flight = 2 * 2048  # vLLM 0.33's default batch on GB10, two batches with async scheduling
    sliding_blocks = -(-(1024 - 1 + in_flight) // 16) + 1
    assert groups.blocks_per_request == 65536 // 32 + 5 * sliding_blocks
    assert groups.bytes_per_block == 5 * 65536


def test_the_global_layers_kv_heads_bound_the_tensor_parallel_size_too():
    recipe = yaml.safe_load((ROOT / "recipes" / "gemma-4-26b-a4b.yml").read_text())
    recipe["architecture"]["full_attention_kv_heads"] = 3
    recipe["tensor_parallel_size"] = 2
    _, problems = build_inputs(recipe, memory_total_bytes=SPARK_MEM_TOTAL, name="gemma-4-26b-a4b")
    assert any("(full-attention layers): tensor_parallel_size 2 and the model's 3 KV heads" in p for p in problems)


def test_a_draft_beside_the_global_layers_own_heads_is_refused():
    """The planner would count a draft's layers with the global layers' heads; gemma4_mtp shares the target's cache."""
    recipe = yaml.safe_load((ROOT / "recipes" / "gemma-4-26b-a4b.yml").read_text())
    recipe["speculative"] = {"method": "ngram", "num_speculative_tokens": 3}
    _, problems = build_inputs(recipe, memory_total_bytes=SPARK_MEM_TOTAL, name="gemma-4-26b-a4b")
    assert any("speculative: not planned for a model whose full-attention layers" in p for p in problems), problems


def test_the_config_classes_own_rules_are_kept():
    """Gemma4TextConfig forces the last layer to full attention, halves the window (+1) for bidirectional attention
    on every token, and reads a stored per_layer_config instead of the global keys (not modelled: refused)."""
    config = gemma4_26b_a4b()
    text = config["text_config"]
    text["layer_types"] = ["sliding_attention"] * 30
    text["use_bidirectional_attention"] = "all"
    layout = attention_layout(config)
    assert (layout.full_attention_layers, layout.sliding_window_layers, layout.sliding_window) == (1, 29, 513)
    text["per_layer_config"] = {"5": {"head_dim": 512}}
    with pytest.raises(FiguresError, match="per_layer_config is set"):
        attention_layout(config)
