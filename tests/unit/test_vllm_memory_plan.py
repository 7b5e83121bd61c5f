"""The unified-memory planner: the arithmetic, the refusals and their suggestions, and its modules run in-process."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import memory_plan as planner
import pytest
import yaml
from helpers import ROOT
from memory_plan import (
    GIB,
    PlanInputs,
    as_dict,
    build_inputs,
    kv_bytes_per_token,
    plan,
    unplanned_dict,
)
from recipe_rules import load_recipe
from spark_gpu import parse_meminfo

# A DGX Spark's MemTotal (127,601,400 kB in /proc/meminfo, about 121.7 GiB).
SPARK_MEM_TOTAL = 127_601_400 * 1024
LABEL = "vllm_server_models[0]"

# Test fixture, not a recipe: Nemotron-3-Super-120B-A12B-NVFP4 at the vLLM blog's flags. weight_bytes is an
# estimate (about 120B parameters at NVFP4 plus the layers kept in higher precision); attention layers only, the
# rest of this hybrid model is Mamba and has no KV cache.
NEMOTRON = {
    "name": "nemotron-3-super-fixture",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.85,
    "max_model_len": 131072,
    "max_num_seqs": 4,
    "kv_cache_dtype": "auto",
    "env": {},
    "architecture": {
        "total_params_b": 120.0,
        "active_params_b": 12.0,
        "bytes_per_param": 0.5625,
        "weight_bytes": 80e9,
        "attention_layers": 8,
        "kv_heads": 2,
        "head_dim": 128,
        "max_context": 1048576,
        "dtype": "bfloat16",
    },
    "measured": {"decode_tok_s": 23.2, "source": "vLLM blog 2026-06-01"},
}

# Test fixture: a dense 70B (Llama 3.3 shape: 80 layers, 8 KV heads, head_dim 128) at NVFP4.
LLAMA_70B_NVFP4 = {
    "name": "llama-70b-nvfp4-fixture",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.85,
    "max_model_len": 131072,
    "max_num_seqs": 4,
    "kv_cache_dtype": "auto",
    "architecture": {
        "total_params_b": 70.6,
        "active_params_b": 70.6,
        "bytes_per_param": 0.5625,
        "weight_bytes": 42.7e9,
        "attention_layers": 80,
        "kv_heads": 8,
        "head_dim": 128,
        "max_context": 131072,
        "dtype": "bfloat16",
    },
}

# Test fixture: the same 70B in BF16 (about 141 GB): does not fit one Spark.
LLAMA_70B_BF16 = {
    **LLAMA_70B_NVFP4,
    "name": "llama-70b-bf16-fixture",
    "architecture": {**LLAMA_70B_NVFP4["architecture"], "bytes_per_param": 2, "weight_bytes": 141e9},
}

RETURN_KEYS = {
    "weights_gib",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "max_full_length_seqs",
    "os_reserve_gib",
    "decode_bound_tok_s",
    "measured_decode_tok_s",
    "fits",
    "reasons",
    "pool_gib",
    "kv_cache_gib",
    "memory_total_gib",
    "tensor_parallel_size",
    "summary",
}


def with_architecture(recipe: dict, **changes: object) -> dict:
    return {**recipe, "architecture": {**recipe["architecture"], **changes}}


def inputs_of(recipe: dict, overrides: dict | None = None, **settings: object) -> PlanInputs:
    settings.setdefault("memory_total_bytes", SPARK_MEM_TOTAL)
    inputs, problems = build_inputs(recipe, overrides, name=LABEL, **settings)
    assert problems == []
    return inputs


def problems_of(recipe: object, overrides: dict | None = None, **settings: object) -> list[str]:
    settings.setdefault("memory_total_bytes", SPARK_MEM_TOTAL)
    inputs, problems = build_inputs(recipe, overrides, name=LABEL, **settings)
    assert inputs is None
    return problems


# ---------------------------------------------------------------------------------------------------------------
# The arithmetic


@pytest.mark.parametrize(
    ("changes", "overrides", "expected"),
    [
        ({}, {}, 327_680),  # 2 x 80 x 8 x 128 x 2 B = 320 KiB
        ({}, {"kv_cache_dtype": "fp8"}, 163_840),
        ({}, {"kv_cache_dtype": "fp8_e5m2"}, 163_840),
        ({}, {"kv_cache_dtype": "float16"}, 327_680),
        ({"dtype": "float32"}, {}, 655_360),  # auto = the model's dtype
        ({"dtype": "float32"}, {"kv_cache_dtype": "bfloat16"}, 327_680),
    ],
    ids=["bf16-auto", "fp8", "fp8-e5m2", "float16", "float32-auto", "float32-model-bf16-cache"],
)
def test_kv_bytes_per_token(changes, overrides, expected):
    inputs = inputs_of(with_architecture(LLAMA_70B_NVFP4, **changes), overrides)
    assert kv_bytes_per_token(inputs) == expected


def test_a_70b_dense_full_context_sequence_is_exactly_40_gib():
    inputs = inputs_of(LLAMA_70B_NVFP4)
    assert kv_bytes_per_token(inputs) == 320 * 1024
    assert 131_072 * kv_bytes_per_token(inputs) == 40 * GIB


@pytest.mark.parametrize(
    ("kv_heads", "tensor_parallel_size", "expected"),
    [(8, 1, 327_680), (8, 2, 163_840), (8, 4, 81_920), (1, 2, 40_960)],
    ids=["tp1", "tp2-halves", "tp4-quarters", "fewer-heads-than-nodes-replicate"],
)
def test_tensor_parallelism_splits_the_kv_heads(kv_heads, tensor_parallel_size, expected):
    # A recipe runs on one Spark or two (vllm_recipe refuses other sizes); the arithmetic holds for any N.
    inputs = inputs_of(with_architecture(LLAMA_70B_NVFP4, kv_heads=kv_heads))
    assert kv_bytes_per_token(replace(inputs, tensor_parallel_size=tensor_parallel_size)) == expected


def test_nemotron_at_the_blogs_flags_fits_one_spark():
    result = as_dict(plan(inputs_of(NEMOTRON)))
    assert result["fits"] is True, result["reasons"]
    assert result["reasons"] == []
    assert result["memory_total_gib"] == pytest.approx(121.7, abs=0.05)
    assert result["pool_gib"] == pytest.approx(121.69 * 0.85, abs=0.05)
    assert result["weights_gib"] == pytest.approx(80e9 / GIB, abs=0.01)
    assert result["kv_bytes_per_token"] == 2 * 8 * 2 * 128 * 2
    assert result["kv_capacity_tokens"] > 4 * 131_072
    assert result["max_full_length_seqs"] == result["kv_capacity_tokens"] // 131_072
    assert result["os_reserve_gib"] == pytest.approx(121.69 * 0.15, abs=0.05)
    assert result["measured_decode_tok_s"] == 23.2
    assert "fits" in result["summary"] and "40.4 tok/s" in result["summary"]


def test_decode_bound_of_nemotron_is_about_40_tok_s():
    result = as_dict(plan(inputs_of(NEMOTRON)))
    assert result["decode_bound_tok_s"] == pytest.approx(273 / (12 * 0.5625), abs=0.05)
    assert 39 < result["decode_bound_tok_s"] < 41
    assert result["decode_bound_tok_s"] > result["measured_decode_tok_s"]


def test_fp8_kv_cache_halves_bytes_per_token_and_doubles_capacity():
    auto = plan(inputs_of(LLAMA_70B_NVFP4))
    fp8 = plan(inputs_of(LLAMA_70B_NVFP4, {"kv_cache_dtype": "fp8"}))
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    # twice the blocks of half the size (one block of the two budgets' remainders apart)
    assert abs(fp8.groups.num_blocks(fp8.kv_cache_bytes) - 2 * auto.groups.num_blocks(auto.kv_cache_bytes)) <= 1
    assert fp8.max_full_length_seqs in (2 * auto.max_full_length_seqs, 2 * auto.max_full_length_seqs + 1)


def test_tensor_parallel_2_halves_the_weights_per_node():
    one = plan(inputs_of(LLAMA_70B_BF16))
    two = plan(inputs_of({**LLAMA_70B_BF16, "tensor_parallel_size": 2}))
    assert two.weights_bytes * 2 == one.weights_bytes == 141e9
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.decode_bound_tok_s == pytest.approx(2 * one.decode_bound_tok_s)
    assert two.fits and not one.fits
    assert as_dict(two)["tensor_parallel_size"] == 2


def test_overrides_replace_the_recipes_values_and_none_keeps_them():
    inputs = inputs_of(
        NEMOTRON,
        {"gpu_memory_utilization": 0.8, "max_model_len": 65536, "max_num_seqs": None, "kv_cache_dtype": "fp8"},
    )
    assert (inputs.gpu_memory_utilization, inputs.max_model_len, inputs.max_num_seqs) == (0.8, 65536, 4)
    assert (inputs.kv_cache_dtype, inputs.kv_dtype_bytes) == ("fp8", 1)


def test_more_seqs_than_full_length_sequences_is_not_a_refusal():
    memory_plan = plan(inputs_of(LLAMA_70B_NVFP4, {"max_num_seqs": 64}))
    assert memory_plan.fits
    assert memory_plan.max_full_length_seqs < 64
    assert "max_num_seqs 64 is more" in as_dict(memory_plan)["summary"]


def test_as_dict_returns_every_documented_key_and_so_does_an_unplanned_result():
    planned = as_dict(plan(inputs_of(NEMOTRON)))
    unplanned = unplanned_dict(["x"])
    assert set(planned) >= RETURN_KEYS
    assert set(unplanned) == set(planned)
    assert unplanned["fits"] is False and unplanned["reasons"] == ["x"]
    json.dumps(planned)


# ---------------------------------------------------------------------------------------------------------------
# Refusals: each names the variable and a value that works


def test_bf16_70b_does_not_fit_one_spark_and_the_reason_suggests_two_sparks():
    memory_plan = plan(inputs_of(LLAMA_70B_BF16))
    assert not memory_plan.fits
    (reason,) = memory_plan.reasons
    assert reason.startswith(f"{LABEL}.gpu_memory_utilization=0.85: ")
    assert "does not fit one Spark at any safe gpu_memory_utilization" in reason
    assert f"{LABEL}.tensor_parallel_size to 2" in reason
    assert "smaller quantization" in reason
    assert as_dict(memory_plan)["kv_capacity_tokens"] == 0


def test_a_short_kv_cache_is_refused_in_the_documented_words():
    memory_plan = plan(inputs_of(LLAMA_70B_NVFP4, {"gpu_memory_utilization": 0.5}))
    (reason,) = memory_plan.reasons
    capacity = memory_plan.longest_sequence_tokens
    # the longest sequence vLLM would admit: whole 16-token blocks of 80 layers x 2 KV x 8 heads x 128 x 2 B, beside
    # the null block
    per_block = 80 * 2 * 8 * 128 * 2 * 16
    assert capacity == (int(memory_plan.kv_cache_bytes) // per_block - 1) * 16 < 131_072
    assert reason == (
        f"{LABEL}.max_model_len=131072: the KV cache admits one sequence of at most {capacity:,} tokens at "
        f"gpu_memory_utilization 0.50, less than one full-length sequence; set max_model_len to "
        f"{capacity // 1024 * 1024} or lower, or gpu_memory_utilization to 0.68"
    )


@pytest.mark.parametrize(
    ("overrides", "settings", "fragment"),
    [
        ({"gpu_memory_utilization": 0.95}, {}, "above max_gpu_memory_utilization 0.87"),
        ({"gpu_memory_utilization": 0.88}, {"os_reserve_min_gib": 20.0}, "leaves 14.6 GiB of 121.7 GiB"),
        ({"gpu_memory_utilization": 0.5}, {"memory_total_bytes": 8 * GIB}, "no gpu_memory_utilization leaves"),
    ],
    ids=["above-the-ceiling", "too-little-for-the-os", "tiny-host"],
)
def test_an_unsafe_utilization_is_refused(overrides, settings, fragment):
    reasons = plan(inputs_of(NEMOTRON, overrides, **settings)).reasons
    assert reasons[0].startswith(f"{LABEL}.gpu_memory_utilization=")
    assert fragment in reasons[0]
    assert "freeze" in reasons[0]


SUGGESTION = {
    "gpu_memory_utilization": r"gpu_memory_utilization to (\d\.\d\d)",
    "max_model_len": r"max_model_len to (\d+)",
    "tensor_parallel_size": r"tensor_parallel_size to (\d+)",
}
# With tensor_parallel_size, the utilization that goes with it.
TP_UTILIZATION = r"tensor_parallel_size to \d+ \(\d Sparks\) with gpu_memory_utilization (\d\.\d\d)"


def follow(recipe: dict, overrides: dict, settings: dict, reasons: tuple[str, ...], keys: tuple[str, ...]) -> dict:
    """The recipe with the suggested values of `keys` (read from the reasons) applied."""
    text = " ".join(reasons)
    recipe, overrides = dict(recipe), dict(overrides)
    for key in keys:
        match = re.search(SUGGESTION[key], text)
        assert match, f"no {key} suggested in: {text}"
        value = match.group(1)
        if key == "tensor_parallel_size":
            recipe[key] = int(value)
            overrides["gpu_memory_utilization"] = float(re.search(TP_UTILIZATION, text).group(1))
        else:
            overrides[key] = float(value) if key == "gpu_memory_utilization" else int(value)
    return plan(inputs_of(recipe, overrides, **settings))


@pytest.mark.parametrize(
    ("recipe", "overrides", "settings", "fixes"),
    [
        (LLAMA_70B_NVFP4, {"gpu_memory_utilization": 0.5}, {}, [("max_model_len",), ("gpu_memory_utilization",)]),
        (LLAMA_70B_NVFP4, {"gpu_memory_utilization": 0.3}, {}, [("gpu_memory_utilization",)]),
        (NEMOTRON, {"gpu_memory_utilization": 0.5}, {}, [("gpu_memory_utilization",)]),
        (NEMOTRON, {"gpu_memory_utilization": 0.95}, {}, [("gpu_memory_utilization",)]),
        (NEMOTRON, {}, {"os_reserve_min_gib": 25.0}, [("gpu_memory_utilization",)]),
        (
            NEMOTRON,
            {"gpu_memory_utilization": 0.89},
            {"max_gpu_memory_utilization": 0.87},
            [("gpu_memory_utilization",)],
        ),
        (LLAMA_70B_BF16, {}, {}, [("tensor_parallel_size",)]),
        (
            {**LLAMA_70B_NVFP4, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}},
            {"gpu_memory_utilization": 0.95, "max_model_len": 262144},
            {},
            [("gpu_memory_utilization", "max_model_len")],
        ),
        (
            with_architecture(LLAMA_70B_BF16, weight_bytes=100e9),
            {"gpu_memory_utilization": 0.7},
            {},
            [("gpu_memory_utilization", "max_model_len"), ("tensor_parallel_size",)],
        ),
        (
            with_architecture(LLAMA_70B_BF16, weight_bytes=100e9),
            {"gpu_memory_utilization": 0.85},
            {},
            [("max_model_len",)],
        ),
    ],
    ids=[
        "short-kv",
        "weights-too-big-for-the-pool",
        "moe-weights-too-big-for-the-pool",
        "unsafe",
        "big-os-reserve",
        "lower-ceiling",
        "bf16-70b-two-sparks",
        "unsafe-and-too-long",
        "weights-fit-only-a-short-context",
        "short-kv-no-safe-utilization",
    ],
)
def test_following_a_suggestion_gives_a_plan_that_fits(recipe, overrides, settings, fixes):
    memory_plan = plan(inputs_of(recipe, overrides, **settings))
    assert not memory_plan.fits
    assert all(reason.startswith(f"{LABEL}.") for reason in memory_plan.reasons)
    for keys in fixes:
        fixed = follow(recipe, overrides, settings, memory_plan.reasons, keys)
        assert fixed.fits, (keys, memory_plan.reasons, fixed.reasons)


def test_suggested_utilization_is_the_smallest_that_holds_one_sequence():
    reasons = plan(inputs_of(LLAMA_70B_NVFP4, {"gpu_memory_utilization": 0.5})).reasons
    suggested = float(re.search(SUGGESTION["gpu_memory_utilization"], reasons[0]).group(1))
    below = plan(inputs_of(LLAMA_70B_NVFP4, {"gpu_memory_utilization": round(suggested - 0.01, 2)}))
    assert (
        below.kv_capacity_tokens
        < 131_072
        <= plan(inputs_of(LLAMA_70B_NVFP4, {"gpu_memory_utilization": suggested})).kv_capacity_tokens
    )


# ---------------------------------------------------------------------------------------------------------------
# Nonsense input: the recipe's values are vllm_recipe's to check (tests/unit/test_recipes.py, plan_problems); the
# planner's own settings are its own. Either way, every problem at once, before any arithmetic.


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"memory_total_bytes": 0}, "memory_total_bytes=0: must be the host's MemTotal"),
        ({"memory_total_bytes": -5}, "memory_total_bytes=-5"),
        ({"overhead_gib": -1.0}, "overhead_gib=-1.0: must be a number of GiB"),
        ({"max_gpu_memory_utilization": 1.5}, "max_gpu_memory_utilization=1.5"),
        ({"bandwidth_gb_s": 0.0}, "bandwidth_gb_s=0.0"),
    ],
    ids=["mem-zero", "mem-negative", "overhead", "ceiling", "bandwidth"],
)
def test_bad_settings_are_refused_naming_the_option(settings, fragment):
    problems = problems_of(NEMOTRON, **settings)
    assert any(problem.startswith(fragment) for problem in problems), problems


def test_every_problem_is_reported_at_once():
    recipe = {**NEMOTRON, "gpu_memory_utilization": 2, "max_num_seqs": 0, "kv_cache_dtype": "int8"}
    problems = problems_of(with_architecture(recipe, kv_heads=None), memory_total_bytes=0)
    assert len(problems) == 5
    for key in ("gpu_memory_utilization", "max_num_seqs", "kv_cache_dtype", "architecture.kv_heads"):
        assert any(problem.startswith(f"{LABEL}.{key}") for problem in problems), key


# ---------------------------------------------------------------------------------------------------------------
# Every recipe of recipes/


RECIPES = sorted((ROOT / "recipes").glob("*.yml"))


@pytest.mark.parametrize("path", RECIPES or [None], ids=[path.stem for path in RECIPES] or ["no-recipes-yet"])
def test_every_recipe_fits_a_spark(path):
    """Each recipe in recipes/ fits a Spark's MemTotal; those with tensor_parallel_size > 1 fit each node."""
    if path is None:
        pytest.skip("recipes/ holds no recipe yet")
    recipe = load_recipe(path.stem, path.parent)
    inputs, problems = build_inputs(recipe, memory_total_bytes=SPARK_MEM_TOTAL, name=path.stem)
    assert problems == []
    memory_plan = plan(inputs)
    assert memory_plan.fits, memory_plan.reasons
    assert memory_plan.max_full_length_seqs >= 1


# ---------------------------------------------------------------------------------------------------------------
# The module, run in-process (tests/unit/conftest.py's run_module)


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "recipes"
    directory.mkdir()
    for recipe in (NEMOTRON, LLAMA_70B_BF16):
        (directory / f"{recipe['name']}.yml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    (directory / "a-list.yml").write_text("- not\n- a mapping\n", encoding="utf-8")
    (directory / "README.md").write_text("not a recipe\n", encoding="utf-8")
    return directory


def module_args(**args: object) -> dict:
    return {"memory_total_bytes": SPARK_MEM_TOTAL, "name": LABEL, **args}


def test_module_plans_a_named_recipe(run_module, recipes_dir):
    result = run_module(
        "vllm_memory_plan", module_args(recipe="nemotron-3-super-fixture", recipes_dir=str(recipes_dir))
    )
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    assert result["fits"] is True and result["reasons"] == []
    assert result["kv_bytes_per_token"] == 8192
    assert set(result) >= RETURN_KEYS


def test_module_in_check_mode_reports_the_same_plan(run_module):
    args = module_args(recipe=NEMOTRON, max_model_len=65536)
    checked = run_module("vllm_memory_plan", args, check_mode=True)
    applied = run_module("vllm_memory_plan", args)
    assert not checked.get("failed"), checked.get("msg")
    assert checked["changed"] is False and applied["changed"] is False
    assert {key: checked[key] for key in RETURN_KEYS} == {key: applied[key] for key in RETURN_KEYS}
    assert checked["max_model_len"] == 65536


def test_module_fails_a_plan_that_does_not_fit_and_returns_it(run_module):
    result = run_module("vllm_memory_plan", module_args(recipe=LLAMA_70B_BF16))
    assert result["failed"] is True
    assert result["fits"] is False
    assert f"{LABEL}.tensor_parallel_size to 2" in result["msg"]
    assert result["reasons"] and result["reasons"][0] in result["msg"]
    assert result["weights_gib"] == pytest.approx(141e9 / GIB, abs=0.01)


def test_module_override_returns_the_plan_with_a_warning(run_module):
    result = run_module("vllm_memory_plan", module_args(recipe=LLAMA_70B_BF16, i_accept_freeze_risk=True))
    assert not result.get("failed"), result.get("msg")
    assert result["fits"] is False and result["reasons"]
    assert any("freeze" in warning and "i_accept_freeze_risk" in warning for warning in result["warnings"])


def test_module_reports_every_input_problem_even_with_the_override(run_module):
    recipe = {**NEMOTRON, "max_num_seqs": 0}
    result = run_module(
        "vllm_memory_plan",
        module_args(recipe=recipe, kv_cache_dtype="fp4", memory_total_bytes=0, i_accept_freeze_risk=True),
    )
    assert result["failed"] is True
    for fragment in (f"{LABEL}.max_num_seqs=0", f"{LABEL}.kv_cache_dtype='fp4'", "memory_total_bytes=0"):
        assert fragment in result["msg"]
    assert result["fits"] is False and len(result["reasons"]) == 3


def test_module_names_the_missing_recipe_and_the_available_ones(run_module, recipes_dir):
    result = run_module("vllm_memory_plan", module_args(recipe="nemotron", recipes_dir=str(recipes_dir)))
    assert result["failed"] is True
    assert "recipe 'nemotron' was not found" in result["msg"]
    assert "nemotron-3-super-fixture" in result["msg"]


def test_module_reads_mem_total_from_the_host(run_module):
    result = run_module("vllm_memory_plan", {"recipe": NEMOTRON})
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        expected = parse_meminfo(meminfo.read())["mem_total_bytes"]
    assert result["memory_total_gib"] == round(expected / GIB, 2)
    assert "recipe" in result["summary"]


# ---------------------------------------------------------------------------------------------------------------
# Every model of a host together. The new functions are reached through the module object (planner.*), so that a
# planner without them fails these tests alone.

# Test fixture: an NVFP4 MoE of Qwen3.6-35B-A3B's size at the NVIDIA playbook's flags (0.4, 262,144 tokens, fp8
# KV cache). weight_bytes is an estimate; attention layers only (the rest is linear attention, no KV cache).
QWEN_MOE = {
    "name": "qwen-moe-fixture",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.4,
    "max_model_len": 262144,
    "max_num_seqs": 4,
    "kv_cache_dtype": "fp8",
    "env": {},
    "architecture": {
        "total_params_b": 35.0,
        "active_params_b": 3.0,
        "bytes_per_param": 0.5625,
        "weight_bytes": 22e9,
        "attention_layers": 10,
        "kv_heads": 2,
        "head_dim": 256,
        "max_context": 262144,
        "dtype": "bfloat16",
    },
}


def host_plans(*entries: tuple[dict, dict], **settings: object) -> list:
    """The plans of vllm_server_models[0], [1], ... on one Spark."""
    settings.setdefault("memory_total_bytes", SPARK_MEM_TOTAL)
    plans = []
    for index, (recipe, overrides) in enumerate(entries):
        inputs, problems = build_inputs(recipe, overrides, name=f"vllm_server_models[{index}]", **settings)
        assert problems == []
        plans.append(plan(inputs))
    return plans


def test_two_models_whose_shares_add_up_past_the_ceiling_are_refused_naming_both():
    # Each fits alone (0.85 and 0.40), but vLLM's utilization is per instance: 1.25 of one pool.
    plans = host_plans((NEMOTRON, {}), (QWEN_MOE, {}))
    assert all(memory_plan.fits for memory_plan in plans)
    reasons = planner.shared_pool_reasons(plans, ["nemotron-3-super-fixture", "qwen-moe-fixture"])
    assert len(reasons) == 1
    reason = reasons[0]
    for fragment in (
        "vllm_server_models[0] (nemotron-3-super-fixture) at gpu_memory_utilization 0.85",
        "vllm_server_models[1] (qwen-moe-fixture) at gpu_memory_utilization 0.40",
        "= 1.25",
        "above max_gpu_memory_utilization 0.87",
        "freeze",
        "lower them so that they add up to 0.87 or less",
    ):
        assert fragment in reason, (fragment, reason)


def test_models_whose_shares_fit_together_are_accepted():
    # 0.64 + 0.23 = 0.87, the ceiling: accepted, and each model still holds its weights and a full sequence.
    plans = host_plans((NEMOTRON, {"gpu_memory_utilization": 0.64}), (QWEN_MOE, {"gpu_memory_utilization": 0.23}))
    assert all(memory_plan.fits for memory_plan in plans)
    assert planner.shared_utilization(plans) == pytest.approx(0.87)
    assert planner.shared_pool_reasons(plans) == []


def test_one_model_has_no_shared_pool_reason():
    plans = host_plans((NEMOTRON, {"gpu_memory_utilization": 0.95}))
    assert planner.shared_pool_reasons(plans) == []
    assert not plans[0].fits  # its own plan says it


SET_UTILIZATION = r"set (vllm_server_models\[\d\])\.gpu_memory_utilization to (\d\.\d\d)"


@pytest.mark.parametrize(
    ("first", "second", "settings"),
    [
        ((NEMOTRON, {}), (QWEN_MOE, {}), {}),
        ((NEMOTRON, {"max_model_len": 16384}), (QWEN_MOE, {"gpu_memory_utilization": 0.3}), {}),
        ((QWEN_MOE, {"gpu_memory_utilization": 0.5}), (QWEN_MOE, {"gpu_memory_utilization": 0.5}), {}),
        ((NEMOTRON, {"gpu_memory_utilization": 0.7}), (QWEN_MOE, {}), {"os_reserve_min_gib": 16.0}),
    ],
    ids=["blog-nemotron-and-playbook-qwen", "one-can-give-way", "two-halves", "big-os-reserve"],
)
def test_following_a_shared_pool_suggestion_gives_a_host_that_fits(first, second, settings):
    plans = host_plans(first, second, **settings)
    (reason,) = planner.shared_pool_reasons(plans)
    suggestions = re.findall(SET_UTILIZATION, reason)
    assert suggestions, reason
    both = "the least that holds each model's" in reason
    alternatives = [suggestions] if both else [[suggestion] for suggestion in suggestions]
    for alternative in alternatives:
        entries = [first, second]
        for label, value in alternative:
            index = int(label[-2])
            recipe, overrides = entries[index]
            entries[index] = (recipe, {**overrides, "gpu_memory_utilization": float(value)})
        fixed = host_plans(*entries, **settings)
        assert all(memory_plan.fits for memory_plan in fixed), [p.reasons for p in fixed]
        assert planner.shared_pool_reasons(fixed) == [], (alternative, reason)


def test_module_plans_every_model_of_a_host_in_one_call_and_refuses_the_sum(run_module):
    args = {
        "memory_total_bytes": SPARK_MEM_TOTAL,
        "name": "vllm_server_models",
        "models": [{"recipe": NEMOTRON}, {"recipe": QWEN_MOE}],
    }
    result = run_module("vllm_memory_plan", args)
    assert result["failed"] is True and result["fits"] is False
    for fragment in ("vllm_server_models[0] (nemotron-3-super-fixture)", "vllm_server_models[1] (qwen-moe-fixture)"):
        assert fragment in result["msg"]
    assert "0.85" in result["msg"] and "0.40" in result["msg"]
    # One plan per model, in order, each with the keys a single plan has (register.results[i] reads them).
    assert [entry["name"] for entry in result["results"]] == ["vllm_server_models[0]", "vllm_server_models[1]"]
    assert all(set(entry) >= RETURN_KEYS and entry["fits"] for entry in result["results"])
    assert result["gpu_memory_utilization_total"] == pytest.approx(1.25)


def test_module_host_plan_of_models_that_fit_together_matches_their_single_plans(run_module):
    models = [{"recipe": NEMOTRON, "gpu_memory_utilization": 0.64}, {"recipe": QWEN_MOE, "max_model_len": 131072}]
    models[1]["gpu_memory_utilization"] = 0.23
    args = {"memory_total_bytes": SPARK_MEM_TOTAL, "name": "vllm_server_models", "models": models}
    together = run_module("vllm_memory_plan", args, check_mode=True)
    assert not together.get("failed"), together.get("msg")
    assert together["fits"] is True and together["reasons"] == []
    alone = run_module("vllm_memory_plan", module_args(**models[1], name="vllm_server_models[1]"))
    assert {key: together["results"][1][key] for key in RETURN_KEYS} == {key: alone[key] for key in RETURN_KEYS}
    assert together["results"][1]["max_model_len"] == 131072


# ---------------------------------------------------------------------------------------------------------------
# Attention kinds: the planner sizes the KV cache with module_utils/model_config_figures' rules, the very functions
# library/hf_model_figures measures with, so the two cannot disagree.

# Test fixture: gpt-oss-120b's attention (36 layers, vLLM slides the even 18 over 128 tokens; 8 KV heads of 64).
GPT_OSS_120B = {
    "name": "gpt-oss-120b-fixture",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.70,
    "max_model_len": 131072,
    "max_num_seqs": 4,
    "kv_cache_dtype": "auto",
    "serve_flags": {},
    "architecture": {
        "total_params_b": 117.0,
        "active_params_b": 5.1,
        "bytes_per_param": 0.53,
        "weight_bytes": 65.2e9,
        "attention_layers": 36,
        "kv_heads": 8,
        "head_dim": 64,
        "max_context": 131072,
        "dtype": "bfloat16",
        "attention_kind": "full",
        "full_attention_layers": 18,
        "sliding_window_layers": 18,
        "sliding_window": 128,
    },
}

# Test fixture: DeepSeek-V2-Lite's attention (27 MLA layers, kv_lora_rank 512 + qk_rope_head_dim 64, BF16).
DEEPSEEK_V2_LITE = {
    "name": "deepseek-v2-lite-fixture",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.6,
    "max_model_len": 32768,
    "max_num_seqs": 4,
    "kv_cache_dtype": "auto",
    "architecture": {
        "total_params_b": 15.7,
        "active_params_b": 2.4,
        "bytes_per_param": 2,
        "weight_bytes": 31.4e9,
        "attention_layers": 27,
        "kv_heads": 1,
        "head_dim": 576,
        "max_context": 163840,
        "dtype": "bfloat16",
        "attention_kind": "mla",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    },
}


def test_gpt_oss_counts_18_full_layers_per_token_and_the_window_per_sequence():
    memory_plan = plan(inputs_of(GPT_OSS_120B))
    per_token = 18 * 2 * 8 * 64 * 2  # full-attention layers only: 36,864 B (36 layers would be 73,728)
    # a sliding layer holds min(128 - 1 + 2 x 2048 in flight, 131072) = 4,223 tokens -> 264 blocks + 1 = 4,240
    sliding = 18 * 2 * 8 * 64 * 2 * 265 * 16
    assert memory_plan.kv_bytes_per_token == per_token == 36_864
    assert sliding == 156_303_360
    assert memory_plan.kv_bytes_per_sequence == 131_072 * per_token + sliding == 4_988_141_568
    assert memory_plan.kv_bytes_per_sequence < 131_072 * 73_728  # what counting 36 full layers gave
    cache = memory_plan.kv_cache_bytes
    per_block = 18 * 2 * 8 * 64 * 2 * 16  # a block is one 16-token page of each of the 18 layers of a group
    blocks = 2 * (8192 + 265)  # the full group's 131,072 tokens and the sliding group's 265 blocks
    assert memory_plan.groups.blocks_per_request * per_block == memory_plan.kv_bytes_per_sequence
    assert memory_plan.max_full_length_seqs == (int(cache // per_block) - 1) // (blocks // 2)  # less the null block
    assert memory_plan.kv_capacity_tokens == int(int(cache // per_block) / (blocks // 2) * 131_072)
    assert "18 sliding-window layers keep 128 tokens" in as_dict(memory_plan)["summary"]


@pytest.mark.parametrize(
    ("serve_flags", "max_model_len", "sliding_tokens", "full_tokens"),
    [
        ({}, 131072, 265 * 16, 131072),  # 2048 tokens, two batches in flight (async scheduling, vLLM 0.33)
        ({"max-num-batched-tokens": 8192, "async-scheduling": False}, 131072, 521 * 16, 131072),  # 127 + 8192
        ({"max-num-batched-tokens": "8192"}, 131072, 1033 * 16, 131072),  # 127 + 2 x 8192: 1032 blocks + 1
        ({}, 1000, 64 * 16, 1008),  # never more than max_model_len (63 blocks) plus one; full: whole blocks
    ],
    ids=["default-batching", "8192-sync", "8192-text-async", "short-context"],
)
def test_sliding_layers_hold_the_window_and_the_tokens_in_flight(
    serve_flags, max_model_len, sliding_tokens, full_tokens
):
    recipe = {**GPT_OSS_120B, "serve_flags": serve_flags, "max_model_len": max_model_len}
    inputs = inputs_of(recipe)
    window = min(128 - 1 + inputs.concurrent_batches * inputs.max_num_batched_tokens, max_model_len)
    assert sliding_tokens == (-(-window // 16) + 1) * 16
    assert planner.kv_bytes_per_sequence(inputs, max_model_len) == 36_864 * (full_tokens + sliding_tokens)


def test_mla_stores_one_latent_vector_not_split_by_tensor_parallelism():
    per_token = 27 * (512 + 64) * 2  # no factor 2 for K and V, one "head"
    assert per_token == 31_104
    assert plan(inputs_of(DEEPSEEK_V2_LITE)).kv_bytes_per_token == per_token
    assert plan(inputs_of({**DEEPSEEK_V2_LITE, "tensor_parallel_size": 2})).kv_bytes_per_token == per_token
    assert plan(inputs_of(DEEPSEEK_V2_LITE, {"kv_cache_dtype": "fp8"})).kv_bytes_per_token == per_token // 2
    # fp8_ds_mla is a sparse-MLA backend's layout: a dense MLA model has no backend for it on a Spark
    (problem,) = problems_of(DEEPSEEK_V2_LITE, {"kv_cache_dtype": "fp8_ds_mla"})
    assert "only in its sparse-MLA backends" in problem and "use fp8" in problem
    memory_plan = plan(inputs_of(DEEPSEEK_V2_LITE))
    assert memory_plan.kv_bytes_per_sequence == 32_768 * per_token
    # the naive formula, 2 x 27 layers x 16 heads x 192, would be 331,776 B/token: 10.7 times too much
    assert memory_plan.fits, memory_plan.reasons


NANO_MAMBA = {"mamba_num_heads": 64, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4}


@pytest.mark.parametrize(
    ("settings", "block_size", "mamba_pages"),
    [
        ({}, 2096, 3),  # prefix caching on (vLLM's default): align mode, 2 states + 1 prefill checkpoint per layer
        ({"serve_flags": {"enable-prefix-caching": False}}, 2096, 1),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, 2112, 5),  # + 1 page per token
    ],
    ids=["prefix-caching", "no-prefix-caching", "two-speculative-tokens"],
)
def test_a_mamba_state_takes_whole_attention_pages(settings, block_size, mamba_pages):
    # Nemotron-3-Nano-30B-A3B's shape: 6 attention layers (2 KV heads of 128), 23 Mamba-2 layers of 2,134,016 B
    recipe = with_architecture(
        {**NEMOTRON, "max_model_len": 262144, "serve_flags": {}, **settings},
        attention_layers=6,
        model_type="nemotron_h",
        mamba_kind="mamba2",
        mamba_layers=23,
        mamba_dims={**NANO_MAMBA, "ssm_dtype": "float32"},
    )
    memory_plan = plan(inputs_of(recipe))
    per_token = 2 * 2 * 128 * 2  # one attention layer, bf16
    assert memory_plan.kv_bytes_per_token == 6 * per_token == 6_144
    assert memory_plan.groups.block_size == block_size  # one page of block_size tokens holds a Mamba state
    page = block_size * per_token
    # 23 Mamba layers in 4 groups of 6 slots (one padded), the 6 attention layers in one
    blocks = -(-262_144 // block_size) + 4 * mamba_pages
    assert memory_plan.kv_bytes_per_sequence == blocks * 6 * page
    assert memory_plan.kv_bytes_per_sequence > 262_144 * 6_144 + 23 * 2_134_016  # the old, unpadded rule


def test_a_hybrid_model_type_without_its_recurrent_layers_is_refused():
    (problem,) = problems_of(with_architecture(NEMOTRON, model_type="nemotron_h"))
    assert "mamba_layers is missing: a 'nemotron_h' model has mamba2 layers" in problem
    problems = problems_of(
        with_architecture(NEMOTRON, model_type="nemotron_h", mamba_kind="mamba2", mamba_layers=23, mamba_dims={})
    )
    assert any("mamba_dims.ssm_state_size=None" in problem for problem in problems)


def test_kv_cache_dtype_auto_follows_the_checkpoint():
    inputs = inputs_of(with_architecture(NEMOTRON, kv_cache_dtype_auto="fp8_e4m3"))
    assert (inputs.kv_cache_dtype, inputs.kv_cache_dtype_resolved, inputs.kv_dtype_bytes) == ("auto", "fp8_e4m3", 1)
    assert kv_bytes_per_token(inputs) == 8 * 2 * 2 * 128


def test_a_shorter_context_suggested_for_a_sliding_model_fits():
    memory_plan = plan(inputs_of(GPT_OSS_120B, {"gpu_memory_utilization": 0.53}))
    (reason,) = memory_plan.reasons
    shorter = int(re.search(r"max_model_len to (\d+) or lower", reason).group(1))
    assert plan(inputs_of(GPT_OSS_120B, {"gpu_memory_utilization": 0.53, "max_model_len": shorter})).fits


# The module's fixture repos (tests/fixtures/build_figure_models.py): dense, MoE, hybrid Mamba-2, sliding window,
# MLA, hybrid Gated DeltaNet. Each is measured once by library/hf_model_figures through the stand-in Hub.
FIGURE_REPOS = (
    "sparkfleet-test/llama-dense",
    "sparkfleet-test/qwen3-moe",
    "sparkfleet-test/nemotron-h-nvfp4",
    "sparkfleet-test/gpt-oss-mxfp4",
    "sparkfleet-test/deepseek-v2-lite-mla",
    "sparkfleet-test/qwen3.5-moe-vl",
)
FIGURE_DTYPES = ("auto", "fp8")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, run_module) -> dict:
    """{(repo_id, kv_cache_dtype): (the module's result, the fixture's config.json)}."""
    from helpers import hf_standin
    from test_hf_model_figures import BUILD

    root = tmp_path_factory.mktemp("planner-figures-hub")
    models = BUILD.build(root)
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
            patch.delenv(name, raising=False)
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        with hf_standin.running_standin(root) as url:
            for repo_id in FIGURE_REPOS:
                for dtype in FIGURE_DTYPES:
                    args = {"repo_id": repo_id, "endpoint": url, "kv_cache_dtype": dtype}
                    results[repo_id, dtype] = (run_module("hf_model_figures", args), models[repo_id].config)
    return results


def planned_from(architecture: dict, **recipe: object) -> PlanInputs:
    """A recipe whose architecture block is what hf_model_figures returned, pasted as is."""
    base = {
        "name": "measured",
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.5,
        "max_model_len": min(4096, architecture["max_context"]),
        "max_num_seqs": 4,
        "kv_cache_dtype": "auto",
        "architecture": architecture,
    }
    return inputs_of({**base, **recipe})


@pytest.mark.parametrize("kv_cache_dtype", FIGURE_DTYPES)
@pytest.mark.parametrize("repo_id", FIGURE_REPOS)
def test_the_planner_and_the_module_agree(measured, repo_id, kv_cache_dtype):
    from kv_cache_pages import mamba_state_bytes
    from model_config_figures import attention_layout
    from model_config_figures import kv_bytes_per_token as layout_kv_bytes_per_token
    from recipe_rules import schema_problems

    result, config = measured[repo_id, kv_cache_dtype]
    assert not result.get("failed"), result.get("msg")
    architecture = result["architecture"]
    # The module's block is a valid recipe architecture as it stands.
    assert [p for p in schema_problems({"architecture": architecture}, "r") if ".architecture" in p] == []

    inputs = planned_from(architecture, kv_cache_dtype=kv_cache_dtype)
    memory_plan = plan(inputs)
    assert inputs.kv_cache_dtype_resolved == architecture["kv_cache_dtype"]
    assert memory_plan.kv_bytes_per_token == architecture["kv_bytes_per_token"]
    length = inputs.max_model_len
    sliding = architecture["sliding_window_kv_bytes_per_token"]
    if sliding:
        # the window, 2 batches of 2048 tokens in flight, at most the length, in 16-token blocks plus one
        window = min(architecture["sliding_window"] - 1 + 2 * 2048, length)
        sliding *= (-(-window // 16) + 1) * 16
    if architecture["mamba_layers"]:
        # a hybrid: pages of a block raised until one holds a Mamba state, 3 state pages per group of Mamba layers
        found = memory_plan.groups
        state = mamba_state_bytes(architecture["mamba_kind"], architecture["mamba_dims"], architecture["dtype"])
        assert 0 <= found.page_bytes - state < 64 * found.layers.attention_bytes_per_token  # padded by < one step
        mamba_groups = -(-architecture["mamba_layers"] // found.slots_per_group)
        blocks = -(-length // found.block_size) + 3 * mamba_groups
        assert memory_plan.kv_bytes_per_sequence == found.bytes_per_block * blocks
    else:
        assert memory_plan.kv_bytes_per_sequence == (
            architecture["kv_bytes_per_token"] * -(-length // 16) * 16 + sliding
        )
    # Two nodes: the same rule on the fixture's own config (GQA heads split, the MLA latent not).
    two = planned_from(architecture, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=2)
    layout = attention_layout(config)
    assert kv_bytes_per_token(two) == layout_kv_bytes_per_token(layout, architecture["kv_cache_dtype"], tp=2)


# ---------------------------------------------------------------------------------------------------------------
# The KV cache sized in GiB (kv_cache_memory_gib, vLLM's --kv-cache-memory-bytes)


def test_a_kv_cache_in_gib_is_taken_as_it_is_whatever_the_share():
    """vLLM 0.33's determine_available_memory returns kv_cache_memory_bytes unprofiled: the plan's KV cache is that,
    at any gpu_memory_utilization whose share still holds weights, overhead and it."""
    sized = {"kv_cache_memory_gib": 20}
    at_85 = plan(inputs_of(NEMOTRON, sized))
    at_80 = plan(inputs_of(NEMOTRON, {**sized, "gpu_memory_utilization": 0.80}))
    assert at_85.fits and at_80.fits, (at_85.reasons, at_80.reasons)
    assert at_85.kv_cache_bytes == at_80.kv_cache_bytes == 20 * GIB
    assert at_85.max_full_length_seqs == at_85.groups.sequences_held(20 * GIB)
    assert at_85.max_full_length_seqs < plan(inputs_of(NEMOTRON)).max_full_length_seqs
    assert "KV cache 20.0 GiB (kv_cache_memory_gib)" in planner.summary(at_85)


def test_a_kv_cache_in_gib_beyond_the_share_is_refused_with_both_fixes():
    """The OS reserve is counted from the share: weights, overhead and the KV cache must stay inside it. (A share
    beyond max_gpu_memory_utilization is not offered: 40 GiB at 0.80 gets only the smaller KV cache.)"""
    inputs = inputs_of(NEMOTRON, {"kv_cache_memory_gib": 25, "gpu_memory_utilization": 0.80})
    weights = 80e9 / GIB + 2.0
    (reason,) = plan(inputs).reasons
    assert reason.startswith(f"{LABEL}.kv_cache_memory_gib=25: the weights (74.5 GiB) plus overhead (2.0 GiB)")
    share = math.ceil((weights + 25) * GIB / SPARK_MEM_TOTAL * 100) / 100
    room = math.floor((SPARK_MEM_TOTAL * 0.80 / GIB - weights) * 10) / 10
    assert f"set gpu_memory_utilization to {share:.2f}, or kv_cache_memory_gib to {room:g} or lower" in reason
    # Following either fix gives a plan that fits.
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": 25, "gpu_memory_utilization": share})).fits
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": room, "gpu_memory_utilization": 0.80})).fits
    (unsafe_share,) = plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": 40, "gpu_memory_utilization": 0.80})).reasons
    assert f"set kv_cache_memory_gib to {room:g} or lower (not below " in unsafe_share
    assert "gpu_memory_utilization to" not in unsafe_share
    # "or lower" has a floor: one full-length sequence, which the reason names and which fits.
    floor = float(re.search(r"not below ([0-9.]+), one ", unsafe_share).group(1))
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": floor, "gpu_memory_utilization": 0.80})).fits
    assert not plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": floor - 0.1, "gpu_memory_utilization": 0.80})).fits


def test_a_kv_cache_in_gib_too_small_for_one_sequence_names_the_gib_it_needs():
    (reason,) = plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": 0.5})).reasons
    assert "the KV cache admits one sequence of at most" in reason
    needed = float(re.search(r"kv_cache_memory_gib to ([0-9.]+)", reason).group(1))
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": needed})).fits


def test_a_kv_cache_in_gib_too_small_at_a_tight_share_names_the_share_its_fix_needs():
    """Raising the KV cache to one sequence can overflow the share: the fix then says the share it needs too, and
    following it fits."""
    tight = {"kv_cache_memory_gib": 0.5, "gpu_memory_utilization": 0.635}
    (reason,) = plan(inputs_of(NEMOTRON, tight)).reasons
    found = re.search(r"kv_cache_memory_gib to ([0-9.]+) with gpu_memory_utilization ([0-9.]+)", reason)
    assert found, reason
    gib, share = float(found.group(1)), float(found.group(2))
    assert share > 0.635
    assert not plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": gib, "gpu_memory_utilization": 0.635})).fits
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": gib, "gpu_memory_utilization": share})).fits


def test_a_kv_cache_in_gib_is_rendered_in_bytes_and_checked():
    from recipe_rules import serve_args
    from vllm_flags import load_flag_list

    flags = load_flag_list(ROOT / "recipes" / "vllm-serve-flags.txt")
    recipe = load_recipe("qwen3-0.6b", ROOT / "recipes")
    args = serve_args({**recipe, "kv_cache_memory_gib": 1.5}, flags)
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(int(1.5 * GIB))
    assert "--kv-cache-memory-bytes" not in serve_args(recipe, flags)
    assert problems_of({**NEMOTRON, "kv_cache_memory_gib": -1}) == [
        f"{LABEL}.kv_cache_memory_gib=-1: expected a positive number of GiB for the KV cache, e.g. 20, or null to "
        "size it from gpu_memory_utilization"
    ]


def test_the_share_suggested_for_a_kv_cache_in_gib_holds_weights_overhead_and_it():
    """The smallest share holding a sequence, with the KV cache sized in GiB, is the one its footprint needs."""
    inputs = inputs_of(NEMOTRON, {"kv_cache_memory_gib": 20})
    share = planner.smallest_utilization_holding(inputs, inputs.max_model_len)
    assert plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": 20, "gpu_memory_utilization": share})).fits
    lower = round(share - 0.01, 2)
    assert not plan(inputs_of(NEMOTRON, {"kv_cache_memory_gib": 20, "gpu_memory_utilization": lower})).fits


# A dense model far too large for a pair in BF16 (about 4.5 times the 70B's weights).
BIG_BF16 = {
    **LLAMA_70B_BF16,
    "name": "big-bf16-fixture",
    "tensor_parallel_size": 2,
    "architecture": {**LLAMA_70B_BF16["architecture"], "weight_bytes": 320e9},
}


def test_a_pair_too_small_is_told_of_a_group_of_four_by_tensor_parallelism():
    (reason,) = plan(inputs_of(BIG_BF16)).reasons
    assert f"{LABEL}.tensor_parallel_size to 4 (4 Sparks)" in reason


def test_kv_heads_that_four_ranks_cannot_split_get_pipeline_stages_instead():
    six_kv_heads = {**BIG_BF16, "architecture": {**BIG_BF16["architecture"], "kv_heads": 6}}
    (reason,) = plan(inputs_of(six_kv_heads)).reasons
    assert f"{LABEL}.pipeline_parallel_size to 2 (4 Sparks)" in reason
    assert "tensor_parallel_size to 4" not in reason


def test_a_group_of_eight_too_small_is_told_only_to_quantize():
    eight = {**BIG_BF16, "tensor_parallel_size": 8, "architecture": {**BIG_BF16["architecture"], "weight_bytes": 2e12}}
    (reason,) = plan(inputs_of(eight)).reasons
    assert reason.endswith("use a smaller quantization (e.g. NVFP4)")
