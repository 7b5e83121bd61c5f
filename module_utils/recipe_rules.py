"""Model recipes: load one, apply inventory overrides, check it, and turn it into `vllm serve` arguments.

A recipe is data (recipes/<name>.yml, schema in recipes/README.md). Everything that can be wrong with one is
found here, on the controller, before a host is touched: a key of the wrong type, a flag the pinned vLLM
does not have (a typo would otherwise fail only after a 15-minute weight load), a secret in the wrong place, a
value the memory planner cannot plan. This is the one recipe validator: the memory planner
(module_utils/memory_plan.py) plans only what plan_problems() passes and has no input rules of its own.
Problems are returned as a list of messages that name the inventory variable (``label``) and the fix.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from ansible.module_utils import input_rules, model_kinds, model_lock, parallel_layout, speculative
from ansible.module_utils.kv_cache_pages import mamba_dims_problems
from ansible.module_utils.model_config_figures import (
    FAMILIES,
    KV_CACHE_DTYPE_BYTES,
    MLA_STATE_BYTES,
    MODEL_DTYPE_BYTES,
    FiguresError,
    kv_bytes_per_token_per_layer,
)

# The planner's four values: top-level recipe keys, rendered as these flags.
PLANNED_FLAGS = {
    "gpu_memory_utilization": "gpu-memory-utilization",
    "max_model_len": "max-model-len",
    "max_num_seqs": "max-num-seqs",
    "kv_cache_dtype": "kv-cache-dtype",
}
# Flags the role sets itself from other variables; a recipe that sets them would fight the role.
ROLE_FLAGS = {
    "model": "hf_repo",
    "revision": "hf_revision",
    "served-model-name": "served_model_name (and served_aliases)",
    "tensor-parallel-size": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "host": "vllm_server_listen_address",
    "port": "the port of the vllm_server_models entry",
    "api-key": "vllm_server_api_key (kept in a root-only file)",
    "hf-token": "vllm_server_hf_token (kept in a root-only file)",
    "kv-cache-memory-bytes": "kv_cache_memory_gib (the KV cache in GiB, which the memory planner counts)",
}
# Environment variables that carry secrets: never in a recipe (recipes are committed and shown in logs).
SECRET_ENV = {
    "HF_TOKEN": "vllm_server_hf_token",
    "HUGGING_FACE_HUB_TOKEN": "vllm_server_hf_token",
    "VLLM_API_KEY": "vllm_server_api_key",
}

NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# A flag value written as text that means a number, as YAML gives "8192".
WHOLE_NUMBER_TEXT = re.compile(r"[0-9]+")

# kv_cache_dtype: "auto" (resolved_kv_cache_dtype() says what it means) or a dtype whose KV cache the KV rules of
# module_utils/model_config_figures.py size. The pinned vLLM has more choices; the planner cannot size those.
KV_CACHE_DTYPES = ("auto", *KV_CACHE_DTYPE_BYTES, *MLA_STATE_BYTES)

ARCHITECTURE_NUMBERS = ("total_params_b", "active_params_b", "bytes_per_param", "weight_bytes")
ARCHITECTURE_COUNTS = ("attention_layers", "kv_heads", "head_dim", "max_context")
# Optional architecture keys that describe the attention kinds (library/hf_model_figures returns them; recipes/
# README.md). Without them a recipe means: every attention layer is full attention, no Mamba state.
ATTENTION_KINDS = ("full", "mla")
ARCHITECTURE_OPTIONAL_COUNTS = ("full_attention_layers", "sliding_window_layers", "mamba_layers", "attention_heads")
MAMBA_KINDS = ("mamba2", "gated_delta_net")
# The full-attention layers' own KV heads and head size, where they differ from kv_heads and head_dim (Gemma 4's
# global layers: global_head_dim, num_global_key_value_heads); each page size then its own (kv_cache_pages.py).
FULL_ATTENTION_HEADS = ("full_attention_kv_heads", "full_attention_head_dim")
# The hybrid model types (config.json's model_type, of the text model) and the recurrent layers vLLM builds for
# them: a recipe naming one must declare those layers (model_config_figures.FAMILIES says which families are hybrid).
HYBRID_MODEL_TYPES = {name: family.recurrent_layers for name, family in FAMILIES.items() if family.recurrent_layers}
# What kv_cache_dtype "auto" may resolve to for a checkpoint (the model dtype, or a ModelOpt checkpoint's FP8).
KV_CACHE_DTYPES_AUTO = ("bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")
PUBLISHED_EVAL_COUNTS = ("prompt_tokens", "output_tokens")
PUBLISHED_EVAL_FIGURES = ("ttft_s", "total_s", "prefill_tok_s", "decode_tok_s")


class RecipeError(Exception):
    """A recipe that cannot be loaded at all (missing file, not YAML, not a mapping)."""


# --- loading and overriding ----------------------------------------------------------------------------------


def recipe_names(recipes_dir: str | Path) -> list[str]:
    """The recipes in a folder: every <name>.yml."""
    return sorted(path.stem for path in Path(recipes_dir).glob("*.yml"))


def load_recipe(name: str, recipes_dir: str | Path) -> dict:
    """The recipe <recipes_dir>/<name>.yml as a dict; RecipeError names the file and the recipes that exist.
    The one recipe loader: library/vllm_recipe, library/vllm_models and library/vllm_memory_plan all read through it."""
    import yaml  # PyYAML ships with Ansible; imported here so the pure functions below need nothing

    folder = Path(recipes_dir)
    if not folder.is_dir():
        raise RecipeError(f"recipes_dir {recipes_dir} is not a directory, so recipe {name!r} cannot be read")
    path = folder / f"{name}.yml"
    if not NAME.match(name or "") or not path.is_file():
        known = ", ".join(recipe_names(recipes_dir)) or "none"
        raise RecipeError(f"recipe {name!r} was not found: no {path} (available: {known})")
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise RecipeError(f"recipe {name!r} could not be read from {path}: {error}") from error
    if not isinstance(recipe, dict):
        raise RecipeError(f"{path} does not hold a mapping of recipe keys (it holds {type(recipe).__name__})")
    return recipe


def read_recipe(recipe: object, recipes_dir: str | None, label: str = "recipe") -> tuple[dict | None, list[str]]:
    """The recipe a module option gives: a mapping as it is, or a name read from <recipes_dir>/<name>.yml by
    load_recipe(). Returns (recipe, []) or (None, [the problem, naming `label`])."""
    if isinstance(recipe, Mapping):
        return dict(recipe), []
    if not isinstance(recipe, str) or not recipe:
        return None, [f"{label}: the recipe must be a recipe name or a mapping of recipe keys, not {recipe!r}"]
    if not recipes_dir:
        return None, [f"{label}: recipe {recipe!r} is a name, so recipes_dir must say where the recipe files live"]
    try:
        return load_recipe(recipe, recipes_dir), []
    except RecipeError as error:
        return None, [f"{label}: {error}"]


def apply_overrides(recipe: dict, overrides: dict) -> dict:
    """The recipe with `overrides` laid over it: mappings merge key by key, anything else replaces."""
    merged = dict(recipe)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = apply_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- the schema ----------------------------------------------------------------------------------------------
# The one definition of what a recipe may hold. schema_problems() checks a whole recipe; plan_problems() checks the
# part the memory planner reads, and is the only check the planner asks for (module_utils/memory_plan.py plans
# nothing it refuses), so a mapping handed to library/vllm_memory_plan meets the very rules of a recipe file.


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """An int or a finite float (YAML can write .inf and .nan; no figure of a model is either)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: object) -> bool:
    return _is_int(value) and value > 0


def _positive_number(value: object) -> bool:
    return _is_number(value) and value > 0


def _why(kind: str, value: object) -> str:
    """What input_rules says about a value, as the end of a sentence."""
    return input_rules.problem(kind, value) or "is good"


def _problem(mapping: Mapping, key: str, label: str, expected: str) -> str:
    """The message for a bad key: '<label>.<key> is missing: expected ...' or '<label>.<key>=<value>: expected ...'."""
    if key not in mapping:
        return f"{label}.{key} is missing: expected {expected}"
    return f"{label}.{key}={mapping[key]!r}: expected {expected}"


def _checker(recipe: Mapping, label: str, problems: list[str]) -> Callable[[str, bool, str], None]:
    """need(key, ok, expected): records _problem() for `key` in `problems` unless ok."""

    def need(key: str, ok: bool, expected: str) -> None:
        if not ok:
            problems.append(_problem(recipe, key, label, expected))

    return need


def schema_problems(recipe: dict, label: str = "recipe") -> list[str]:
    """Every way `recipe` departs from the schema in recipes/README.md, one message each: what names and places
    the model, its flags, environment, sources and published evaluation here, and what the memory planner reads
    through plan_problems()."""
    problems: list[str] = []
    need = _checker(recipe, label, problems)
    get = recipe.get
    need("name", isinstance(get("name"), str) and bool(NAME.match(get("name"))), "a name like 'gpt-oss-120b'")
    need("description", isinstance(get("description"), str) and bool(get("description")), "one line of text")
    need(
        "hf_repo",
        input_rules.hf_repo(get("hf_repo")) is None,
        "'org/model', the model's Hugging Face repo id (e.g. Qwen/Qwen3-0.6B)",
    )
    need(
        "hf_revision",
        input_rules.hf_commit(get("hf_revision")) is None,
        "a pinned commit of the Hugging Face repo: 40 lowercase hex digits (set it in the recipe or per host in the "
        "vllm_server_models entry; or leave it null and the models lock holds the commit its hf_branch, default "
        "main, resolves to)",
    )
    problems += model_lock.branch_problems(recipe, label)
    # The served name lands in unit and file names, Prometheus labels and printed curl lines: a safe set only.
    served = get("served_model_name")
    need(
        "served_model_name",
        input_rules.served_name(served) is None,
        f"a served name; this one {_why('served_name', served)}",
    )
    problems += _alias_problems(recipe, label)
    if "image" in recipe and get("image") not in ("", None):
        need(
            "image",
            input_rules.image(get("image")) is None,
            f"an image reference; this one {_why('image', get('image'))}",
        )
    need("serve_flags", isinstance(get("serve_flags"), dict), "a mapping of flag name to value ({} for none)")
    problems += model_kinds.kind_problems(recipe, label)
    need("env", isinstance(get("env"), dict), "a mapping of variable name to text ({} for none)")
    need("sources", isinstance(get("sources"), dict), "a mapping with 'flags' and 'architecture'")
    if isinstance(get("sources"), dict):
        for key in ("flags", "architecture"):
            if not isinstance(get("sources").get(key), str) or not get("sources")[key]:
                problems.append(f"{label}.sources.{key} is missing: say where the figures were published")
    if isinstance(get("env"), dict):
        problems += _env_problems(get("env"), f"{label}.env")
    if "published_eval" in recipe:
        problems += _published_problems(get("published_eval"), f"{label}.published_eval", _eval_row_problems)
    if "published_arena" in recipe:
        problems += _published_problems(get("published_arena"), f"{label}.published_arena", _arena_row_problems)
    if "published_topology" in recipe:
        problems += _topology_problems(get("published_topology"), f"{label}.published_topology")
    return problems + plan_problems(recipe, label)


def _topology_problems(published: object, label: str) -> list[str]:
    """published_topology (optional): the model measured on a group of `sparks` against as many Sparks serving
    alone behind a router, decode tok/s per concurrency (module_utils/topology.py shows it)."""
    problems = _published_problems(published, label, _topology_row_problems)
    if isinstance(published, dict):
        sparks = published.get("sparks")
        if not (_is_int(sparks) and 2 <= sparks <= parallel_layout.MAX_GROUP):
            problems.append(f"{label}.sparks={sparks!r}: expected the group's size, 2 to {parallel_layout.MAX_GROUP}")
        if not isinstance(published.get("measured"), str) or not published["measured"]:
            problems.append(f"{label}.measured is missing: say how it was measured (tool, prompt, output, date)")
    return problems


def _topology_row_problems(row: dict, where: str) -> list[str]:
    problems = [] if _positive_int(row.get("concurrency")) else [f"{where}.concurrency: expected a positive integer"]
    for key in ("group_tok_s", "solo_tok_s"):
        if not _positive_number(row.get(key)):
            problems.append(f"{where}.{key}={row.get(key)!r}: expected a positive number")
    return problems


def _alias_problems(recipe: dict, label: str) -> list[str]:
    """served_aliases (optional): more names the model answers to, each a served name, none repeated."""
    aliases = recipe.get("served_aliases")
    if aliases is None:
        return []
    if not isinstance(aliases, list) or not aliases:
        return [f"{label}.served_aliases: expected a list of names, e.g. [gpt-4o-mini], or no served_aliases"]
    problems = []
    for index, alias in enumerate(aliases):
        why = input_rules.served_name(alias)
        if why is not None:
            problems.append(f"{label}.served_aliases[{index}]={alias!r}: a served name; this one {why}")
    names = [recipe.get("served_model_name"), *aliases]
    repeated = sorted({str(name) for name in names if names.count(name) > 1})
    if repeated:
        problems.append(f"{label}.served_aliases: {', '.join(repeated)} named twice; each name once")
    return problems


def _published_problems(published: object, label: str, row_problems) -> list[str]:
    """An optional block of published figures (published_eval, published_arena): a source and a non-empty list of
    rows, each mapping checked by ROW_PROBLEMS(row, where)."""
    key = label.rsplit(".", 1)[-1]
    if not isinstance(published, dict) or not isinstance(published.get("rows"), list) or not published["rows"]:
        return [f"{label}: expected a mapping with 'source' and a non-empty list 'rows', or no '{key}'"]
    problems = []
    if not isinstance(published.get("source"), str) or not published["source"]:
        problems.append(f"{label}.source is missing: say where the figures were published")
    for index, row in enumerate(published["rows"]):
        where = f"{label}.rows[{index}]"
        problems += row_problems(row, where) if isinstance(row, dict) else [f"{where}: expected a mapping"]
    return problems


def _eval_row_problems(row: dict, where: str) -> list[str]:
    """A published evaluation's row (library/vllm_bench compares against it, by scenario name)."""
    problems = []
    if not isinstance(row.get("scenario"), str) or not row["scenario"]:
        problems.append(f"{where}.scenario: expected the scenario's name as published")
    for key in PUBLISHED_EVAL_COUNTS:
        if not _positive_int(row.get(key)):
            problems.append(f"{where}.{key}={row.get(key)!r}: expected a positive integer")
    for key in PUBLISHED_EVAL_FIGURES:
        if not _positive_number(row.get(key)):
            problems.append(f"{where}.{key}={row.get(key)!r}: expected a positive number")
    return problems


def _arena_row_problems(row: dict, where: str) -> list[str]:
    """A published Spark Arena row (vllm_bench's Arena table shows it, by depth and concurrency): depth (>= 0),
    concurrency (>= 1) and decode_tok_s and/or prefill_tok_s."""
    problems = []
    if not (_is_int(row.get("depth")) and row["depth"] >= 0):
        problems.append(f"{where}.depth={row.get('depth')!r}: expected the context depth in tokens (0 or more)")
    if not _positive_int(row.get("concurrency")):
        problems.append(f"{where}.concurrency={row.get('concurrency')!r}: expected a positive integer")
    figures = [key for key in ("decode_tok_s", "prefill_tok_s") if key in row]
    if not figures:
        problems.append(f"{where}: expected decode_tok_s or prefill_tok_s, or both")
    for key in figures:
        if not _positive_number(row[key]):
            problems.append(f"{where}.{key}={row[key]!r}: expected a positive number")
    return problems


def _env_problems(env: dict, label: str) -> list[str]:
    problems = []
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            problems.append(f"{label}: {key!r} is not an environment variable name")
        elif key in SECRET_ENV:
            problems.append(f"{label}.{key}: secrets never go in a recipe; set {SECRET_ENV[key]} instead")
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            problems.append(f'{label}.{key}={value!r}: expected text (quote it, e.g. "1")')
        elif input_rules.text(str(value)):
            problems.append(f"{label}.{key}={value!r}: {input_rules.text(str(value))}: one line of text only")
    return problems


# --- what the memory planner reads ---------------------------------------------------------------------------


def plan_problems(recipe: object, label: str = "recipe") -> list[str]:
    """Every problem with what the memory planner reads, one message each: tensor_parallel_size, the four planned
    values, the architecture, serve_flags.max-num-batched-tokens and the measured speed, and then, together,
    max_model_len within the model's context and a KV cache dtype the KV rules size for its attention.
    serve_flags, env and measured may be absent here (schema_problems() requires the first two)."""
    if not isinstance(recipe, Mapping):
        return [f"{label}: the recipe must be a mapping of recipe keys, not {recipe!r}"]
    problems: list[str] = []
    need = _checker(recipe, label, problems)
    get = recipe.get
    # One Spark, or a group of them linked by ConnectX-7, one GPU each: tensor x pipeline parallel Sparks.
    sizes = range(1, parallel_layout.MAX_GROUP + 1)
    need(
        "tensor_parallel_size",
        _is_int(get("tensor_parallel_size")) and get("tensor_parallel_size") in sizes,
        f"1 (one Spark) to {parallel_layout.MAX_GROUP}: the Sparks that split each layer",
    )
    if get("pipeline_parallel_size") is not None:
        need(
            "pipeline_parallel_size",
            _is_int(get("pipeline_parallel_size")) and get("pipeline_parallel_size") in sizes,
            f"1 to {parallel_layout.MAX_GROUP}: the stages the layers split into, each on its own Sparks (or leave "
            "it out: 1)",
        )
    utilization = get("gpu_memory_utilization")
    need(
        "gpu_memory_utilization",
        _is_number(utilization) and 0 < utilization < 1,
        "a fraction of the shared memory pool between 0 and 1 (exclusive), e.g. 0.85",
    )
    need("max_model_len", _positive_int(get("max_model_len")), "a positive number of tokens")
    need("max_num_seqs", _positive_int(get("max_num_seqs")), "a positive integer")
    # Optional: the KV cache sized in GiB (--kv-cache-memory-bytes) instead of what the share leaves.
    if get("kv_cache_memory_gib") is not None:
        need(
            "kv_cache_memory_gib",
            _positive_number(get("kv_cache_memory_gib")),
            "a positive number of GiB for the KV cache, e.g. 20, or null to size it from gpu_memory_utilization",
        )
    # The pinned vLLM may offer more (--kv-cache-dtype in the flag list, which flag_problems checks): these are the
    # ones whose KV cache the planner can size.
    need(
        "kv_cache_dtype",
        isinstance(get("kv_cache_dtype"), str) and get("kv_cache_dtype") in KV_CACHE_DTYPES,
        f"one of {', '.join(KV_CACHE_DTYPES)} (the KV cache dtypes the memory planner sizes)",
    )
    architecture = get("architecture")
    need("architecture", isinstance(architecture, Mapping), "a mapping of the model's figures (see recipes/README.md)")
    if isinstance(architecture, Mapping):
        problems += _architecture_problems(architecture, f"{label}.architecture")
    problems += _batching_problems(get("serve_flags"), f"{label}.serve_flags")
    problems += _measured_problems(get("measured"), f"{label}.measured")
    if problems:
        return problems
    found = _context_problems(recipe, label) + _kv_layout_problems(recipe, label) + _parallel_problems(recipe, label)
    return found + speculative.draft_plan_problems(recipe, label) + _own_heads_draft_problems(recipe, label)


def _own_heads_draft_problems(recipe: Mapping, label: str) -> list[str]:
    """A draft beside full-attention layers with heads of their own (Gemma 4): the planner counts draft layers as
    full-attention layers of the target's heads, which such a model's drafts do not have (gemma4_mtp shares the
    target's cache; an EAGLE draft has its own heads), so the plan would be wrong."""
    own = [key for key in FULL_ATTENTION_HEADS if recipe["architecture"].get(key) is not None]
    if own and recipe.get("speculative"):
        return [
            f"{label}.speculative: not planned for a model whose full-attention layers have heads of their own "
            f"({label}.architecture.{own[0]}); serve it without speculative decoding (remove speculative, or set "
            "vllm_server_speculation: false)"
        ]
    return []


def _parallel_problems(recipe: Mapping, label: str) -> list[str]:
    """vLLM's rules for splitting the model over its group (module_utils/parallel_layout.py)."""
    architecture = recipe["architecture"]
    found = parallel_layout.problems(
        label,
        recipe["tensor_parallel_size"],
        recipe.get("pipeline_parallel_size") or 1,
        attention_heads=architecture.get("attention_heads"),
        kv_heads=architecture["kv_heads"],
        layers=architecture["attention_layers"] + (architecture.get("mamba_layers") or 0),
    )
    # Full-attention layers with KV heads of their own (Gemma 4) are split by the same rule.
    own = architecture.get("full_attention_kv_heads")
    if own and own != architecture["kv_heads"]:
        found += parallel_layout.problems(
            f"{label} (full-attention layers)",
            recipe["tensor_parallel_size"],
            1,
            attention_heads=None,
            kv_heads=own,
            layers=None,
        )
    return found


def _architecture_problems(architecture: Mapping, label: str) -> list[str]:
    problems = []
    for key in ARCHITECTURE_NUMBERS:
        if not _positive_number(architecture.get(key)):
            problems.append(_problem(architecture, key, label, "a positive number"))
    for key in ARCHITECTURE_COUNTS:
        if not _positive_int(architecture.get(key)):
            problems.append(_problem(architecture, key, label, "a positive integer"))
    if architecture.get("dtype") not in MODEL_DTYPE_BYTES:
        expected = f"the model's torch_dtype, one of {', '.join(MODEL_DTYPE_BYTES)}"
        problems.append(_problem(architecture, "dtype", label, expected))
    total, active = architecture.get("total_params_b"), architecture.get("active_params_b")
    if _is_number(total) and _is_number(active) and active > total:
        problems.append(
            f"{label}.active_params_b={active} is more than total_params_b={total}: a model cannot read more "
            "parameters per token than it has"
        )
    return problems + _attention_problems(architecture, label)


def whole_number(value: object) -> object:
    """A flag value as the number it stands for: text of ASCII digits (YAML's "8192") as an int, else unchanged."""
    if isinstance(value, str) and WHOLE_NUMBER_TEXT.fullmatch(value.strip()):
        return int(value)
    return value


def _batching_problems(serve_flags: object, label: str) -> list[str]:
    """--max-num-batched-tokens, which the planner reads: a sliding-window layer keeps that many tokens in flight."""
    if not isinstance(serve_flags, Mapping):
        return []  # schema_problems() requires the mapping; without one, vLLM's default applies
    tokens = serve_flags.get("max-num-batched-tokens")
    if tokens is None or _positive_int(whole_number(tokens)):
        return []
    return [f"{label}.max-num-batched-tokens={tokens!r}: expected a positive whole number of tokens"]


def _measured_problems(measured: object, label: str) -> list[str]:
    """The optional measured decode speed, which the plan's summary prints beside its bandwidth bound."""
    if measured is None:
        return []
    if not isinstance(measured, Mapping):
        return [f"{label}={measured!r}: expected a mapping with decode_tok_s and source, or no 'measured' at all"]
    problems = []
    if not _positive_number(measured.get("decode_tok_s")):
        problems.append(_problem(measured, "decode_tok_s", label, "a positive number of tokens/s"))
    if not isinstance(measured.get("source"), str) or not measured["source"]:
        problems.append(f"{label}.source is missing: say where the figure was measured or published")
    return problems


def long_context_allowed(recipe: Mapping) -> bool:
    """Whether the recipe's env lets vLLM accept max_model_len above the model's max_position_embeddings."""
    env = recipe.get("env")
    if not isinstance(env, Mapping):
        return False
    return str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower() in ("1", "true")


def _context_problems(recipe: Mapping, label: str) -> list[str]:
    """max_model_len above the model's context, which vLLM refuses unless the recipe's env allows it."""
    max_model_len, max_context = recipe["max_model_len"], recipe["architecture"]["max_context"]
    if max_model_len <= max_context or long_context_allowed(recipe):
        return []
    return [
        f"{label}.max_model_len={max_model_len}: above the model's max_context {max_context:,}, which vLLM refuses; "
        f"set max_model_len to {max_context} or lower (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in {label}.env when "
        "the model is known to work beyond it)"
    ]


def resolved_kv_cache_dtype(recipe: Mapping) -> str:
    """The KV cache dtype vLLM uses for a checked recipe: its kv_cache_dtype, or for "auto" the checkpoint's
    (architecture.kv_cache_dtype_auto, e.g. a ModelOpt FP8 checkpoint's), else the model's dtype."""
    if recipe["kv_cache_dtype"] != "auto":
        return recipe["kv_cache_dtype"]
    architecture = recipe["architecture"]
    return architecture.get("kv_cache_dtype_auto") or architecture["dtype"]


def _kv_layout_problems(recipe: Mapping, label: str) -> list[str]:
    """A KV cache dtype the KV rules (module_utils/model_config_figures.py) cannot size for this attention, such as
    an MLA-only layout on a model without multi-head latent attention."""
    architecture = recipe["architecture"]
    kind = architecture.get("attention_kind", "full")
    dtype = resolved_kv_cache_dtype(recipe)
    if kind == "mla" and dtype in MLA_STATE_BYTES:
        return [
            f"{label}.kv_cache_dtype={recipe['kv_cache_dtype']!r}: vLLM 0.33 offers {dtype} only in its sparse-MLA "
            "backends (DeepSeek-V3.2-style models with an indexer); on a Spark (compute capability 12.x) a dense MLA "
            "model runs TRITON_MLA, which takes auto, bfloat16, float16, fp8 and fp8_e4m3 "
            "(platforms/cuda.py _get_backend_priorities, v1/attention/backends/mla/triton_mla.py): use fp8 for half "
            "the KV bytes"
        ]
    try:
        kv_bytes_per_token_per_layer(
            kind, architecture["kv_heads"], architecture["head_dim"], resolved_kv_cache_dtype(recipe)
        )
    except FiguresError as error:
        return [f"{label}.kv_cache_dtype={recipe['kv_cache_dtype']!r}: {error}"]
    return []


# --- the attention kinds -------------------------------------------------------------------------------------


def _attention_problems(architecture: Mapping, label: str) -> list[str]:
    """The optional attention keys (attention_kind, full/sliding/Mamba layer counts, MLA dimensions,
    kv_cache_dtype_auto): each of the right type, and together consistent with attention_layers, kv_heads and
    head_dim."""
    problems = []
    get = architecture.get
    kind = get("attention_kind", "full")
    if kind not in ATTENTION_KINDS:
        problems.append(f"{label}.attention_kind={kind!r}: expected one of {', '.join(ATTENTION_KINDS)}")
    for key in ARCHITECTURE_OPTIONAL_COUNTS:
        if get(key) is not None and not (_is_int(get(key)) and get(key) >= 0):
            problems.append(f"{label}.{key}={get(key)!r}: expected a whole number, 0 or more")
    for key in ("sliding_window", "kv_lora_rank", "qk_rope_head_dim", *FULL_ATTENTION_HEADS):
        if get(key) is not None and not _positive_int(get(key)):
            problems.append(f"{label}.{key}={get(key)!r}: expected a positive integer (or null)")
    if get("mamba_state_bytes_per_sequence") is not None:
        problems.append(
            f"{label}.mamba_state_bytes_per_sequence: replaced by mamba_dims (vLLM pads and multiplies the state "
            "per layer, so the planner sizes it from the dimensions; library/hf_model_figures measures them)"
        )
    if get("mamba_kind") is not None and get("mamba_kind") not in MAMBA_KINDS:
        problems.append(f"{label}.mamba_kind={get('mamba_kind')!r}: expected one of {', '.join(MAMBA_KINDS)} or null")
    model_type = get("model_type")
    if model_type is not None and not (isinstance(model_type, str) and model_type):
        problems.append(f"{label}.model_type={model_type!r}: expected config.json's model_type, e.g. nemotron_h")
    auto = get("kv_cache_dtype_auto")
    if auto is not None and auto not in KV_CACHE_DTYPES_AUTO:
        problems.append(
            f"{label}.kv_cache_dtype_auto={auto!r}: expected one of {', '.join(KV_CACHE_DTYPES_AUTO)} (another "
            "cache layout is not modelled: set kv_cache_dtype explicitly)"
        )
    if problems:
        return problems
    return _attention_consistency(architecture, label, kind)


def _attention_consistency(architecture: Mapping, label: str, kind: str) -> list[str]:
    """The attention keys together: layer counts that add up, a window for sliding layers, a state for Mamba layers,
    and MLA's one latent vector per token and layer."""
    problems = []
    get = architecture.get
    layers, sliding = get("attention_layers"), get("sliding_window_layers") or 0
    full = get("full_attention_layers")
    if _positive_int(layers) and full is not None and full + sliding != layers:
        problems.append(
            f"{label}.full_attention_layers={full} + sliding_window_layers={sliding}: must add up to "
            f"attention_layers={layers}"
        )
    elif _positive_int(layers) and sliding > layers:
        problems.append(f"{label}.sliding_window_layers={sliding}: more than attention_layers={layers}")
    if sliding and get("sliding_window") is None:
        problems.append(
            f"{label}.sliding_window is missing: {sliding} sliding_window_layers need the window, in tokens"
        )
    problems += _recurrent_problems(architecture, label)
    if kind == "mla":
        rank, rope = get("kv_lora_rank"), get("qk_rope_head_dim")
        if rank is None or rope is None:
            problems.append(f"{label}: attention_kind mla needs kv_lora_rank and qk_rope_head_dim")
        elif get("head_dim") != rank + rope or get("kv_heads") != 1:
            problems.append(
                f"{label}: attention_kind mla stores one latent vector per token and layer, so kv_heads must be 1 "
                f"and head_dim kv_lora_rank + qk_rope_head_dim = {rank + rope} (found kv_heads={get('kv_heads')!r}, "
                f"head_dim={get('head_dim')!r})"
            )
    elif get("kv_lora_rank") is not None:
        problems.append(f"{label}.kv_lora_rank={get('kv_lora_rank')}: only for attention_kind mla")
    own_heads = [key for key in FULL_ATTENTION_HEADS if get(key) is not None]
    if own_heads and (kind == "mla" or get("mamba_layers")):
        problems.append(
            f"{label}.{own_heads[0]}: the full-attention layers' own heads are modelled for attention models without "
            "Mamba layers or MLA only"
        )
    return problems


def _recurrent_problems(architecture: Mapping, label: str) -> list[str]:
    """A hybrid model's recurrent (Mamba-2 / Gated DeltaNet) layers: declared whenever its model_type is a hybrid
    one, each with the dimensions vLLM sizes its state from (module_utils/kv_cache_pages.py)."""
    get = architecture.get
    layers, kind, model_type = get("mamba_layers") or 0, get("mamba_kind"), get("model_type")
    if model_type in HYBRID_MODEL_TYPES and not layers:
        return [
            f"{label}.mamba_layers is missing: a {model_type!r} model has {HYBRID_MODEL_TYPES[model_type]} layers "
            "that keep a state per sequence; declare mamba_kind, mamba_layers and mamba_dims from config.json "
            "(library/hf_model_figures measures them)"
        ]
    if model_type in HYBRID_MODEL_TYPES and kind is not None and kind != HYBRID_MODEL_TYPES[model_type]:
        return [f"{label}.mamba_kind={kind!r}: a {model_type!r} model's layers are {HYBRID_MODEL_TYPES[model_type]}"]
    if not layers:
        if kind is not None or get("mamba_dims") is not None:
            return [f"{label}: mamba_kind / mamba_dims without mamba_layers: how many layers keep that state?"]
        return []
    return mamba_dims_problems(kind, get("mamba_dims"), label)


# --- the flag list of the pinned vLLM ------------------------------------------------------------------------
# `flag_specs` maps a flag name (no dashes) to its FlagSpec (module_utils/vllm_flags.py: .kind, .off, .choices),
# read from the committed list in preflight or from the pinned image's own help on the Spark.


def flag_problems(recipe: dict, flag_specs: dict, label: str = "recipe", source: str = "the pinned vLLM") -> list[str]:
    """Every flag or planned value vLLM would refuse, or that belongs elsewhere, with the fix."""
    problems = []
    for key, flag in PLANNED_FLAGS.items():
        spec = flag_specs.get(flag)
        value = recipe.get(key)
        if spec is None:
            problems.append(f"{label}.{key}: --{flag} is not a flag of `vllm serve` in {source}")
        elif spec.choices and value is not None and str(value) not in spec.choices:
            problems.append(f"{label}.{key}={value!r}: {source} accepts one of {', '.join(spec.choices)}")
    flags = recipe.get("serve_flags")
    if not isinstance(flags, dict):
        return problems
    for name, value in flags.items():
        where = f"{label}.serve_flags.{name}"
        if not isinstance(name, str) or not FLAG_NAME.match(name):
            problems.append(f"{where}: write flags dashed and without the leading '--' (e.g. max-num-batched-tokens)")
            continue
        planned = {flag: key for key, flag in PLANNED_FLAGS.items()}
        if name in planned:
            problems.append(f"{where}: set {label}.{planned[name]} instead (the memory planner reads it there)")
        elif name == "speculative-config":
            problems.append(
                f"{where}: write it as {label}.speculative (method, num_speculative_tokens, draft), which preflight "
                "checks against vLLM's SpeculativeConfig and the memory planner counts"
            )
        elif name in ROLE_FLAGS:
            problems.append(f"{where}: the role sets --{name} from {ROLE_FLAGS[name]}; remove it here")
        elif name not in flag_specs:
            close = difflib.get_close_matches(name, flag_specs, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"{where}: --{name} is not a flag of `vllm serve` in {source}{hint}")
        elif value is not None:
            items = value if isinstance(value, list) else [value]
            # Each item as it reaches the command line (json.dumps of a list would hide a newline as "\\n").
            problem = _value_problem(flag_specs[name], value) or next(
                (found for item in items if (found := input_rules.text(_text(item)))), None
            )
            if problem:
                problems.append(f"{where}={value!r}: {problem}")
    return problems


def _value_problem(spec, value: object) -> str | None:
    """Why `value` cannot be given to this flag (a FlagSpec), or None."""
    kind = spec.kind
    items = value if isinstance(value, list) else [value]
    if spec.choices and any(str(item) not in spec.choices for item in items if not isinstance(item, bool)):
        return f"expected one of {', '.join(spec.choices)}"
    if kind in ("bool", "switch"):
        if not isinstance(value, bool):
            return "this flag takes no value: write true (or false to leave it off)"
        return None
    if kind == "json":
        return None if isinstance(value, (dict, list, str, int, float)) else "expected a mapping or text"
    if kind == "many":
        ok = isinstance(value, list) and len(value) > 0 and all(isinstance(item, (str, int, float)) for item in value)
        return None if ok or isinstance(value, (str, int, float)) else "expected a value or a list of values"
    if isinstance(value, bool) and kind != "optional":
        return "this flag takes a value, not true/false"
    return None if isinstance(value, (str, int, float)) else "expected a single value"


# --- rendering -----------------------------------------------------------------------------------------------


def checked_recipe(
    name: str,
    recipes_dir: str | Path,
    overrides: dict,
    flag_specs: dict,
    label: str,
    speculation: bool = True,
    revisions: Mapping[str, str] | None = None,
) -> tuple[dict | None, list[str]]:
    """The recipe `name` with `overrides` laid over it (without its speculative block when not `speculation`; with
    the commit `revisions`, the models lock, holds for the branch it follows), checked against the schema and the
    flag list: (recipe, []) or (None, every problem, each naming `label`)."""
    try:
        recipe = apply_overrides(load_recipe(name, recipes_dir), overrides)
    except RecipeError as error:
        return None, [f"{label}: {error}"]
    if not speculation:
        recipe = speculative.served_without(recipe)
    recipe = model_lock.with_locked_revision(recipe, revisions or {})
    problems = schema_problems(recipe, label) + flag_problems(recipe, flag_specs, label)
    problems += speculative_problems(recipe, recipes_dir, label)
    return (None if problems else recipe), problems


def speculative_problems(recipe: Mapping, recipes_dir: str | Path, label: str) -> list[str]:
    """The recipe's optional speculative block against the pinned release's SpeculativeConfig."""
    if "speculative" not in recipe:
        return []
    try:
        contract = speculative.load_contract(recipes_dir)
    except speculative.ContractError as error:
        return [f"{label}.speculative: {error}"]
    return speculative.problems(recipe["speculative"], contract, f"{label}.speculative")


def _text(value: object) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def serve_args(recipe: dict, flag_specs: dict) -> list[str]:
    """The arguments after `vllm serve` for a checked recipe (the role adds --host and --port)."""
    args = [recipe["hf_repo"], "--revision", recipe["hf_revision"]]
    # vLLM answers to every name and names the first in its answers and metrics.
    args += ["--served-model-name", recipe["served_model_name"], *(recipe.get("served_aliases") or [])]
    for key, flag in PLANNED_FLAGS.items():
        args += [f"--{flag}", _text(recipe[key])]
    if recipe.get("kv_cache_memory_gib") is not None:
        args += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes(recipe["kv_cache_memory_gib"]))]
    if recipe["tensor_parallel_size"] > 1:
        args += ["--tensor-parallel-size", str(recipe["tensor_parallel_size"])]
    if (recipe.get("pipeline_parallel_size") or 1) > 1:
        args += ["--pipeline-parallel-size", str(recipe["pipeline_parallel_size"])]
    for name, value in recipe["serve_flags"].items():
        spec = flag_specs[name]
        kind = spec.kind
        if value is None:
            continue
        if value is True:
            args.append(f"--{name}")
        elif value is False:
            # A bool flag is switched off by its own negative form (--no-X, or --disable-X for vLLM's --enable-X);
            # plain switches are off when absent.
            if kind == "bool":
                args.append(spec.off or f"--no-{name}")
        elif isinstance(value, list) and kind == "many":
            args += [f"--{name}", *(_text(item) for item in value)]
        else:
            args += [f"--{name}", _text(value)]
    if recipe.get("speculative"):
        args += ["--speculative-config", _text(speculative.config(recipe["speculative"]))]
    return args


def kv_cache_memory_bytes(gib: float) -> int:
    """kv_cache_memory_gib as the whole bytes --kv-cache-memory-bytes takes (and the planner counts)."""
    return int(gib * 1024**3)


def container_env(recipe: dict) -> dict[str, str]:
    """The recipe's environment as text, sorted, for the unit's --env lines."""
    return {key: str(value) for key, value in sorted(recipe["env"].items())}
