"""Plain functions behind the vllm_memory_plan module: will a recipe's vLLM flags fit a DGX Spark's unified memory?

On a Spark the GPU has no VRAM of its own: `--gpu-memory-utilization` is a fraction of the 128 GB LPDDR5X pool
that the OS, Docker and the page cache share, and when that pool runs out the whole machine can freeze. This
module does the arithmetic before vLLM starts and refuses, with a value that would work, anything that does not
fit:

- per node (with tensor_parallel_size N each Spark holds 1/N of the weights and of the KV heads):
  pool = MemTotal x gpu_memory_utilization; KV cache = pool - weights - overhead;
- the KV rules are vLLM's, defined once in module_utils/model_config_figures.py (library/hf_model_figures measures
  a model with the very same functions): KV bytes per token = full-attention layers x
  kv_bytes_per_token_per_layer (2 x KV heads x head_dim x bytes, or one MLA latent vector); one sequence of
  max_model_len tokens needs that x full_attention_tokens_per_sequence, plus its sliding-window layers' bytes per
  token x sliding_window_tokens_per_sequence (the window and the tokens in flight, not the whole context), plus the
  Mamba state of its hybrid layers (mamba_state_bytes_per_sequence);
- the OS keeps MemTotal x (1 - gpu_memory_utilization), at least os_reserve_min_gib;
- decode reads the active weights once per token, so tokens/s <= bandwidth / active weight bytes.

The flow is build_inputs() (recipe + overrides -> PlanInputs, or the list of what is wrong with them), then
plan() -> MemoryPlan, then as_dict() for the module's return values.

The models of one host are planned together: each vLLM instance takes its own --gpu-memory-utilization share of
the one pool, so the sum must stay within max_gpu_memory_utilization and leave os_reserve_min_gib
(shared_pool_reasons()). Right before a restart, start_check() asks whether the memory those shares need is free
on the host now (vLLM refuses to start otherwise; vllm#48140), counting what the restarted units free.

Standard library only; the YAML loader (PyYAML, which Ansible itself needs) is imported only when a recipe is
read from a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ansible.module_utils.model_config_figures import (
    KV_CACHE_DTYPE_BYTES,
    MLA_STATE_BYTES,
    MODEL_DTYPE_BYTES,
    AttentionLayout,
    FiguresError,
    full_attention_tokens_per_sequence,
    sliding_window_kv_bytes_per_token,
    sliding_window_tokens_per_sequence,
)
from ansible.module_utils.model_config_figures import kv_bytes_per_token as layout_kv_bytes_per_token
from ansible.module_utils.model_config_figures import kv_dtype_bytes as element_bytes
from ansible.module_utils.vllm_recipe import RecipeError, attention_problems
from ansible.module_utils.vllm_recipe import load_recipe as load_recipe_file

GIB = 2**30

# The --kv-cache-dtype choices the KV rules size (model_config_figures: bytes per element, or an MLA blob).
KV_CACHE_DTYPES = (*KV_CACHE_DTYPE_BYTES, *MLA_STATE_BYTES)

# vLLM 0.33's max_num_batched_tokens when the recipe does not set --max-num-batched-tokens: 2048 for the API
# server on a GB10 (engine/arg_utils.py, "small tier"). With async scheduling (on by default in 0.33) two batches
# are in flight (config/vllm.py max_concurrent_batches); a sliding-window layer keeps their tokens too.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

# The architecture keys the planner reads, and whether each must be a whole number.
ARCHITECTURE_NUMBERS = {
    "total_params_b": False,
    "active_params_b": False,
    "bytes_per_param": False,
    "weight_bytes": False,
    "attention_layers": True,
    "kv_heads": True,
    "head_dim": True,
    "max_context": True,
}

# The recipe values that inventory overrides (and the module's options) may replace.
OVERRIDABLE = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "kv_cache_dtype")

# The smallest max_model_len step a suggestion is rounded to.
CONTEXT_STEP = 1024

# The highest gpu_memory_utilization accepted by default: the top of the community's 0.80-0.87 guard on a Spark.
# vLLM starts only with utilization x MemTotal free, and what it leaves (15.8 GiB of 121.7 at 0.87) must hold the
# OS, Docker, vLLM's own host-side memory and still keep MemAvailable above 2-3 GB (spark-facts.md).
DEFAULT_MAX_GPU_MEMORY_UTILIZATION = 0.87


@dataclass(frozen=True)
class PlanInputs:
    """Everything the arithmetic needs, already checked (build_inputs() makes these)."""

    name: str
    memory_total_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    kv_cache_dtype: str
    kv_cache_dtype_resolved: str  # what "auto" means for this model; else kv_cache_dtype
    tensor_parallel_size: int
    weight_bytes: float
    attention_layers: int
    kv_heads: int
    head_dim: int
    active_params_b: float
    bytes_per_param: float
    max_context: int
    attention_kind: str = "full"
    full_attention_layers: int | None = None  # None: every attention layer is full attention
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    mamba_layers: int = 0
    mamba_state_bytes_per_sequence: int = 0
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    concurrent_batches: int = 2
    measured_decode_tok_s: float | None = None
    overhead_gib: float = 2.0
    os_reserve_min_gib: float = 8.0
    max_gpu_memory_utilization: float = DEFAULT_MAX_GPU_MEMORY_UTILIZATION
    bandwidth_gb_s: float = 273.0

    @property
    def kv_dtype_bytes(self) -> int | None:
        """Bytes per KV element; None for an MLA layout sized per token as a whole (fp8_ds_mla, nvfp4_ds_mla)."""
        if self.kv_cache_dtype_resolved in MLA_STATE_BYTES:
            return None
        return element_bytes(self.kv_cache_dtype_resolved)


@dataclass(frozen=True)
class MemoryPlan:
    """The figures for one node, and why the flags do not fit (empty when they do)."""

    inputs: PlanInputs
    weights_bytes: float
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    pool_bytes: float
    kv_cache_bytes: float
    kv_capacity_tokens: int
    max_full_length_seqs: int
    os_reserve_bytes: float
    decode_bound_tok_s: float
    reasons: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.reasons


# ---------------------------------------------------------------------------------------------------------------
# Reading a recipe


def load_recipe(recipe: object, recipes_dir: str | None, name: str = "recipe") -> tuple[dict | None, list[str]]:
    """The recipe as a dict: `recipe` itself when it is a mapping, else the file <recipes_dir>/<recipe>.yml, read
    by the one recipe loader (module_utils/vllm_recipe.py). Returns (recipe, []) or (None, problems)."""
    if isinstance(recipe, Mapping):
        return dict(recipe), []
    if not isinstance(recipe, str) or not recipe:
        return None, [f"{name}: the recipe must be a recipe name or a mapping of recipe keys, not {_show(recipe)}"]
    if not recipes_dir:
        return None, [f"{name}: recipe {recipe!r} is a name, so recipes_dir must say where the recipe files live"]
    try:
        return load_recipe_file(recipe, recipes_dir), []
    except RecipeError as error:
        return None, [f"{name}: {error}"]


# ---------------------------------------------------------------------------------------------------------------
# Checking the inputs (every problem at once, before any arithmetic)


def _show(value: object) -> str:
    """A value as it would be written in YAML-ish messages: strings quoted, the rest as is."""
    return repr(value) if isinstance(value, str) else str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def long_context_allowed(recipe: Mapping) -> bool:
    """Whether the recipe's env lets vLLM accept max_model_len above the model's max_position_embeddings."""
    env = recipe.get("env")
    if not isinstance(env, Mapping):
        return False
    return str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower() in ("1", "true")


def _architecture_problems(architecture: object, name: str) -> list[str]:
    if not isinstance(architecture, Mapping):
        return [f"{name}.architecture: must be a mapping of the model's figures, not {_show(architecture)}"]
    problems = []
    for key, whole in ARCHITECTURE_NUMBERS.items():
        value = architecture.get(key)
        if not (_is_positive_int(value) if whole else _is_number(value) and value > 0):
            kind = "a positive whole number" if whole else "a positive number"
            problems.append(_found(name, f"architecture.{key}", value, kind))
    dtype = architecture.get("dtype")
    if dtype not in MODEL_DTYPE_BYTES:
        requirement = f"the model's torch_dtype, one of {', '.join(MODEL_DTYPE_BYTES)}"
        problems.append(_found(name, "architecture.dtype", dtype, requirement))
    active, total = architecture.get("active_params_b"), architecture.get("total_params_b")
    if _is_number(active) and _is_number(total) and 0 < total < active:
        problems.append(
            f"{name}.architecture.active_params_b={active}: more than total_params_b={total}; a model cannot read "
            "more parameters per token than it has"
        )
    # The optional attention keys, checked by the recipe schema's own function (one definition of the rule).
    return problems + attention_problems(dict(architecture), f"{name}.architecture")


def _found(name: str, key: str, value: object, requirement: str) -> str:
    """An input problem: '<name>.<key> is missing; it must be ...' or '<name>.<key>=<value>: must be ...'."""
    if value is None:
        return f"{name}.{key} is missing; it must be {requirement}"
    return f"{name}.{key}={_show(value)}: must be {requirement}"


def _flag_problems(values: Mapping, name: str) -> list[str]:
    problems = []
    utilization = values.get("gpu_memory_utilization")
    if not (_is_number(utilization) and 0 < utilization < 1):
        requirement = "a fraction of the shared memory pool, between 0 and 1 (exclusive), e.g. 0.85"
        problems.append(_found(name, "gpu_memory_utilization", utilization, requirement))
    for key in ("max_model_len", "max_num_seqs", "tensor_parallel_size"):
        if not _is_positive_int(values.get(key)):
            problems.append(_found(name, key, values.get(key), "a positive whole number"))
    dtype = values.get("kv_cache_dtype")
    if dtype != "auto" and dtype not in KV_CACHE_DTYPES:
        requirement = f"one of auto, {', '.join(KV_CACHE_DTYPES)}"
        problems.append(_found(name, "kv_cache_dtype", dtype, requirement))
    return problems


def _batching(recipe: Mapping, name: str) -> tuple[tuple[int, int], list[str]]:
    """((max_num_batched_tokens, concurrent batches), problems) from the recipe's serve_flags: what a
    sliding-window layer keeps beyond its window (vLLM max_in_flight_tokens)."""
    flags = recipe.get("serve_flags")
    flags = flags if isinstance(flags, Mapping) else {}
    tokens = flags.get("max-num-batched-tokens")
    if isinstance(tokens, str) and tokens.strip().isdigit():
        tokens = int(tokens)
    batches = 1 if flags.get("async-scheduling") is False else 2
    if tokens is None:
        return (DEFAULT_MAX_NUM_BATCHED_TOKENS, batches), []
    if not _is_positive_int(tokens):
        return (0, batches), [_found(name, "serve_flags.max-num-batched-tokens", tokens, "a positive whole number")]
    return (tokens, batches), []


def _context_problems(values: Mapping, architecture: Mapping, allow_long: bool, name: str) -> list[str]:
    max_model_len, max_context = values.get("max_model_len"), architecture.get("max_context")
    if allow_long or not (_is_positive_int(max_model_len) and _is_positive_int(max_context)):
        return []
    if max_model_len <= max_context:
        return []
    return [
        f"{name}.max_model_len={max_model_len}: above the model's max_context {max_context:,}, which vLLM refuses; "
        f"set max_model_len to {max_context} or lower (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in {name}.env when "
        "the model is known to work beyond it)"
    ]


def _settings_problems(
    memory_total_bytes: object,
    overhead_gib: object,
    os_reserve_min_gib: object,
    max_gpu_memory_utilization: object,
    bandwidth_gb_s: object,
) -> list[str]:
    problems = []
    if not (_is_number(memory_total_bytes) and memory_total_bytes > 0):
        problems.append(f"memory_total_bytes={_show(memory_total_bytes)}: must be the host's MemTotal, in bytes (> 0)")
    for key, value in (("overhead_gib", overhead_gib), ("os_reserve_min_gib", os_reserve_min_gib)):
        if not (_is_number(value) and value >= 0):
            problems.append(f"{key}={_show(value)}: must be a number of GiB, 0 or more")
    if not (_is_number(max_gpu_memory_utilization) and 0 < max_gpu_memory_utilization <= 1):
        problems.append(
            f"max_gpu_memory_utilization={_show(max_gpu_memory_utilization)}: must be a fraction in (0, 1], e.g. 0.90"
        )
    if not (_is_number(bandwidth_gb_s) and bandwidth_gb_s > 0):
        problems.append(f"bandwidth_gb_s={_show(bandwidth_gb_s)}: must be the memory bandwidth in GB/s (> 0)")
    return problems


def _measured_decode(recipe: Mapping, name: str) -> tuple[float | None, list[str]]:
    measured = recipe.get("measured")
    if measured is None:
        return None, []
    if not isinstance(measured, Mapping):
        return None, [f"{name}.measured: must be a mapping (decode_tok_s, source), not {_show(measured)}"]
    value = measured.get("decode_tok_s")
    if value is None:
        return None, []
    if not (_is_number(value) and value > 0):
        return None, [f"{name}.measured.decode_tok_s={_show(value)}: must be a positive number of tokens/s"]
    return float(value), []


def build_inputs(
    recipe: Mapping,
    overrides: Mapping | None = None,
    *,
    memory_total_bytes: object,
    name: str = "recipe",
    overhead_gib: object = 2.0,
    os_reserve_min_gib: object = 8.0,
    max_gpu_memory_utilization: object = DEFAULT_MAX_GPU_MEMORY_UTILIZATION,
    bandwidth_gb_s: object = 273.0,
) -> tuple[PlanInputs | None, list[str]]:
    """The checked inputs of the plan: the recipe's values, replaced by any override that is not None.
    Returns (inputs, []) or (None, every problem found)."""
    if not isinstance(recipe, Mapping):
        return None, [f"{name}: the recipe must be a mapping of recipe keys, not {_show(recipe)}"]
    values = {key: recipe.get(key) for key in (*OVERRIDABLE, "tensor_parallel_size")}
    values.update({key: value for key, value in (overrides or {}).items() if value is not None})
    architecture = recipe.get("architecture")
    measured, measured_problems = _measured_decode(recipe, name)
    (batched_tokens, batches), batching_problems = _batching(recipe, name)
    problems = [
        *_flag_problems(values, name),
        *batching_problems,
        *_architecture_problems(architecture, name),
        *measured_problems,
        *_settings_problems(
            memory_total_bytes, overhead_gib, os_reserve_min_gib, max_gpu_memory_utilization, bandwidth_gb_s
        ),
    ]
    if isinstance(architecture, Mapping):
        problems += _context_problems(values, architecture, long_context_allowed(recipe), name)
    if problems:
        return None, problems
    dtype = values["kv_cache_dtype"]
    resolved = (architecture.get("kv_cache_dtype_auto") or architecture["dtype"]) if dtype == "auto" else dtype
    inputs = PlanInputs(
        name=name,
        memory_total_bytes=int(memory_total_bytes),
        gpu_memory_utilization=float(values["gpu_memory_utilization"]),
        max_model_len=values["max_model_len"],
        max_num_seqs=values["max_num_seqs"],
        kv_cache_dtype=dtype,
        kv_cache_dtype_resolved=resolved,
        tensor_parallel_size=values["tensor_parallel_size"],
        weight_bytes=float(architecture["weight_bytes"]),
        attention_layers=architecture["attention_layers"],
        kv_heads=architecture["kv_heads"],
        head_dim=architecture["head_dim"],
        active_params_b=float(architecture["active_params_b"]),
        bytes_per_param=float(architecture["bytes_per_param"]),
        max_context=architecture["max_context"],
        attention_kind=architecture.get("attention_kind") or "full",
        full_attention_layers=architecture.get("full_attention_layers"),
        sliding_window=architecture.get("sliding_window"),
        sliding_window_layers=architecture.get("sliding_window_layers") or 0,
        mamba_layers=architecture.get("mamba_layers") or 0,
        mamba_state_bytes_per_sequence=architecture.get("mamba_state_bytes_per_sequence") or 0,
        max_num_batched_tokens=batched_tokens,
        concurrent_batches=batches,
        measured_decode_tok_s=measured,
        overhead_gib=float(overhead_gib),
        os_reserve_min_gib=float(os_reserve_min_gib),
        max_gpu_memory_utilization=float(max_gpu_memory_utilization),
        bandwidth_gb_s=float(bandwidth_gb_s),
    )
    try:
        kv_bytes_per_token(inputs)
    except FiguresError as error:
        return None, [f"{name}.kv_cache_dtype={dtype!r}: {error}"]
    return inputs, []


# ---------------------------------------------------------------------------------------------------------------
# Arithmetic (per node)


def weights_bytes_per_node(inputs: PlanInputs) -> float:
    return inputs.weight_bytes / inputs.tensor_parallel_size


def attention_layout(inputs: PlanInputs) -> AttentionLayout:
    """The recipe's attention figures as the layout the shared KV rules read (model_config_figures), with the
    defaults of a recipe that does not describe its attention kinds: every attention layer full, no Mamba layer."""
    sliding = inputs.sliding_window_layers
    full = inputs.attention_layers - sliding if inputs.full_attention_layers is None else inputs.full_attention_layers
    return AttentionLayout(
        model_type=inputs.name,
        kind=inputs.attention_kind,
        layers=full + sliding + inputs.mamba_layers,
        full_attention_layers=full,
        sliding_window_layers=sliding,
        sliding_window=inputs.sliding_window,
        kv_heads=inputs.kv_heads,
        head_dim=inputs.head_dim,
        mamba_layers=inputs.mamba_layers,
    )


def kv_bytes_per_token(inputs: PlanInputs) -> int:
    """Bytes per token over the full-attention layers on one node (model_config_figures.kv_bytes_per_token: tensor
    parallelism splits the KV heads, at least one per node; an MLA latent vector is not split)."""
    return layout_kv_bytes_per_token(
        attention_layout(inputs), inputs.kv_cache_dtype_resolved, inputs.tensor_parallel_size
    )


def sliding_window_bytes_per_sequence(inputs: PlanInputs, max_model_len: int) -> int:
    """What the sliding-window layers hold for one sequence on one node: their bytes per token times the tokens a
    sliding-window layer keeps (the window plus the tokens in flight, at most max_model_len, in blocks)."""
    layout = attention_layout(inputs)
    if not layout.sliding_window_layers:
        return 0
    per_token = sliding_window_kv_bytes_per_token(layout, inputs.kv_cache_dtype_resolved, inputs.tensor_parallel_size)
    tokens = sliding_window_tokens_per_sequence(
        layout.sliding_window, max_model_len, inputs.max_num_batched_tokens, inputs.concurrent_batches
    )
    return per_token * tokens


def state_bytes_per_sequence(inputs: PlanInputs, max_model_len: int) -> int:
    """What one sequence needs whatever its length: the sliding-window layers' tokens and the Mamba state (the
    measured state of all Mamba layers, whole model; a lower bound: vLLM pads it to the attention page size)."""
    return sliding_window_bytes_per_sequence(inputs, max_model_len) + inputs.mamba_state_bytes_per_sequence


def kv_bytes_per_sequence(inputs: PlanInputs, max_model_len: int) -> int:
    """The KV cache one sequence of max_model_len tokens needs on one node: the full-attention layers' tokens in
    whole blocks, plus state_bytes_per_sequence()."""
    full = kv_bytes_per_token(inputs) * full_attention_tokens_per_sequence(max_model_len)
    return full + state_bytes_per_sequence(inputs, max_model_len)


def pool_bytes(inputs: PlanInputs, utilization: float) -> float:
    return inputs.memory_total_bytes * utilization


def overhead_bytes(inputs: PlanInputs) -> float:
    return inputs.overhead_gib * GIB


def kv_cache_bytes(inputs: PlanInputs, utilization: float) -> float:
    """What is left of vLLM's share for the KV cache; negative when the weights alone do not fit."""
    return pool_bytes(inputs, utilization) - weights_bytes_per_node(inputs) - overhead_bytes(inputs)


def sequences_held(inputs: PlanInputs, utilization: float) -> int:
    """How many sequences of max_model_len tokens the KV cache holds at once."""
    cache = kv_cache_bytes(inputs, utilization)
    return max(0, math.floor(cache / kv_bytes_per_sequence(inputs, inputs.max_model_len)))


def kv_capacity_tokens(inputs: PlanInputs, utilization: float) -> int:
    """Tokens of full-attention KV cache, after one sequence's state_bytes_per_sequence(): the longest sequence it
    holds. A model with no full-attention layer holds any length: then the tokens of its full-length sequences."""
    cache = kv_cache_bytes(inputs, utilization)
    per_token = kv_bytes_per_token(inputs)
    if not per_token:
        return sequences_held(inputs, utilization) * inputs.max_model_len
    return max(0, math.floor((cache - state_bytes_per_sequence(inputs, inputs.max_model_len)) / per_token))


def os_reserve_bytes(inputs: PlanInputs, utilization: float) -> float:
    return inputs.memory_total_bytes * (1 - utilization)


def decode_bound_tok_s(inputs: PlanInputs) -> float:
    """Tokens/s if decoding were limited by reading the active weights (this node's share) once per token."""
    active_bytes = inputs.active_params_b * 1e9 * inputs.bytes_per_param / inputs.tensor_parallel_size
    return inputs.bandwidth_gb_s * 1e9 / active_bytes


def utilization_is_safe(inputs: PlanInputs, utilization: float) -> bool:
    return (
        utilization <= inputs.max_gpu_memory_utilization
        and os_reserve_bytes(inputs, utilization) >= inputs.os_reserve_min_gib * GIB
    )


def _hundredths(value: float, up: bool) -> float:
    """`value` rounded up or down to 0.01, ignoring float noise below a millionth of a step."""
    steps = round(value * 100, 6)
    return (math.ceil(steps) if up else math.floor(steps)) / 100


def largest_safe_utilization(inputs: PlanInputs) -> float | None:
    """The largest gpu_memory_utilization (a multiple of 0.01) within max_gpu_memory_utilization that leaves
    os_reserve_min_gib; None when even 0.01 leaves too little."""
    limit = min(inputs.max_gpu_memory_utilization, 1 - inputs.os_reserve_min_gib * GIB / inputs.memory_total_bytes)
    utilization = _hundredths(limit, up=False)
    while utilization > 0 and not utilization_is_safe(inputs, utilization):
        utilization = round(utilization - 0.01, 2)
    return utilization if utilization > 0 else None


def smallest_utilization_holding(inputs: PlanInputs, tokens: int) -> float | None:
    """The smallest gpu_memory_utilization (a multiple of 0.01) whose KV cache holds `tokens`; None if below 1
    there is none. Safety is the caller's question."""
    sequence = kv_bytes_per_sequence(inputs, tokens)
    needed = weights_bytes_per_node(inputs) + overhead_bytes(inputs) + sequence
    utilization = max(0.01, _hundredths(needed / inputs.memory_total_bytes, up=True))
    while utilization < 1 and kv_cache_bytes(inputs, utilization) < sequence:
        utilization = round(utilization + 0.01, 2)
    return utilization if utilization < 1 else None


def safe_utilization_holding(inputs: PlanInputs, tokens: int) -> float | None:
    """smallest_utilization_holding(), when it is also safe."""
    utilization = smallest_utilization_holding(inputs, tokens)
    safe = largest_safe_utilization(inputs)
    return utilization if utilization is not None and safe is not None and utilization <= safe else None


# ---------------------------------------------------------------------------------------------------------------
# Refusals, each naming the variable and a value that works


def _gib(value: float) -> str:
    return f"{value / GIB:,.1f} GiB"


def _safety_reason(inputs: PlanInputs, safe: float | None) -> str | None:
    utilization = inputs.gpu_memory_utilization
    if safe is not None and utilization_is_safe(inputs, utilization):
        return None
    label = f"{inputs.name}.gpu_memory_utilization={utilization}"
    reserve = os_reserve_bytes(inputs, utilization)
    found = (
        f"it leaves {_gib(reserve)} of {_gib(inputs.memory_total_bytes)} for the OS, Docker and page cache "
        f"(os_reserve_min_gib asks for {inputs.os_reserve_min_gib:.1f} GiB)"
    )
    if utilization > inputs.max_gpu_memory_utilization:
        found += f" and is above max_gpu_memory_utilization {inputs.max_gpu_memory_utilization:.2f}"
    risk = "when the shared pool runs out a Spark can freeze and need a power cycle"
    if safe is None:
        return (
            f"{label}: no gpu_memory_utilization leaves os_reserve_min_gib {inputs.os_reserve_min_gib:.1f} GiB of "
            f"this host's {_gib(inputs.memory_total_bytes)}; {risk}"
        )
    fix = f"set gpu_memory_utilization to {safe:.2f} or lower"
    least = safe_utilization_holding(inputs, inputs.max_model_len)
    if least is not None and least < safe:
        fix += f" (at least {least:.2f} to hold one {inputs.max_model_len:,}-token sequence)"
    return f"{label}: {found}; {risk}; {fix}"


def _bigger_setup_hint(inputs: PlanInputs) -> str:
    """What to try when the nodes cannot hold the model at any safe utilization."""
    if inputs.tensor_parallel_size > 1:
        return "use a smaller quantization (e.g. NVFP4)"
    utilization = safe_utilization_holding(replace(inputs, tensor_parallel_size=2), inputs.max_model_len)
    if utilization is None:
        return (
            "use a smaller quantization (e.g. NVFP4); even tensor_parallel_size 2 (two Sparks) would not hold it "
            f"with one {inputs.max_model_len:,}-token sequence"
        )
    return (
        f"use a smaller quantization (e.g. NVFP4), or set {inputs.name}.tensor_parallel_size to 2 (two Sparks) "
        f"with gpu_memory_utilization {utilization:.2f}"
    )


def _weights_reason(inputs: PlanInputs, utilization: float, at_safe_limit: bool) -> str:
    weights, overhead = weights_bytes_per_node(inputs), overhead_bytes(inputs)
    per_node = " per node" if inputs.tensor_parallel_size > 1 else ""
    found = (
        f"the weights ({_gib(weights)}{per_node}) plus overhead ({_gib(overhead)}) need {_gib(weights + overhead)}, "
        f"more than the {_gib(pool_bytes(inputs, utilization))} pool ({utilization:.2f} of "
        f"{_gib(inputs.memory_total_bytes)})"
    )
    if at_safe_limit:
        found = f"even at the largest safe gpu_memory_utilization {utilization:.2f}, {found}"
    label = f"{inputs.name}.gpu_memory_utilization={inputs.gpu_memory_utilization}"
    fix = safe_utilization_holding(inputs, inputs.max_model_len)
    if fix is not None:
        return (
            f"{label}: {found}; set gpu_memory_utilization to {fix:.2f} (it holds the weights and one "
            f"{inputs.max_model_len:,}-token sequence)"
        )
    safe = largest_safe_utilization(inputs)
    capacity = kv_capacity_tokens(inputs, safe) if safe is not None else 0
    shorter = capacity // CONTEXT_STEP * CONTEXT_STEP
    if shorter:
        return (
            f"{label}: {found}; at the largest safe gpu_memory_utilization {safe:.2f} the KV cache holds only "
            f"{capacity:,} tokens: set gpu_memory_utilization to {safe:.2f} and {inputs.name}.max_model_len to "
            f"{shorter} or lower, or {_bigger_setup_hint(inputs)}"
        )
    nodes = "one Spark" if inputs.tensor_parallel_size == 1 else f"{inputs.tensor_parallel_size} Sparks"
    return (
        f"{label}: {found}; the model does not fit {nodes} at any safe gpu_memory_utilization: "
        f"{_bigger_setup_hint(inputs)}"
    )


def _context_reason(inputs: PlanInputs, utilization: float, at_safe_limit: bool) -> str:
    capacity = kv_capacity_tokens(inputs, utilization)
    where = (
        f"at the largest safe gpu_memory_utilization {utilization:.2f}"
        if at_safe_limit
        else f"at gpu_memory_utilization {utilization:.2f}"
    )
    found = (
        f"{inputs.name}.max_model_len={inputs.max_model_len}: the KV cache holds {capacity:,} tokens {where}, "
        "less than one full-length sequence"
    )
    fixes = []
    shorter = capacity // CONTEXT_STEP * CONTEXT_STEP
    if shorter:
        fixes.append(f"max_model_len to {shorter} or lower")
    more = None if at_safe_limit else safe_utilization_holding(inputs, inputs.max_model_len)
    if more is not None:
        fixes.append(f"gpu_memory_utilization to {more:.2f}")
    if fixes:
        return f"{found}; set {', or '.join(fixes)}"
    return f"{found}; {_bigger_setup_hint(inputs)}"


def refusal_reasons(inputs: PlanInputs) -> list[str]:
    """Why these flags must not be started on a Spark; empty when they fit. When gpu_memory_utilization is unsafe
    the fit is judged at the largest safe one, so that following every suggestion gives a plan that fits."""
    safe = largest_safe_utilization(inputs)
    reasons = []
    safety = _safety_reason(inputs, safe)
    if safety:
        reasons.append(safety)
        if safe is None:
            return reasons
    utilization = inputs.gpu_memory_utilization if safety is None else safe
    at_safe_limit = safety is not None
    if kv_cache_bytes(inputs, utilization) < 0:
        reasons.append(_weights_reason(inputs, utilization, at_safe_limit))
    elif sequences_held(inputs, utilization) < 1:
        reasons.append(_context_reason(inputs, utilization, at_safe_limit))
    return reasons


# ---------------------------------------------------------------------------------------------------------------
# The plan


def plan(inputs: PlanInputs) -> MemoryPlan:
    utilization = inputs.gpu_memory_utilization
    capacity = kv_capacity_tokens(inputs, utilization)
    return MemoryPlan(
        inputs=inputs,
        weights_bytes=weights_bytes_per_node(inputs),
        kv_bytes_per_token=kv_bytes_per_token(inputs),
        kv_bytes_per_sequence=kv_bytes_per_sequence(inputs, inputs.max_model_len),
        pool_bytes=pool_bytes(inputs, utilization),
        kv_cache_bytes=max(0.0, kv_cache_bytes(inputs, utilization)),
        kv_capacity_tokens=capacity,
        max_full_length_seqs=sequences_held(inputs, utilization),
        os_reserve_bytes=os_reserve_bytes(inputs, utilization),
        decode_bound_tok_s=decode_bound_tok_s(inputs),
        reasons=tuple(refusal_reasons(inputs)),
    )


def summary(memory_plan: MemoryPlan) -> str:
    """One human line: what goes where, and the concurrency and speed to expect."""
    inputs = memory_plan.inputs
    nodes = "" if inputs.tensor_parallel_size == 1 else f" per node of {inputs.tensor_parallel_size}"
    verdict = "fits" if memory_plan.fits else "DOES NOT FIT"
    line = (
        f"{inputs.name} {verdict}{nodes}: weights {_gib(memory_plan.weights_bytes)} + overhead "
        f"{_gib(overhead_bytes(inputs))} + KV cache {_gib(memory_plan.kv_cache_bytes)} in a "
        f"{_gib(memory_plan.pool_bytes)} pool (gpu_memory_utilization {inputs.gpu_memory_utilization:.2f} of "
        f"{_gib(inputs.memory_total_bytes)}), {_gib(memory_plan.os_reserve_bytes)} left for the OS; KV cache "
        f"{memory_plan.kv_capacity_tokens:,} tokens at {memory_plan.kv_bytes_per_token:,} B/token"
    )
    state = state_bytes_per_sequence(inputs, inputs.max_model_len)
    if state:
        line += f" plus {state / 2**20:,.1f} MiB per sequence ({_state_parts(inputs)})"
    line += f" = {memory_plan.max_full_length_seqs:,} sequences of {inputs.max_model_len:,} tokens"
    if inputs.max_num_seqs > memory_plan.max_full_length_seqs:
        line += (
            f" (max_num_seqs {inputs.max_num_seqs} is more: fine, vLLM schedules by active context, so that many "
            "run at once only while their contexts are shorter)"
        )
    line += f"; decode at most {memory_plan.decode_bound_tok_s:,.1f} tok/s (bandwidth bound)"
    if inputs.measured_decode_tok_s is not None:
        line += f", {inputs.measured_decode_tok_s:,.1f} tok/s measured"
    return line


def _state_parts(inputs: PlanInputs) -> str:
    """What the per-sequence state is made of, for the summary."""
    parts = []
    if inputs.sliding_window_layers:
        parts.append(f"{inputs.sliding_window_layers} sliding-window layers of {inputs.sliding_window:,} tokens")
    if inputs.mamba_state_bytes_per_sequence:
        parts.append(f"{inputs.mamba_layers} Mamba layers' state")
    return " and ".join(parts)


def as_dict(memory_plan: MemoryPlan) -> dict[str, Any]:
    """The module's return values."""
    inputs = memory_plan.inputs
    return {
        "weights_gib": round(memory_plan.weights_bytes / GIB, 2),
        "kv_bytes_per_token": memory_plan.kv_bytes_per_token,
        "kv_bytes_per_sequence": memory_plan.kv_bytes_per_sequence,
        "kv_capacity_tokens": memory_plan.kv_capacity_tokens,
        "max_full_length_seqs": memory_plan.max_full_length_seqs,
        "os_reserve_gib": round(memory_plan.os_reserve_bytes / GIB, 2),
        "decode_bound_tok_s": round(memory_plan.decode_bound_tok_s, 1),
        "measured_decode_tok_s": inputs.measured_decode_tok_s,
        "fits": memory_plan.fits,
        "reasons": list(memory_plan.reasons),
        "pool_gib": round(memory_plan.pool_bytes / GIB, 2),
        "kv_cache_gib": round(memory_plan.kv_cache_bytes / GIB, 2),
        "memory_total_gib": round(inputs.memory_total_bytes / GIB, 2),
        "tensor_parallel_size": inputs.tensor_parallel_size,
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "max_model_len": inputs.max_model_len,
        "max_num_seqs": inputs.max_num_seqs,
        "kv_cache_dtype": inputs.kv_cache_dtype,
        "summary": summary(memory_plan),
    }


def unplanned_dict(reasons: list[str]) -> dict[str, Any]:
    """The module's return values when the inputs could not be planned: every figure null, the problems as reasons."""
    keys = (
        "weights_gib",
        "kv_bytes_per_token",
        "kv_bytes_per_sequence",
        "kv_capacity_tokens",
        "max_full_length_seqs",
        "os_reserve_gib",
        "decode_bound_tok_s",
        "measured_decode_tok_s",
        "pool_gib",
        "kv_cache_gib",
        "memory_total_gib",
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "kv_cache_dtype",
    )
    result: dict[str, Any] = dict.fromkeys(keys)
    result.update(fits=False, reasons=list(reasons), summary=f"not planned: {len(reasons)} problem(s) with the input")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Every model of one host together: each vLLM takes its own share of the one pool, so the shares add up


def shared_utilization(plans: list[MemoryPlan]) -> float:
    """The sum of the models' gpu_memory_utilization (each vLLM instance takes its own share of the pool)."""
    return round(sum(memory_plan.inputs.gpu_memory_utilization for memory_plan in plans), 6)


def _described(memory_plan: MemoryPlan, recipe_name: str | None) -> str:
    inputs = memory_plan.inputs
    recipe = f" ({recipe_name})" if recipe_name else ""
    return f"{inputs.name}{recipe} at gpu_memory_utilization {inputs.gpu_memory_utilization:.2f}"


def _shared_fixes(plans: list[MemoryPlan], limit: float) -> str:
    """What to lower so that the shares add up to `limit` or less, each model keeping its weights and one
    full-length sequence: one model's value when lowering one is enough, else every model's least value."""
    least = [smallest_utilization_holding(p.inputs, p.inputs.max_model_len) for p in plans]
    fixes = []
    by_share = sorted(range(len(plans)), key=lambda i: -plans[i].inputs.gpu_memory_utilization)
    for index in by_share:
        others = sum(p.inputs.gpu_memory_utilization for i, p in enumerate(plans) if i != index)
        candidate = _hundredths(limit - others, up=False)
        needed = least[index]
        if needed is not None and 0 < needed <= candidate:
            fixes.append(
                f"set {plans[index].inputs.name}.gpu_memory_utilization to {candidate:.2f} (at least {needed:.2f} "
                f"holds its weights and one {plans[index].inputs.max_model_len:,}-token sequence)"
            )
    if fixes:
        return f"lower them so that they add up to {limit:.2f} or less: {', or '.join(fixes)}"
    if all(value is not None for value in least) and round(sum(least), 6) <= limit:
        each = " and ".join(
            f"set {p.inputs.name}.gpu_memory_utilization to {value:.2f}" for p, value in zip(plans, least, strict=True)
        )
        return (
            f"lower them so that they add up to {limit:.2f} or less: {each} (the least that holds each model's "
            "weights and one full-length sequence)"
        )
    return (
        f"even at the least gpu_memory_utilization that holds each model's weights and one full-length sequence "
        f"they add up to more than {limit:.2f}: lower a max_model_len, or serve one of these models on another Spark"
    )


def shared_pool_reasons(plans: list[MemoryPlan], recipe_names: list[str | None] | None = None) -> list[str]:
    """Why the models of one host must not run together: the sum of their shares is above
    max_gpu_memory_utilization or leaves less than os_reserve_min_gib. Empty for one model (its own plan says it)."""
    if len(plans) < 2:
        return []
    inputs = plans[0].inputs
    total = shared_utilization(plans)
    if utilization_is_safe(inputs, total):
        return []
    names = recipe_names or [None] * len(plans)
    together = " + ".join(_described(p, name) for p, name in zip(plans, names, strict=True))
    found = (
        f"{together} = {total:.2f}: these models run on this host together and --gpu-memory-utilization is per vLLM "
        f"instance, so they take {_gib(inputs.memory_total_bytes * total)} of the one "
        f"{_gib(inputs.memory_total_bytes)} pool and leave {_gib(inputs.memory_total_bytes * (1 - total))} for the "
        f"OS, Docker and page cache (os_reserve_min_gib asks for {inputs.os_reserve_min_gib:.1f} GiB)"
    )
    if total > inputs.max_gpu_memory_utilization:
        found += f", above max_gpu_memory_utilization {inputs.max_gpu_memory_utilization:.2f} for the sum"
    risk = "when the shared pool runs out a Spark can freeze and need a power cycle"
    limit = largest_safe_utilization(inputs)
    if limit is None:
        return [f"{found}; {risk}; no sum leaves os_reserve_min_gib on this host: serve fewer models here"]
    return [f"{found}; {risk}; {_shared_fixes(plans, limit)}"]


def host_summary(plans: list[MemoryPlan], reasons: list[str]) -> str:
    """One human line for all the models of a host."""
    if not plans:
        return "no model planned"
    inputs = plans[0].inputs
    total = shared_utilization(plans)
    if len(plans) == 1:
        head = f"1 model {'fits' if not reasons else 'DOES NOT FIT'}: gpu_memory_utilization {total:.2f} of "
    else:
        shares = " + ".join(f"{p.inputs.gpu_memory_utilization:.2f}" for p in plans)
        verdict = "fit" if not reasons else "DO NOT FIT"
        head = f"{len(plans)} models {verdict} together: gpu_memory_utilization {shares} = {total:.2f} of "
    return (
        f"{head}"
        f"{_gib(inputs.memory_total_bytes)} ({_gib(inputs.memory_total_bytes * total)}), "
        f"{_gib(inputs.memory_total_bytes * (1 - total))} left for the OS"
    )


def host_plan(
    entries: list[tuple[str, dict]],
    *,
    memory_total_bytes: int,
    settings: Mapping,
    names: list[str | None] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Every model of one host planned together: each one's own plan, then the sum of their shares.
    `entries` are (label, checked recipe with its overrides applied); `settings` are build_inputs' planner settings.
    Returns (the host's plan, [] ) or (partial plan, the problems that stopped any arithmetic)."""
    plans, results, planned_names, problems = [], [], [], []
    for index, (label, recipe) in enumerate(entries):
        inputs, found = build_inputs(recipe, memory_total_bytes=memory_total_bytes, name=label, **settings)
        if found:
            problems += found
            results.append({**unplanned_dict(found), "name": label})
            continue
        memory_plan = plan(inputs)
        plans.append(memory_plan)
        planned_names.append((names or [None] * len(entries))[index] or recipe.get("name"))
        results.append({**as_dict(memory_plan), "name": label})
    if problems:
        return {"fits": False, "reasons": problems, "results": results}, problems
    reasons = [reason for result in results for reason in result["reasons"]]
    reasons += shared_pool_reasons(plans, planned_names)
    total = shared_utilization(plans)
    return {
        "fits": not reasons,
        "reasons": reasons,
        "summary": host_summary(plans, reasons),
        "results": results,
        "gpu_memory_utilization_total": total,
        "memory_total_gib": round(memory_total_bytes / GIB, 2),
        "os_reserve_gib": round(memory_total_bytes * (1 - total) / GIB, 2),
    }, []


# ---------------------------------------------------------------------------------------------------------------
# Before a restart: is the memory those vLLMs need free on the host now?
#
# vLLM refuses to start unless the free memory at start is at least gpu_memory_utilization x total, and on a GB10
# "free" is close to MemFree, so page cache counts as used (vllm#48140). The units restart one after another in
# the order of vllm_server_models, and each one's start check can run before the next one has stopped, so every
# step must fit on its own:
#
#   free + (what the units restarted so far free when they stop) >= (their shares) + margin
#
# free is MemAvailable after dropping the page cache when the unit drops it too (vllm_server_drop_caches; in check
# mode MemAvailable estimates what that drop frees), else MemFree. A running unit frees the share of the
# configuration it runs: that of its last good configuration (the role's <unit>.last-good.json, written when that
# configuration passed the health gate), never the share of the new one, which may be larger; a running unit with
# no last good configuration is counted as freeing nothing. What all of them free is at most what is in use now.

UTILIZATION_FLAG = "--gpu-memory-utilization"


@dataclass(frozen=True)
class StartUnit:
    """One queued unit: its label (e.g. vllm_server_models[1]), its systemd unit, the share its new configuration
    takes, whether it is about to (re)start, whether it runs now and the share of the configuration it runs."""

    name: str
    unit: str
    gpu_memory_utilization: float
    restart: bool = True
    running: bool = False
    running_utilization: float | None = None


@dataclass(frozen=True)
class StartCheck:
    """The memory figures of the check, in bytes, and why the restarts must not happen (empty when they may)."""

    memory_total_bytes: int
    free_bytes: int
    free_source: str
    freed_bytes: float
    needed_bytes: float
    margin_bytes: float
    steps: tuple[dict[str, Any], ...]
    reasons: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.reasons


def mem_free_bytes(meminfo_text: str) -> int:
    """MemFree of a /proc/meminfo text, in bytes (the kernel prints kB = KiB). Raises ValueError when absent."""
    for line in meminfo_text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemFree" and rest.split():
            return int(rest.split()[0]) * 1024
    raise ValueError("/proc/meminfo lacks MemFree")


def utilization_of_serve_args(serve_args: object) -> float | None:
    """The --gpu-memory-utilization of a `vllm serve` argument list; None when it is not there or not a number."""
    if not isinstance(serve_args, list):
        return None
    for position, arg in enumerate(serve_args):
        value = None
        if arg == UTILIZATION_FLAG and position + 1 < len(serve_args):
            value = serve_args[position + 1]
        elif isinstance(arg, str) and arg.startswith(UTILIZATION_FLAG + "="):
            value = arg.partition("=")[2]
        if value is not None:
            try:
                number = float(value)
            except (TypeError, ValueError):
                return None
            return number if 0 < number <= 1 else None
    return None


def running_utilization(last_good_json: str) -> float | None:
    """The gpu_memory_utilization of a last good configuration (the JSON the role keeps: serve_args, ...)."""
    try:
        configuration = json.loads(last_good_json)
    except ValueError:
        return None
    if not isinstance(configuration, Mapping):
        return None
    return utilization_of_serve_args(configuration.get("serve_args"))


def should_drop_caches(drop_caches: bool, check_mode: bool, units: list[StartUnit]) -> bool:
    """Drop the page cache only when asked, for real (not in check mode), and when a unit is about to start."""
    return drop_caches and not check_mode and any(unit.restart for unit in units)


def start_check(
    memory: Mapping[str, int],
    units: list[StartUnit],
    *,
    margin_gib: float,
    use_available: bool,
) -> StartCheck:
    """Whether the units about to (re)start find the memory their vLLMs need, step by step in their order.
    `memory` holds mem_total_bytes, mem_available_bytes and mem_free_bytes; `use_available` says that the page
    cache is (or will be) dropped before each start, so MemAvailable is what vLLM finds free, else MemFree."""
    total = memory["mem_total_bytes"]
    free = memory["mem_available_bytes"] if use_available else memory["mem_free_bytes"]
    free_source = "MemAvailable" if use_available else "MemFree (the page cache is not dropped)"
    in_use = max(0, total - free)
    margin = margin_gib * GIB
    freed = needed = 0.0
    steps = []
    exact: list[tuple[float, float]] = []  # (share, frees) of each step, in bytes
    reasons: list[str] = []
    restarting = [unit for unit in units if unit.restart]
    for unit in restarting:
        frees = 0.0
        if unit.running and unit.running_utilization is not None:
            frees = min(unit.running_utilization * total, in_use - freed)
        share = unit.gpu_memory_utilization * total
        exact.append((share, frees))
        freed += frees
        needed += share
        step = {
            "name": unit.name,
            "unit": unit.unit,
            "gpu_memory_utilization": unit.gpu_memory_utilization,
            "share_gib": round(share / GIB, 2),
            "running": unit.running,
            "frees_gib": round(frees / GIB, 2),
        }
        steps.append(step)
        if not reasons and free + freed < needed + margin:
            reasons.append(_start_reason(total, restarting, exact, free, free_source, freed, needed, margin))
    return StartCheck(
        memory_total_bytes=total,
        free_bytes=free,
        free_source=free_source,
        freed_bytes=freed,
        needed_bytes=needed,
        margin_bytes=margin,
        steps=tuple(steps),
        reasons=tuple(reasons),
    )


def _start_reason(
    total: int,
    restarting: list[StartUnit],
    exact: list[tuple[float, float]],
    free: float,
    free_source: str,
    freed: float,
    needed: float,
    margin: float,
) -> str:
    """Why the last of the steps in `exact` does not fit, and what to lower."""
    unit = restarting[len(exact) - 1]
    share = exact[-1][0]
    found = (
        f"not enough free memory to (re)start {unit.unit} ({unit.name}, gpu_memory_utilization "
        f"{unit.gpu_memory_utilization:.2f} = {_gib(share)} of {_gib(total)}): {_gib(free)} is free now ({free_source})"
    )
    steps = list(zip(restarting, exact, strict=False))
    frees = [f"{u.unit} frees {_gib(gives)} when it stops" for u, (_, gives) in steps if gives > 0]
    if frees:
        found += ", " + ", ".join(frees)
    unknown = [u.unit for u, _ in steps if u.running and u.running_utilization is None]
    if unknown:
        found += f", {', '.join(unknown)} runs a configuration with no last good record (counted as freeing nothing)"
    before = [f"{u.unit} takes {_gib(takes)} first" for u, (takes, _) in steps[:-1]]
    if before:
        found += ", " + ", ".join(before)
    found += f"; it needs {_gib(share)} plus the margin {_gib(margin)} (vllm_server_start_margin_gib)"
    why = (
        "vLLM refuses to start with less free memory than gpu_memory_utilization x total (vllm#48140), and a Spark "
        "whose memory runs out can freeze. Nothing was restarted: the running units keep their previous configuration "
        "(the new unit files are written and would apply at their next restart or at boot)"
    )
    room = free + freed - (needed - share) - margin
    fix = _hundredths(max(0.0, room) / total, up=False)
    fixes = []
    if fix > 0:
        fixes.append(f"lower {unit.name}.gpu_memory_utilization to {fix:.2f} or less")
    fixes.append("free memory on the host (`free -g` shows it; stop what else uses it)")
    fixes.append(f"lower vllm_server_start_margin_gib ({margin / GIB:.1f})")
    return f"{found}. {why}. Then {', or '.join(fixes)}, and run again"
