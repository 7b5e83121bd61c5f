"""Decision profiles (module_utils/profiles.py) on three kinds of model the seed's table speaks of: a 70B dense model
(Llama-3.3-70B NVFP4), an MoE with MTP speculation (Qwen3.6-35B-A3B NVFP4) and a Mamba hybrid (Nemotron-3-Super
NVFP4). Each profile's plan must fit, and be the extreme it promises under the planner's own rules: speed the
smallest safe share holding one full-context stream, users the largest safe share filled with sequences, safe the
smallest safe share holding one sequence of the recipe's context."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT
from memory_plan import build_inputs, largest_safe_utilization, plan, sequences_held
from profiles import MEASURED_BANDWIDTH_GB_S, apply_profile
from recipe_rules import load_recipe

RECIPES_DIR = ROOT / "recipes"
SPARK = 127_601_400 * 1024
SETTINGS = {"overhead_gib": 2.0, "os_reserve_min_gib": 8.0, "max_gpu_memory_utilization": 0.87}
DENSE_70B, MOE_MTP, HYBRID = (
    "llama-3.3-70b-instruct-nvfp4",
    "qwen3.6-35b-a3b-nvfp4-mtp",
    "nemotron-3-super-120b-a12b-nvfp4",
)


def chosen(name: str, profile: str, **entry) -> tuple[dict, str]:
    recipe = load_recipe(name, RECIPES_DIR)
    settings, notes = apply_profile(
        recipe, {"profile": profile, **entry}, memory_total_bytes=SPARK, settings=SETTINGS, label="e"
    )
    (note,) = notes
    return settings, note


def planned(recipe: dict):
    inputs, problems = build_inputs(recipe, memory_total_bytes=SPARK, name="e", **SETTINGS)
    assert problems == []
    return inputs, plan(inputs)


def one_less(recipe: dict) -> dict:
    return {**recipe, "gpu_memory_utilization": round(recipe["gpu_memory_utilization"] - 0.01, 2)}


@pytest.mark.parametrize("name", [DENSE_70B, MOE_MTP, HYBRID])
def test_speed_is_one_full_context_stream_at_the_smallest_share_that_holds_it(name):
    settings, note = chosen(name, "speed")
    recipe = load_recipe(name, RECIPES_DIR)
    assert (settings["max_num_seqs"], settings["max_model_len"]) == (1, recipe["architecture"]["max_context"])
    assert settings.get("speculative") == recipe.get("speculative")  # kept where the recipe has it
    _, fits = planned(settings)
    assert fits.fits, fits.reasons
    assert not planned(one_less(settings))[1].fits
    assert "one stream at the full context" in note


@pytest.mark.parametrize(("name", "fp8_from"), [(DENSE_70B, "fp8"), (MOE_MTP, "fp8"), (HYBRID, "auto")])
def test_users_fills_the_largest_safe_share_with_sequences_on_an_fp8_cache(name, fp8_from):
    settings, note = chosen(name, "users")
    recipe = load_recipe(name, RECIPES_DIR)
    assert recipe["kv_cache_dtype"] == fp8_from and settings["kv_cache_dtype"] == "fp8"
    assert "speculative" not in settings
    assert settings["max_model_len"] == min(recipe["max_model_len"], 32768)
    inputs, fits = planned(settings)
    assert fits.fits, fits.reasons
    assert settings["gpu_memory_utilization"] == largest_safe_utilization(inputs)
    assert settings["max_num_seqs"] == sequences_held(inputs, settings["gpu_memory_utilization"]) > 1
    assert f"the most concurrent 32,768-token sequences ({settings['max_num_seqs']})" in note


def test_users_takes_the_stated_context_and_holds_fewer_longer_sequences():
    short, _ = chosen(DENSE_70B, "users")
    long, _ = chosen(DENSE_70B, "users", profile_context=65536)
    assert long["max_model_len"] == 65536 and long["max_num_seqs"] < short["max_num_seqs"]


@pytest.mark.parametrize("name", [DENSE_70B, MOE_MTP, HYBRID])
def test_safe_is_the_largest_headroom_that_still_holds_one_sequence(name):
    settings, note = chosen(name, "safe")
    recipe = load_recipe(name, RECIPES_DIR)
    assert (settings["max_model_len"], settings["kv_cache_dtype"]) == (
        recipe["max_model_len"],
        recipe["kv_cache_dtype"],
    )
    assert "speculative" not in settings
    _, fits = planned(settings)
    assert fits.fits, fits.reasons
    assert not planned(one_less(settings))[1].fits
    assert settings["gpu_memory_utilization"] < recipe["gpu_memory_utilization"]
    assert "the largest headroom" in note


def test_the_note_gives_the_decode_ceiling_at_the_measured_bandwidth_and_the_published_figure():
    _, note = chosen(MOE_MTP, "speed")
    recipe = load_recipe(MOE_MTP, RECIPES_DIR)
    architecture = recipe["architecture"]
    ceiling = MEASURED_BANDWIDTH_GB_S * 1e9 / (architecture["active_params_b"] * 1e9 * architecture["bytes_per_param"])
    assert f"one stream decodes at most {ceiling:,.1f} tok/s (231 GB/s" in note
    assert f"{recipe['measured']['decode_tok_s']:g} tok/s measured" in note


def test_a_profile_reaches_the_command_line_and_a_misspelt_one_is_named(run_module):
    args = {
        "recipes_dir": str(RECIPES_DIR),
        "listen_address": "127.0.0.1",
        "data_dir": "/var/lib/sparkfleet",
        "config_dir": "/etc/sparkfleet/vllm",
        "host": "spark-1",
        "memory_total_bytes": SPARK,
    }
    done = run_module("vllm_models", {**args, "models": [{"recipe": HYBRID, "port": 8000, "profile": "users"}]})
    assert not done.get("failed"), done
    serve = done["models"][0]["serve_args"]
    settings, _ = chosen(HYBRID, "users")
    assert serve[serve.index("--max-num-seqs") + 1] == str(settings["max_num_seqs"])
    assert serve[serve.index("--kv-cache-dtype") + 1] == "fp8"
    assert any(
        note.startswith("vllm_server_models[0] (recipe nemotron") and "profile users" in note for note in done["notes"]
    )
    wrong = run_module("vllm_models", {**args, "models": [{"recipe": HYBRID, "port": 8000, "profile": "sped"}]})
    assert (
        wrong["failed"]
        and "profile='sped': expected one of speed, users, safe, or none; did you mean 'speed'?" in wrong["msg"]
    )
    stray = run_module("vllm_models", {**args, "models": [{"recipe": HYBRID, "port": 8000, "profile_context": 4096}]})
    assert stray["failed"] and "only the users profile takes a context" in json.dumps(stray["msg"])


def module_args(models: list[dict]) -> dict:
    return {
        "recipes_dir": str(RECIPES_DIR),
        "listen_address": "127.0.0.1",
        "data_dir": "/var/lib/sparkfleet",
        "config_dir": "/etc/sparkfleet/vllm",
        "host": "spark-1",
        "memory_total_bytes": SPARK,
        "models": models,
    }


def flag(model: dict, name: str) -> str:
    serve = model["serve_args"]
    return serve[serve.index(name) + 1]


def test_users_beside_another_model_takes_what_the_other_leaves(run_module):
    """The users profile takes the largest safe share of the host, less the other models' shares: the two plan
    together, and users holds fewer sequences than it would alone."""
    small = {"recipe": "qwen3-0.6b", "port": 8001, "gpu_memory_utilization": 0.1}
    done = run_module("vllm_models", module_args([{"recipe": HYBRID, "port": 8000, "profile": "users"}, small]))
    assert not done.get("failed"), done.get("msg")
    alone, _ = chosen(HYBRID, "users")
    shares = [float(flag(model, "--gpu-memory-utilization")) for model in done["models"]]
    assert shares[1] == 0.1
    assert round(shares[0] + shares[1], 2) <= alone["gpu_memory_utilization"] and shares[0] > 0
    assert int(flag(done["models"][0], "--max-num-seqs")) < alone["max_num_seqs"]
    assert any("the host's other models leave" in note for note in done["notes"])


def test_an_entry_value_a_profile_chooses_and_a_context_beyond_the_model_are_refused(run_module):
    both = run_module(
        "vllm_models", module_args([{"recipe": HYBRID, "port": 8000, "profile": "users", "max_num_seqs": 8}])
    )
    assert (
        both["failed"]
        and (
            "vllm_server_models[0] (recipe nemotron-3-super-120b-a12b-nvfp4).max_num_seqs: profile users chooses "
            "max_num_seqs itself; remove max_num_seqs from the entry, or remove the profile to set it yourself"
        )
        in both["msg"]
    )
    context = load_recipe(HYBRID, RECIPES_DIR)["architecture"]["max_context"]
    beyond = {"recipe": HYBRID, "port": 8000, "profile": "users", "profile_context": context * 2}
    long = run_module("vllm_models", module_args([beyond]))
    assert (
        long["failed"]
        and f"profile_context={context * 2}: more than the model's context of {context:,}" in (long["msg"])
    )


def test_an_entry_keeps_what_its_profile_does_not_choose(run_module):
    """safe keeps the entry's context and KV dtype; speed keeps its KV dtype: neither is refused."""
    safe = {"recipe": HYBRID, "port": 8000, "profile": "safe", "max_model_len": 65536}
    done = run_module("vllm_models", module_args([safe]))
    assert not done.get("failed"), done.get("msg")
    assert flag(done["models"][0], "--max-model-len") == "65536"
    speed = {"recipe": HYBRID, "port": 8000, "profile": "speed", "kv_cache_dtype": "fp8"}
    done = run_module("vllm_models", module_args([speed]))
    assert not done.get("failed"), done.get("msg")
    assert flag(done["models"][0], "--kv-cache-dtype") == "fp8"
