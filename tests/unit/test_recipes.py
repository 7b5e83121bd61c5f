"""Model recipes: every file in recipes/ against the schema and the pinned vLLM's flag list, and the recipe
logic (overrides, flag checks, rendering) that roles/vllm_server runs through library/vllm_recipe.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from recipe_rules import (
    RecipeError,
    apply_overrides,
    flag_problems,
    load_recipe,
    plan_problems,
    read_recipe,
    recipe_names,
    schema_problems,
    serve_args,
)
from test_vllm_memory_plan import NEMOTRON
from vllm_flags import load_flag_list

RECIPES_DIR = ROOT / "recipes"
FLAGS_FILE = RECIPES_DIR / "vllm-serve-flags.txt"
FLAG_KINDS = load_flag_list(FLAGS_FILE)
RECIPES = recipe_names(RECIPES_DIR)

# The stand-in vLLM parses a command line the way vLLM's FlexibleArgumentParser does.
sys.path.insert(0, str(ROOT / "tests" / "standins" / "vllm"))
from vllm_standin.flags import load_flag_table, parse_serve_args  # noqa: E402


def recipe(name: str) -> dict:
    return load_recipe(name, RECIPES_DIR)


def pinned(data: dict) -> dict:
    """A recipe that lacks a published pin, with a stand-in commit, to check everything else about it."""
    return data if data.get("hf_revision") else apply_overrides(data, {"hf_revision": "0" * 40})


def test_the_issue_s_models_all_have_a_recipe():
    repos = {recipe(name)["hf_repo"]: recipe(name) for name in RECIPES}
    for repo in (
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
        "openai/gpt-oss-120b",
        "nvidia/Qwen3.6-35B-A3B-NVFP4",
        "nvidia/Llama-3.3-70B-Instruct-NVFP4",
    ):
        assert repo in repos
    assert any(data["tensor_parallel_size"] == 2 for data in repos.values())


def test_the_catalog_covers_the_spark_s_published_models_with_sources():
    # Issue 18: at least 15 recipes, each saying where its flags and its figures come from, across the attention
    # kinds the planner knows (full, sliding window, MLA, hybrid Mamba).
    assert len(RECIPES) >= 15
    for name in RECIPES:
        sources = recipe(name)["sources"]
        assert sources.get("flags") and sources.get("architecture"), name
    architectures = [recipe(name)["architecture"] for name in RECIPES]
    assert any(a.get("sliding_window_layers") for a in architectures)
    assert any(a.get("attention_kind") == "mla" for a in architectures)
    assert any(a.get("mamba_layers") for a in architectures)


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_is_named_after_its_file_and_matches_the_schema(name):
    data = recipe(name)
    assert data["name"] == name
    assert schema_problems(pinned(data), name) == []


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_pins_a_revision_or_says_it_follows_a_branch(name):
    """An unpinned recipe says why and that the models lock holds its commit; without a lock entry it is refused,
    naming the lock (module_utils/model_lock.py fills hf_revision from the lock before this check)."""
    data = recipe(name)
    if data["hf_revision"] is None:
        text = (RECIPES_DIR / f"{name}.yml").read_text(encoding="utf-8")
        assert "Unpinned: " in text and "models.lock.yml" in text
        assert [p for p in schema_problems(data, name) if "hf_revision" in p] == [
            f"{name}.hf_revision=None: expected a pinned commit of the Hugging Face repo: 40 lowercase hex digits "
            "(set it in the recipe or per host in the vllm_server_models entry; or leave it null and the models lock "
            "holds the commit its hf_branch, default main, resolves to)"
        ]
    else:
        assert len(data["hf_revision"]) == 40


@pytest.mark.parametrize("name", RECIPES)
def test_every_flag_of_every_recipe_is_a_flag_of_the_pinned_vllm(name):
    assert flag_problems(recipe(name), FLAG_KINDS, name) == []


@pytest.mark.parametrize("name", RECIPES)
def test_the_rendered_command_line_parses_like_vllm_serve_parses_it(name):
    args = serve_args(pinned(recipe(name)), FLAG_KINDS)
    parsed = parse_serve_args([*args, "--host", "127.0.0.1", "--port", "8000"], load_flag_table(FLAGS_FILE))
    data = recipe(name)
    assert parsed.model_tag == data["hf_repo"]
    assert parsed.values["served_model_name"] == [data["served_model_name"]]
    assert parsed.values["max_model_len"] == str(data["max_model_len"])


def test_nemotron_carries_the_seed_configuration():
    data = recipe("nemotron-3-super-120b-a12b-nvfp4")
    assert (data["gpu_memory_utilization"], data["max_model_len"], data["max_num_seqs"]) == (0.85, 131072, 4)
    assert data["serve_flags"]["reasoning-parser"] == "nemotron_v3"
    assert data["serve_flags"]["tool-call-parser"] == "qwen3_coder"
    args = serve_args(data, FLAG_KINDS)
    assert "--enable-auto-tool-choice" in args
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.85"


def test_the_flag_list_names_the_release_it_was_generated_from():
    header = FLAGS_FILE.read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith("# Generated from vLLM 0.33.0 (PyPI wheel")
    assert {"max-num-seqs", "reasoning-parser", "enable-prefix-caching"} <= set(FLAG_KINDS)


def test_the_flag_list_is_current_with_vllm_0_33():
    # Flags of 0.33.0 that the old hand-kept list lacked, and flags that 0.33.0 no longer has.
    assert {"max-num-scheduled-tokens", "safetensors-prefetch-num-threads", "enable-per-request-metrics"} <= set(
        FLAG_KINDS
    )
    gone = {"calculate-kv-scales", "max-num-partial-prefills", "max-long-partial-prefills", "override-attention-dtype"}
    assert not gone & set(FLAG_KINDS)
    problems = flag_problems(apply_overrides(base(), {"serve_flags": {"calculate-kv-scales": True}}), FLAG_KINDS)
    assert problems and "--calculate-kv-scales is not a flag" in problems[0]


@pytest.mark.parametrize("dtype", ["half", "fp16", "float32"])
def test_a_kv_cache_dtype_that_vllm_does_not_have_is_refused(dtype):
    # vLLM's CacheDType (the --kv-cache-dtype choices of 0.33.0) has no "half": the server would die at start.
    problems = flag_problems(apply_overrides(base(), {"kv_cache_dtype": dtype}), FLAG_KINDS, "vllm_server_models[0]")
    assert len(problems) == 1
    assert problems[0].startswith(f"vllm_server_models[0].kv_cache_dtype={dtype!r}: the pinned vLLM accepts one of")
    assert "fp8" in problems[0]


def test_a_choice_flag_takes_only_its_choices():
    bad = apply_overrides(base(), {"serve_flags": {"moe-backend": "marlinn"}})
    [problem] = flag_problems(bad, FLAG_KINDS, "label")
    assert "expected one of" in problem and "marlin" in problem


# --- the logic ---------------------------------------------------------------------------------------------


def base() -> dict:
    return recipe("qwen3-0.6b")


def test_a_typo_in_a_flag_fails_with_the_right_name():
    bad = apply_overrides(base(), {"serve_flags": {"max-num-batched-token": 8192}})
    assert flag_problems(bad, FLAG_KINDS, "vllm_server_models[0]") == [
        "vllm_server_models[0].serve_flags.max-num-batched-token: --max-num-batched-token is not a flag of "
        "`vllm serve` in the pinned vLLM; did you mean 'max-num-batched-tokens'?"
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"max-num-seqs": 8}, "set label.max_num_seqs instead"),
        ({"api-key": "x"}, "the role sets --api-key from vllm_server_api_key"),
        ({"port": 9000}, "the role sets --port"),
        ({"--enable-prefix-caching": True}, "write flags dashed and without the leading '--'"),
        ({"enable_prefix_caching": True}, "write flags dashed"),
        ({"enable-prefix-caching": "yes"}, "this flag takes no value"),
        ({"max-num-batched-tokens": True}, "this flag takes a value, not true/false"),
        ({"max-num-batched-tokens": {"a": 1}}, "expected a single value"),
    ],
)
def test_flags_in_the_wrong_place_or_shape_are_refused(flags, expected):
    problems = flag_problems(apply_overrides(base(), {"serve_flags": flags}), FLAG_KINDS, "label")
    assert len(problems) == 1
    assert expected in problems[0]


GOOD_ROW = {
    "scenario": "typical judge call",
    "prompt_tokens": 58,
    "output_tokens": 2,
    "ttft_s": 0.42,
    "total_s": 0.53,
    "prefill_tok_s": 140,
    "decode_tok_s": 23,
}


def test_nemotron_carries_the_published_evaluation():
    published = recipe("nemotron-3-super-120b-a12b-nvfp4")["published_eval"]
    assert published["rows"][0] == GOOD_ROW
    shapes = [(row["prompt_tokens"], row["output_tokens"]) for row in published["rows"]]
    assert shapes == [(58, 2), (1834, 32), (7234, 32), (1834, 108), (7234, 124)]
    assert "vLLM blog 2026-06-01" in published["source"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"env": {"HF_TOKEN": "hf_x"}}, "label.env.HF_TOKEN: secrets never go in a recipe; set vllm_server_hf_token"),
        ({"env": {"VLLM_API_KEY": "k"}}, "set vllm_server_api_key instead"),
        ({"env": {"VLLM_FLAG": True}}, "expected text"),
        ({"hf_repo": "no-org"}, "label.hf_repo='no-org': expected 'org/model'"),
        ({"hf_revision": "main"}, "label.hf_revision='main': expected a pinned commit"),
        ({"gpu_memory_utilization": 85}, "label.gpu_memory_utilization=85: expected a fraction"),
        ({"max_model_len": "128k"}, "label.max_model_len='128k'"),
        ({"kv_cache_dtype": 8}, "label.kv_cache_dtype=8: expected one of auto, bfloat16"),
        ({"image": "vllm:latest tag"}, "label.image="),
        ({"architecture": {"active_params_b": 9}}, "active_params_b=9 is more than total_params_b=0.75"),
        ({"architecture": {"kv_heads": 0}}, "label.architecture.kv_heads=0: expected a positive integer"),
        ({"architecture": {"attention_kind": "gqa"}}, "label.architecture.attention_kind='gqa': expected one of"),
        (
            {"architecture": {"full_attention_layers": 10, "sliding_window_layers": 10, "sliding_window": 128}},
            "full_attention_layers=10 + sliding_window_layers=10: must add up to attention_layers=28",
        ),
        (
            {"architecture": {"full_attention_layers": 14, "sliding_window_layers": 14}},
            "label.architecture.sliding_window is missing",
        ),
        ({"architecture": {"sliding_window": 0}}, "label.architecture.sliding_window=0: expected a positive integer"),
        (
            {"architecture": {"attention_kind": "mla", "kv_lora_rank": 512, "qk_rope_head_dim": 64}},
            "attention_kind mla stores one latent vector per token and layer, so kv_heads must be 1",
        ),
        ({"architecture": {"attention_kind": "mla"}}, "attention_kind mla needs kv_lora_rank and qk_rope_head_dim"),
        ({"architecture": {"mamba_layers": 23}}, "label.architecture.mamba_kind=None: expected one of mamba2"),
        (
            {"architecture": {"mamba_layers": 23, "mamba_kind": "mamba2"}},
            "label.architecture.mamba_dims is missing: a mamba2 layer's state is sized from mamba_num_heads",
        ),
        ({"architecture": {"model_type": "qwen3_5_moe_text"}}, "label.architecture.mamba_layers is missing: a"),
        (
            {"architecture": {"mamba_state_bytes_per_sequence": 49082368}},
            "label.architecture.mamba_state_bytes_per_sequence: replaced by mamba_dims",
        ),
        ({"architecture": {"kv_cache_dtype_auto": "nvfp4"}}, "label.architecture.kv_cache_dtype_auto='nvfp4'"),
        ({"measured": {"decode_tok_s": 20}}, "label.measured.source is missing: say where the figure was"),
        ({"published_eval": {"source": "blog", "rows": []}}, "label.published_eval: expected a mapping with"),
        ({"published_eval": {"rows": [GOOD_ROW]}}, "label.published_eval.source is missing"),
        (
            {"published_eval": {"source": "blog", "rows": [{**GOOD_ROW, "prompt_tokens": "58"}]}},
            "label.published_eval.rows[0].prompt_tokens='58': expected a positive integer",
        ),
        (
            {"published_eval": {"source": "blog", "rows": [{**GOOD_ROW, "decode_tok_s": 0}]}},
            "label.published_eval.rows[0].decode_tok_s=0: expected a positive number",
        ),
        ({"published_arena": {"source": "arena", "rows": []}}, "label.published_arena: expected a mapping with"),
        (
            {"published_arena": {"rows": [{"depth": 0, "concurrency": 1, "decode_tok_s": 5}]}},
            "label.published_arena.source",
        ),
        (
            {"published_arena": {"source": "arena", "rows": [{"depth": -1, "concurrency": 1, "decode_tok_s": 5}]}},
            "label.published_arena.rows[0].depth=-1: expected the context depth in tokens (0 or more)",
        ),
        (
            {"published_arena": {"source": "arena", "rows": [{"depth": 0, "concurrency": 0, "decode_tok_s": 5}]}},
            "label.published_arena.rows[0].concurrency=0: expected a positive integer",
        ),
        (
            {"published_arena": {"source": "arena", "rows": [{"depth": 0, "concurrency": 1}]}},
            "label.published_arena.rows[0]: expected decode_tok_s or prefill_tok_s, or both",
        ),
        (
            {"published_arena": {"source": "arena", "rows": [{"depth": 0, "concurrency": 1, "prefill_tok_s": "fast"}]}},
            "label.published_arena.rows[0].prefill_tok_s='fast': expected a positive number",
        ),
    ],
)
def test_schema_problems_name_the_key_and_the_fix(override, expected):
    problems = schema_problems(apply_overrides(base(), override), "label")
    assert len(problems) == 1, problems
    assert expected in problems[0]


# --- what the memory planner reads: plan_problems (the planner checks no recipe value itself) ---------------

LABEL = "vllm_server_models[0]"

# Only the keys the planner reads, as a mapping handed to library/vllm_memory_plan holds them (the planner tests'
# Nemotron-3-Super fixture).
PLANNED_ONLY = NEMOTRON
PLANNED_ARCHITECTURE = PLANNED_ONLY["architecture"]


def test_a_mapping_of_only_what_the_planner_reads_passes():
    assert plan_problems(PLANNED_ONLY, LABEL) == []


# Moved from the planner's own checks (tests/unit/test_vllm_memory_plan.py), and the rules where the planner and the
# recipe schema used to disagree (each marked).
PLAN_BAD_INPUTS = [
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization=0: expected a fraction"),
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization=1.2: expected a fraction"),
    ({"gpu_memory_utilization": "0.85"}, "gpu_memory_utilization='0.85': expected a fraction"),
    ({"max_model_len": 0}, "max_model_len=0: expected a positive number of tokens"),
    ({"max_model_len": True}, "max_model_len=True: expected a positive number of tokens"),
    ({"max_model_len": 2097152}, "max_model_len=2097152: above the model's max_context 1,048,576"),
    ({"max_num_seqs": -1}, "max_num_seqs=-1: expected a positive integer"),
    ({"max_num_seqs": 2.5}, "max_num_seqs=2.5: expected a positive integer"),
    ({"max_num_seqs": None}, "max_num_seqs=None: expected a positive integer"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size=0: expected 1 (one Spark) to 8"),
    ({"tensor_parallel_size": 16}, "tensor_parallel_size=16: expected 1 (one Spark) to 8"),  # the planner took any
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size=0: expected 1 to 8"),
    ({"pipeline_parallel_size": "2"}, "pipeline_parallel_size='2': expected 1 to 8"),
    ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype='fp4': expected one of auto, bfloat16"),
    ({"kv_cache_dtype": "nvfp4"}, "kv_cache_dtype='nvfp4': expected one of auto, bfloat16"),  # vLLM has it
    ({"kv_cache_dtype": "fp8_ds_mla"}, "kv_cache_dtype='fp8_ds_mla': kv_cache_dtype 'fp8_ds_mla' is for multi-head"),
    ({"architecture": "120B"}, "architecture='120B': expected a mapping"),
    (
        {"architecture": {k: v for k, v in PLANNED_ARCHITECTURE.items() if k != "head_dim"}},
        "architecture.head_dim is missing: expected a positive integer",
    ),
    (
        {"architecture": {**PLANNED_ARCHITECTURE, "weight_bytes": -1}},
        "architecture.weight_bytes=-1: expected a positive",
    ),
    (
        {"architecture": {**PLANNED_ARCHITECTURE, "weight_bytes": float("inf")}},  # the schema took infinity
        "architecture.weight_bytes=inf: expected a positive number",
    ),
    ({"architecture": {**PLANNED_ARCHITECTURE, "attention_layers": 8.5}}, "architecture.attention_layers=8.5"),
    ({"architecture": {**PLANNED_ARCHITECTURE, "dtype": "int4"}}, "architecture.dtype='int4': expected the model's"),
    (
        {"architecture": {**PLANNED_ARCHITECTURE, "active_params_b": 130.0}},
        "architecture.active_params_b=130.0 is more than total_params_b=120.0",
    ),
    (
        {
            "architecture": {
                **PLANNED_ARCHITECTURE,
                "attention_kind": "mla",
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "kv_heads": 1,
                "head_dim": 192,
            }
        },
        "architecture: attention_kind mla stores one latent",
    ),
    ({"serve_flags": {"max-num-batched-tokens": 0}}, "serve_flags.max-num-batched-tokens=0: expected a positive"),
    ({"serve_flags": {"max-num-batched-tokens": "8192 tokens"}}, "serve_flags.max-num-batched-tokens='8192 tokens'"),
    ({"measured": {"decode_tok_s": 0, "source": "x"}}, "measured.decode_tok_s=0: expected a positive number"),
    ({"measured": {"source": "x"}}, "measured.decode_tok_s is missing"),  # the planner took no figure
]


@pytest.mark.parametrize(
    ("changes", "fragment"), PLAN_BAD_INPUTS, ids=[fragment.split(":")[0] for _, fragment in PLAN_BAD_INPUTS]
)
def test_plan_problems_name_the_key_and_the_fix(changes, fragment):
    problems = plan_problems({**PLANNED_ONLY, **changes}, LABEL)
    assert any(problem.startswith(f"{LABEL}.{fragment}") for problem in problems), problems


def test_a_key_the_planner_reads_is_named_when_missing():
    recipe = {key: value for key, value in PLANNED_ONLY.items() if key != "max_num_seqs"}
    assert plan_problems(recipe, LABEL) == [f"{LABEL}.max_num_seqs is missing: expected a positive integer"]


def test_a_recipe_that_is_not_a_mapping_is_refused_by_plan_problems():
    assert plan_problems(["not", "a", "recipe"], LABEL) == [
        f"{LABEL}: the recipe must be a mapping of recipe keys, not ['not', 'a', 'recipe']"
    ]


@pytest.mark.parametrize("tokens", [8192, "8192"])
def test_max_num_batched_tokens_may_be_written_as_text(tokens):
    assert plan_problems({**PLANNED_ONLY, "serve_flags": {"max-num-batched-tokens": tokens}}, LABEL) == []


@pytest.mark.parametrize("allow", ["1", "true", 1, True])
def test_long_context_is_allowed_when_the_recipe_env_says_so(allow):
    recipe = {**PLANNED_ONLY, "max_model_len": 2097152, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": allow}}
    assert plan_problems(recipe, LABEL) == []


def test_long_context_is_refused_without_the_env_and_the_reason_says_how():
    (problem,) = plan_problems({**PLANNED_ONLY, "max_model_len": 2097152}, LABEL)
    assert problem.startswith(f"{LABEL}.max_model_len=2097152: above the model's max_context 1,048,576")
    assert "set max_model_len to 1048576 or lower" in problem
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in problem


def test_every_recipe_problem_the_planner_reads_is_also_a_schema_problem():
    # schema_problems() runs plan_problems(): a whole recipe meets the planner's rules, one message each.
    bad = apply_overrides(base(), {"tensor_parallel_size": 16, "max_model_len": 10**9})
    problems = schema_problems(bad, "label")
    assert problems == plan_problems(bad, "label")
    assert [problem.split(":")[0] for problem in problems] == ["label.tensor_parallel_size=16"]


# --- reading a recipe a module option gives (a name, or a mapping) ------------------------------------------


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "recipes"
    directory.mkdir()
    for name in ("nemotron-3-super-fixture", "llama-70b-bf16-fixture"):
        data = {**PLANNED_ONLY, "name": name}
        (directory / f"{name}.yml").write_text(yaml.safe_dump(data), encoding="utf-8")
    (directory / "a-list.yml").write_text("- not\n- a mapping\n", encoding="utf-8")
    (directory / "README.md").write_text("not a recipe\n", encoding="utf-8")
    return directory


def test_a_named_recipe_is_read_from_its_file(recipes_dir):
    recipe, problems = read_recipe("nemotron-3-super-fixture", str(recipes_dir), LABEL)
    assert problems == []
    assert recipe == PLANNED_ONLY


def test_a_dict_recipe_needs_no_directory():
    assert read_recipe(PLANNED_ONLY, None, LABEL) == (PLANNED_ONLY, [])


@pytest.mark.parametrize(
    ("reference", "use_dir", "fragment"),
    [
        (
            "no-such-model",
            True,
            "recipe 'no-such-model' was not found: no {dir}/no-such-model.yml (available: a-list, "
            "llama-70b-bf16-fixture, nemotron-3-super-fixture)",
        ),
        ("../recipes/nemotron-3-super-fixture", True, "was not found"),
        ("a-list", True, "{dir}/a-list.yml does not hold a mapping of recipe keys"),
        ("nemotron-3-super-fixture", False, "is a name, so recipes_dir must say where the recipe files live"),
        (42, True, "the recipe must be a recipe name or a mapping of recipe keys, not 42"),
    ],
    ids=["not-found-lists-names", "no-paths", "not-a-mapping", "no-recipes-dir", "not-a-name"],
)
def test_bad_recipe_references_are_refused(recipes_dir, reference, use_dir, fragment):
    loaded, problems = read_recipe(reference, str(recipes_dir) if use_dir else None, LABEL)
    assert loaded is None
    (problem,) = problems
    assert problem.startswith(f"{LABEL}: ")
    assert fragment.format(dir=recipes_dir) in problem


def test_a_missing_recipes_dir_is_named(tmp_path):
    _, problems = read_recipe("x", str(tmp_path / "nowhere"), LABEL)
    assert problems == [f"{LABEL}: recipes_dir {tmp_path / 'nowhere'} is not a directory, so recipe 'x' cannot be read"]


def test_overrides_merge_mappings_and_replace_the_rest():
    merged = apply_overrides(
        recipe("nemotron-3-super-120b-a12b-nvfp4"),
        {"max_model_len": 65536, "serve_flags": {"enable-auto-tool-choice": None, "max-num-batched-tokens": 8192}},
    )
    assert merged["max_model_len"] == 65536
    assert merged["serve_flags"]["reasoning-parser"] == "nemotron_v3"
    args = serve_args(merged, FLAG_KINDS)
    assert "--enable-auto-tool-choice" not in args
    assert args[args.index("--max-num-batched-tokens") + 1] == "8192"
    assert args[args.index("--max-model-len") + 1] == "65536"


def test_false_turns_a_boolean_flag_off_and_json_flags_render_as_json():
    data = apply_overrides(
        base(), {"serve_flags": {"enable-prefix-caching": False, "speculative-config": {"method": "mtp"}}}
    )
    args = serve_args(data, FLAG_KINDS)
    # vLLM 0.33.0 pairs --enable-X with --disable-X (EnableDisableAction); --no-enable-X is only a hidden alias.
    assert "--disable-prefix-caching" in args
    assert "--no-enable-prefix-caching" not in args
    assert args[args.index("--speculative-config") + 1] == json.dumps({"method": "mtp"}, separators=(",", ":"))


def test_an_unknown_recipe_lists_the_known_ones():
    with pytest.raises(RecipeError, match=r"recipe 'llama-4' was not found: .*qwen3-0\.6b"):
        load_recipe("llama-4", RECIPES_DIR)


def test_a_recipe_that_is_not_a_mapping_is_refused(tmp_path):
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(["a", "b"]), encoding="utf-8")
    with pytest.raises(RecipeError, match="does not hold a mapping of recipe keys"):
        load_recipe("broken", tmp_path)


# --- the module, in-process (tests/unit/conftest.py's run_module) ---------------------------------------


def test_the_module_returns_the_merged_recipe_and_its_arguments(run_module):
    args = {"recipe": "qwen3-0.6b", "recipes_dir": str(RECIPES_DIR), "overrides": {"max_num_seqs": 2}}
    result = run_module("vllm_recipe", args, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["recipe"]["max_num_seqs"] == 2
    assert result["serve_args"][:3] == ["Qwen/Qwen3-0.6B", "--revision", recipe("qwen3-0.6b")["hf_revision"]]


def test_the_module_fails_naming_every_problem_and_the_label(run_module):
    overrides = {"max_model_len": "long", "serve_flags": {"tool-parser": "x"}}
    args = {"recipe": "qwen3-0.6b", "recipes_dir": str(RECIPES_DIR), "overrides": overrides}
    result = run_module("vllm_recipe", args | {"label": "vllm_server_models[1]"})
    assert result["failed"]
    assert len(result["problems"]) == 2
    assert "vllm_server_models[1].max_model_len='long'" in result["msg"]
    assert "vllm_server_models[1].serve_flags.tool-parser" in result["msg"]


# The NVIDIA playbook command the Qwen3.6 recipe cites; each flag is either in the recipe or named in its head
# comment under "Not followed" with the reason.
QWEN36_PLAYBOOK_FLAGS = {
    "trust-remote-code", "attention-backend", "moe-backend", "max-num-batched-tokens", "enable-chunked-prefill",
    "async-scheduling", "speculative-config", "enable-prefix-caching", "load-format", "reasoning-parser",
    "tool-call-parser", "enable-auto-tool-choice",
}  # fmt: skip


def test_qwen36_follows_its_playbook_or_says_why_not_per_flag():
    text = (RECIPES_DIR / "qwen3.6-35b-a3b-nvfp4.yml").read_text(encoding="utf-8")
    not_followed = text.split("# Not followed:", 1)[1].split("\nname:", 1)[0]
    flags = set(recipe("qwen3.6-35b-a3b-nvfp4")["serve_flags"])
    for flag in QWEN36_PLAYBOOK_FLAGS:
        assert flag in flags or f"--{flag}" in not_followed, f"--{flag}: neither followed nor explained"


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yml")), ids=lambda path: path.stem)
def test_every_catalog_recipe_names_a_model_type_the_figures_know(path):
    from model_config_figures import FAMILIES

    architecture = yaml.safe_load(path.read_text())["architecture"]
    family = FAMILIES[architecture["model_type"]]  # a KeyError names a model type without a rule
    assert (architecture.get("mamba_kind") or None) == family.recurrent_layers


def test_gpt_oss_120b_carries_the_published_arena_figure():
    published = recipe("gpt-oss-120b")["published_arena"]
    assert published["rows"] == [{"depth": 0, "concurrency": 1, "decode_tok_s": 58.82}]
    assert "sectorhq.co" in published["source"]


def test_served_aliases_are_more_names_on_the_command_line_each_checked():
    from recipe_rules import schema_problems, serve_args
    from vllm_flags import load_flag_list

    recipe = {**load_recipe("qwen3-0.6b", RECIPES_DIR), "served_aliases": ["gpt-4o-mini", "small"]}
    assert schema_problems(recipe, "r") == []
    args = serve_args(recipe, load_flag_list(RECIPES_DIR / "vllm-serve-flags.txt"))
    assert args[args.index("--served-model-name") : args.index("--served-model-name") + 4] == [
        "--served-model-name",
        "qwen3-0.6b",
        "gpt-4o-mini",
        "small",
    ]
    assert schema_problems({**recipe, "served_aliases": ["qwen3-0.6b"]}, "r") == [
        "r.served_aliases: qwen3-0.6b named twice; each name once"
    ]
    (bad,) = schema_problems({**recipe, "served_aliases": ["a b"]}, "r")
    assert bad.startswith("r.served_aliases[0]='a b': a served name; this one ")
    assert schema_problems({**recipe, "served_aliases": "x"}, "r") == [
        "r.served_aliases: expected a list of names, e.g. [gpt-4o-mini], or no served_aliases"
    ]
