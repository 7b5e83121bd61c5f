"""Plain functions behind the vllm_memory_plan module: will a recipe's vLLM flags fit a DGX Spark's unified memory?

On a Spark the GPU has no VRAM of its own: `--gpu-memory-utilization` is a fraction of the 128 GB LPDDR5X pool
that the OS, Docker and the page cache share, and when that pool runs out the whole machine can freeze. This
module does the arithmetic before vLLM starts and refuses, with a value that would work, anything that does not
fit:

- per node (a model on tensor_parallel_size T x pipeline_parallel_size P Sparks: each holds 1/(T x P) of the
  weights, 1/T of the KV heads and its stage's layers, module_utils/parallel_layout.py):
  pool = ceil(MemTotal x gpu_memory_utilization); KV cache = pool - weights - overhead;
- the KV cache as vLLM 0.33 lays it out (module_utils/kv_cache_pages.py: pages of block_size tokens per layer,
  the layers in groups, a block one page of every layer slot of a group; one max_model_len sequence takes its
  full-attention tokens, its sliding-window layers' window and tokens in flight, and a hybrid model's Mamba states,
  each padded to one attention page, 3 per layer with prefix caching), with the per-token bytes of
  module_utils/model_config_figures.py (library/hf_model_figures measures a model with the very same functions);
- the KV budget is vLLM's: ceil(MemTotal x utilization) less the weights and the non-KV estimate (overhead_gib),
  less one null block; vLLM's start log prints the same plan as "KV cache size" and "Maximum concurrency";
- the OS keeps MemTotal x (1 - gpu_memory_utilization), at least os_reserve_min_gib;
- decode reads the active weights once per token, so tokens/s <= bandwidth / active weight bytes.

The flow is build_inputs() (recipe + overrides -> PlanInputs, or the list of what is wrong with them), then
plan() -> MemoryPlan, then as_dict() for the module's return values. What a recipe may hold is decided by
module_utils/recipe_rules.py alone: build_inputs() plans only a recipe its plan_problems() passes, and checks
nothing but the planner's own settings (settings_problems()).

The models of one host are planned together: each vLLM instance takes its own --gpu-memory-utilization share of
the one pool, so the sum must stay within max_gpu_memory_utilization and leave os_reserve_min_gib
(shared_pool_reasons(), host_plan()). Whether those shares are free on the host right before a restart is
module_utils/vllm_start_check.py's question.

Standard library only, besides module_utils/model_config_figures.py (the KV rules) and module_utils/recipe_rules.py
(the recipe rules).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ansible.module_utils.kv_cache_pages import CacheGroups, CacheLayers, cache_groups, mamba_state_bytes
from ansible.module_utils.memory_units import GIB, gib_text, hundredths
from ansible.module_utils.model_config_figures import (
    MLA_STATE_BYTES,
    AttentionLayout,
    full_attention_bytes_per_token_per_layer,
    kv_bytes_per_token_per_layer,
)
from ansible.module_utils.model_config_figures import kv_bytes_per_token as layout_kv_bytes_per_token
from ansible.module_utils.model_config_figures import kv_dtype_bytes as element_bytes
from ansible.module_utils.parallel_layout import (
    MAX_GROUP,
    group_size,
    largest_stage_share,
    stage_layers,
)
from ansible.module_utils.recipe_rules import (
    apply_overrides,
    kv_cache_memory_bytes,
    plan_problems,
    resolved_kv_cache_dtype,
    whole_number,
)
from ansible.module_utils.speculative import draft_figures

# vLLM 0.33's max_num_batched_tokens when the recipe does not set --max-num-batched-tokens: 2048 for the API
# server on a GB10 (engine/arg_utils.py, "small tier"). With async scheduling (on by default in 0.33) two batches
# are in flight (config/vllm.py max_concurrent_batches); a sliding-window layer keeps their tokens too.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

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
    """Everything the arithmetic needs, from a recipe vllm_recipe passed (build_inputs() makes these)."""

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
    # The full-attention layers' own heads where they differ from kv_heads / head_dim (Gemma 4); None: the same.
    full_attention_kv_heads: int | None = None
    full_attention_head_dim: int | None = None
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    dtype: str = "bfloat16"  # the model dtype (a Mamba conv state's)
    mamba_kind: str | None = None
    mamba_layers: int = 0
    mamba_dims: Mapping[str, Any] | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    concurrent_batches: int = 2
    prefix_caching: bool = True  # vLLM's default; for a hybrid it means Mamba cache mode "align"
    speculative_tokens: int = 0
    # The speculative draft (module_utils/speculative.py draft_figures): its weights, and its attention layers,
    # which have the model's shape and join the full-attention layers' KV cache.
    draft_weight_bytes: float = 0.0
    draft_attention_layers: int = 0
    measured_decode_tok_s: float | None = None
    # --kv-cache-memory-bytes (recipe key kv_cache_memory_gib): vLLM then takes exactly this for the KV cache and
    # no longer sizes it from the share; the share still counts for the OS reserve and vLLM's start check.
    kv_cache_memory_bytes: int | None = None
    # Pipeline stages (--pipeline-parallel-size): with tensor_parallel_size, the group of Sparks the model runs on
    # (module_utils/parallel_layout.py); each stage holds its share of the layers.
    pipeline_parallel_size: int = 1
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
    groups: CacheGroups
    max_concurrency: float  # vLLM's logged "Maximum concurrency for max_model_len tokens per request"
    longest_sequence_tokens: int  # the longest single sequence admitted, at most max_model_len

    @property
    def fits(self) -> bool:
        return not self.reasons


# ---------------------------------------------------------------------------------------------------------------
# The inputs: a recipe vllm_recipe passed, and the planner's own settings


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def settings_problems(
    memory_total_bytes: object,
    overhead_gib: object,
    os_reserve_min_gib: object,
    max_gpu_memory_utilization: object,
    bandwidth_gb_s: object,
) -> list[str]:
    """What is wrong with the planner's own settings (the module's options, not recipe keys), one message each."""
    problems = []
    if not (_is_number(memory_total_bytes) and memory_total_bytes > 0):
        problems.append(f"memory_total_bytes={memory_total_bytes!r}: must be the host's MemTotal, in bytes (> 0)")
    for key, value in (("overhead_gib", overhead_gib), ("os_reserve_min_gib", os_reserve_min_gib)):
        if not (_is_number(value) and value >= 0):
            problems.append(f"{key}={value!r}: must be a number of GiB, 0 or more")
    if not (_is_number(max_gpu_memory_utilization) and 0 < max_gpu_memory_utilization <= 1):
        problems.append(
            f"max_gpu_memory_utilization={max_gpu_memory_utilization!r}: must be a fraction in (0, 1], e.g. 0.90"
        )
    if not (_is_number(bandwidth_gb_s) and bandwidth_gb_s > 0):
        problems.append(f"bandwidth_gb_s={bandwidth_gb_s!r}: must be the memory bandwidth in GB/s (> 0)")
    return problems


def batching(recipe: Mapping) -> tuple[int, int]:
    """(max_num_batched_tokens, concurrent batches) of a checked recipe's serve_flags: what a sliding-window layer
    keeps beyond its window (vLLM max_in_flight_tokens). vLLM's defaults where the recipe sets neither."""
    flags = recipe.get("serve_flags")
    flags = flags if isinstance(flags, Mapping) else {}
    tokens = whole_number(flags.get("max-num-batched-tokens"))
    asynchronous = flags.get("async-scheduling") is not False
    batches = 2 if asynchronous else 1
    # Pipeline stages keep one batch each in flight, and one more with async scheduling on vLLM's V2 model runner
    # (VllmConfig.max_concurrent_batches); the larger count is planned.
    stages = recipe.get("pipeline_parallel_size") or 1
    if isinstance(stages, int) and stages > 1:
        batches = stages + 1 if asynchronous else stages
    return (DEFAULT_MAX_NUM_BATCHED_TOKENS if tokens is None else tokens), batches


def speculative_tokens(recipe: Mapping) -> int:
    """num_speculative_tokens of a recipe's speculative block (module_utils/speculative.py); 0 without one.
    Each speculative token adds a Mamba state page per layer and widens its conv state (kv_cache_pages.py)."""
    block = recipe.get("speculative")
    tokens = whole_number(block.get("num_speculative_tokens")) if isinstance(block, Mapping) else None
    return tokens if isinstance(tokens, int) else 0


def build_inputs(
    recipe: object,
    overrides: Mapping | None = None,
    *,
    memory_total_bytes: object,
    name: str = "recipe",
    overhead_gib: object = 2.0,
    os_reserve_min_gib: object = 8.0,
    max_gpu_memory_utilization: object = DEFAULT_MAX_GPU_MEMORY_UTILIZATION,
    bandwidth_gb_s: object = 273.0,
) -> tuple[PlanInputs | None, list[str]]:
    """The inputs of the plan: `recipe` with each override that is not None laid over it, checked by
    recipe_rules.plan_problems() (the planner has no input rules of its own), and the planner's settings checked by
    settings_problems(). Returns (inputs, []) or (None, every problem found, each naming `name`)."""
    if isinstance(recipe, Mapping):
        given = {key: value for key, value in (overrides or {}).items() if value is not None}
        recipe = apply_overrides(dict(recipe), given)
    problems = plan_problems(recipe, name) + settings_problems(
        memory_total_bytes, overhead_gib, os_reserve_min_gib, max_gpu_memory_utilization, bandwidth_gb_s
    )
    if problems:
        return None, problems
    architecture = recipe["architecture"]
    batched_tokens, batches = batching(recipe)
    flags = recipe.get("serve_flags") or {}
    measured = (recipe.get("measured") or {}).get("decode_tok_s")
    draft_weights, draft_layers = draft_figures(recipe)
    return PlanInputs(
        name=name,
        memory_total_bytes=int(memory_total_bytes),
        gpu_memory_utilization=float(recipe["gpu_memory_utilization"]),
        max_model_len=recipe["max_model_len"],
        max_num_seqs=recipe["max_num_seqs"],
        kv_cache_dtype=recipe["kv_cache_dtype"],
        kv_cache_dtype_resolved=resolved_kv_cache_dtype(recipe),
        tensor_parallel_size=recipe["tensor_parallel_size"],
        pipeline_parallel_size=int(recipe.get("pipeline_parallel_size") or 1),
        weight_bytes=float(architecture["weight_bytes"]),
        attention_layers=architecture["attention_layers"],
        kv_heads=architecture["kv_heads"],
        head_dim=architecture["head_dim"],
        active_params_b=float(architecture["active_params_b"]),
        bytes_per_param=float(architecture["bytes_per_param"]),
        max_context=architecture["max_context"],
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
        max_num_batched_tokens=batched_tokens,
        concurrent_batches=batches,
        prefix_caching=flags.get("enable-prefix-caching") is not False,
        speculative_tokens=speculative_tokens(recipe),
        draft_weight_bytes=draft_weights,
        draft_attention_layers=draft_layers,
        measured_decode_tok_s=None if measured is None else float(measured),
        kv_cache_memory_bytes=(
            None if recipe.get("kv_cache_memory_gib") is None else kv_cache_memory_bytes(recipe["kv_cache_memory_gib"])
        ),
        overhead_gib=float(overhead_gib),
        os_reserve_min_gib=float(os_reserve_min_gib),
        max_gpu_memory_utilization=float(max_gpu_memory_utilization),
        bandwidth_gb_s=float(bandwidth_gb_s),
    ), []


# ---------------------------------------------------------------------------------------------------------------
# Arithmetic (per node)


def nodes(inputs: PlanInputs) -> int:
    """The Sparks the model runs on: tensor_parallel_size x pipeline_parallel_size, one GPU each."""
    return group_size(inputs.tensor_parallel_size, inputs.pipeline_parallel_size)


def weights_bytes_per_node(inputs: PlanInputs) -> float:
    """The model's weights and its draft's on the fullest node. Tensor parallelism splits every layer evenly.
    Pipeline stages are uneven: the largest stage's layers (vLLM's split), plus one layer's worth for the input
    embedding or output head that the first and last stage also hold. The draft runs whole on the last stage,
    split only by tensor parallelism (vLLM gives it pipeline_parallel_size 1)."""
    tp, stages = inputs.tensor_parallel_size, inputs.pipeline_parallel_size
    if stages == 1:
        return (inputs.weight_bytes + inputs.draft_weight_bytes) / tp
    layers = inputs.attention_layers + inputs.mamba_layers
    largest = max(stage_layers(layers, stages)) + 1
    return (inputs.weight_bytes * min(1.0, largest / layers) + inputs.draft_weight_bytes) / tp


def without_draft(inputs: PlanInputs) -> PlanInputs:
    return replace(inputs, draft_weight_bytes=0.0, draft_attention_layers=0)


def has_draft(inputs: PlanInputs) -> bool:
    return bool(inputs.draft_weight_bytes or inputs.draft_attention_layers)


def attention_layout(inputs: PlanInputs) -> AttentionLayout:
    """The recipe's attention figures as the layout the shared KV rules read (model_config_figures), with the
    defaults of a recipe that does not describe its attention kinds: every attention layer full, no Mamba layer."""
    sliding = inputs.sliding_window_layers
    full = inputs.attention_layers - sliding if inputs.full_attention_layers is None else inputs.full_attention_layers
    # A pipeline stage holds its share of each kind of layer (the largest stage's, vLLM's split).
    stages = inputs.pipeline_parallel_size
    sliding, full = largest_stage_share(sliding, stages), largest_stage_share(full, stages)
    mamba = largest_stage_share(inputs.mamba_layers, stages)
    full += inputs.draft_attention_layers
    return AttentionLayout(
        model_type=inputs.name,
        kind=inputs.attention_kind,
        layers=full + sliding + mamba,
        full_attention_layers=full,
        sliding_window_layers=sliding,
        sliding_window=inputs.sliding_window,
        kv_heads=inputs.kv_heads,
        head_dim=inputs.head_dim,
        full_attention_kv_heads=inputs.full_attention_kv_heads,
        full_attention_head_dim=inputs.full_attention_head_dim,
        mamba_layers=mamba,
    )


def kv_bytes_per_token(inputs: PlanInputs) -> int:
    """Bytes per token over the full-attention layers on one node (model_config_figures.kv_bytes_per_token: tensor
    parallelism splits the KV heads, at least one per node; an MLA latent vector is not split)."""
    return layout_kv_bytes_per_token(
        attention_layout(inputs), inputs.kv_cache_dtype_resolved, inputs.tensor_parallel_size
    )


def cache_layers(inputs: PlanInputs) -> CacheLayers:
    """The layers that hold cache on one node, as module_utils/kv_cache_pages.py plans them."""
    layout = attention_layout(inputs)
    per_token = kv_bytes_per_token_per_layer(
        layout.kind, layout.kv_heads, layout.head_dim, inputs.kv_cache_dtype_resolved, inputs.tensor_parallel_size
    )
    state = 0
    if inputs.mamba_layers:
        state = mamba_state_bytes(
            inputs.mamba_kind,
            inputs.mamba_dims,
            inputs.dtype,
            inputs.tensor_parallel_size,
            inputs.speculative_tokens,
        )
    full = full_attention_bytes_per_token_per_layer(layout, inputs.kv_cache_dtype_resolved, inputs.tensor_parallel_size)
    return CacheLayers(
        attention_bytes_per_token=per_token,
        full_bytes_per_token=full if full != per_token else 0,
        full_attention_layers=layout.full_attention_layers,
        sliding_window_layers=layout.sliding_window_layers,
        sliding_window=layout.sliding_window,
        max_in_flight_tokens=inputs.concurrent_batches * inputs.max_num_batched_tokens,
        mla=layout.kind == "mla",
        mamba_kind=inputs.mamba_kind,
        mamba_layers=layout.mamba_layers,
        mamba_state_bytes=state,
        prefix_caching=inputs.prefix_caching,
        speculative_tokens=inputs.speculative_tokens,
    )


def groups(inputs: PlanInputs, max_model_len: int | None = None) -> CacheGroups:
    """vLLM's KV cache groups and pages for these inputs at max_model_len (default: the recipe's)."""
    return cache_groups(cache_layers(inputs), inputs.max_model_len if max_model_len is None else max_model_len)


def kv_bytes_per_sequence(inputs: PlanInputs, max_model_len: int) -> int:
    """The KV cache one sequence of max_model_len tokens takes on one node, in vLLM's blocks: every group's pages
    (full attention: the tokens; sliding window: the window and the tokens in flight; Mamba: its state pages)."""
    return groups(inputs, max_model_len).bytes_per_sequence


def kv_bytes_needed(inputs: PlanInputs, max_model_len: int) -> int:
    """The least KV budget that admits one sequence of max_model_len tokens: its blocks and vLLM's null block."""
    found = groups(inputs, max_model_len)
    return found.bytes_per_sequence + found.bytes_per_block


def pool_bytes(inputs: PlanInputs, utilization: float) -> float:
    """vLLM's requested memory: ceil(total x gpu_memory_utilization) (v1/worker/utils.py request_memory)."""
    return math.ceil(inputs.memory_total_bytes * utilization)


def overhead_bytes(inputs: PlanInputs) -> float:
    """The non-KV memory beyond the weights that vLLM measures at start (activation peak, CUDA-graph estimate,
    non-torch allocations; v1/worker/gpu_worker.py determine_available_memory): an estimate, overhead_gib."""
    return inputs.overhead_gib * GIB


def kv_cache_bytes(inputs: PlanInputs, utilization: float) -> float:
    """The KV budget as vLLM computes it: requested memory less the non-KV memory (weights and overhead_bytes());
    negative when the weights alone do not fit."""
    if inputs.kv_cache_memory_bytes is not None:
        return float(inputs.kv_cache_memory_bytes)  # vLLM's determine_available_memory returns it as it is
    return pool_bytes(inputs, utilization) - weights_bytes_per_node(inputs) - overhead_bytes(inputs)


def sequences_held(inputs: PlanInputs, utilization: float) -> int:
    """How many sequences of max_model_len tokens the KV cache holds at once (vLLM's blocks less the null block)."""
    return groups(inputs).sequences_held(max(0.0, kv_cache_bytes(inputs, utilization)))


def kv_capacity_tokens(inputs: PlanInputs, utilization: float) -> int:
    """vLLM's "KV cache size: N tokens": its maximum concurrency x max_model_len (not one sequence's length)."""
    return groups(inputs).kv_cache_size_tokens(max(0.0, kv_cache_bytes(inputs, utilization)))


def longest_sequence_tokens(inputs: PlanInputs, utilization: float) -> int:
    """The longest single sequence the KV cache admits, at most max_model_len (vLLM's estimated maximum model
    length when max_model_len does not fit)."""
    return groups(inputs).longest_sequence(max(0.0, kv_cache_bytes(inputs, utilization)))


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


def largest_safe_utilization(inputs: PlanInputs) -> float | None:
    """The largest gpu_memory_utilization (a multiple of 0.01) within max_gpu_memory_utilization that leaves
    os_reserve_min_gib; None when even 0.01 leaves too little."""
    limit = min(inputs.max_gpu_memory_utilization, 1 - inputs.os_reserve_min_gib * GIB / inputs.memory_total_bytes)
    utilization = hundredths(limit, up=False)
    while utilization > 0 and not utilization_is_safe(inputs, utilization):
        utilization = round(utilization - 0.01, 2)
    return utilization if utilization > 0 else None


def smallest_utilization_holding(inputs: PlanInputs, tokens: int) -> float | None:
    """The smallest gpu_memory_utilization (a multiple of 0.01) whose KV cache holds `tokens`; None if below 1
    there is none. Safety is the caller's question."""
    sequence = kv_bytes_needed(inputs, tokens)
    if inputs.kv_cache_memory_bytes is not None:
        # The KV cache is the size given, whatever the share: the share must hold weights, overhead and it.
        if inputs.kv_cache_memory_bytes < sequence:
            return None
        utilization = max(0.01, hundredths(footprint_bytes(inputs) / inputs.memory_total_bytes, up=True))
        return utilization if utilization < 1 else None
    needed = weights_bytes_per_node(inputs) + overhead_bytes(inputs) + sequence
    utilization = max(0.01, hundredths(needed / inputs.memory_total_bytes, up=True))
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


def _safety_reason(inputs: PlanInputs, safe: float | None) -> str | None:
    utilization = inputs.gpu_memory_utilization
    if safe is not None and utilization_is_safe(inputs, utilization):
        return None
    label = f"{inputs.name}.gpu_memory_utilization={utilization}"
    reserve = os_reserve_bytes(inputs, utilization)
    found = (
        f"it leaves {gib_text(reserve)} of {gib_text(inputs.memory_total_bytes)} for the OS, Docker and page cache "
        f"(os_reserve_min_gib asks for {inputs.os_reserve_min_gib:.1f} GiB)"
    )
    if utilization > inputs.max_gpu_memory_utilization:
        found += f" and is above max_gpu_memory_utilization {inputs.max_gpu_memory_utilization:.2f}"
    risk = "when the shared pool runs out a Spark can freeze and need a power cycle"
    if safe is None:
        return (
            f"{label}: no gpu_memory_utilization leaves os_reserve_min_gib {inputs.os_reserve_min_gib:.1f} GiB of "
            f"this host's {gib_text(inputs.memory_total_bytes)}; {risk}"
        )
    fix = f"set gpu_memory_utilization to {safe:.2f} or lower"
    least = safe_utilization_holding(inputs, inputs.max_model_len)
    if least is not None and least < safe:
        fix += f" (at least {least:.2f} to hold one {inputs.max_model_len:,}-token sequence)"
    return f"{label}: {found}; {risk}; {fix}"


def _bigger_setup_hint(inputs: PlanInputs) -> str:
    """What to try when the nodes cannot hold the model at any safe utilization: a group twice the size, split by
    tensor parallelism where the KV heads allow it, else by pipeline stages, up to the largest group."""
    if nodes(inputs) * 2 > MAX_GROUP:
        return "use a smaller quantization (e.g. NVFP4)"
    tp = inputs.tensor_parallel_size * 2
    if inputs.kv_heads and inputs.kv_heads % tp and tp % inputs.kv_heads:
        bigger = replace(inputs, pipeline_parallel_size=inputs.pipeline_parallel_size * 2)
        setting = f"pipeline_parallel_size to {bigger.pipeline_parallel_size}"
    else:
        bigger = replace(inputs, tensor_parallel_size=tp)
        setting = f"tensor_parallel_size to {tp}"
    utilization = safe_utilization_holding(bigger, inputs.max_model_len)
    size = nodes(bigger)
    if utilization is None:
        return (
            f"use a smaller quantization (e.g. NVFP4); even {setting.replace(' to ', ' ')} "
            f"({size} Sparks) would not hold it with one {inputs.max_model_len:,}-token sequence"
        )
    return (
        f"use a smaller quantization (e.g. NVFP4), or set {inputs.name}.{setting} ({size} Sparks) with "
        f"gpu_memory_utilization {utilization:.2f}"
    )


def _weights_reason(inputs: PlanInputs, utilization: float, at_safe_limit: bool) -> str:
    weights, overhead = weights_bytes_per_node(inputs), overhead_bytes(inputs)
    per_node = " per node" if nodes(inputs) > 1 else ""
    found = (
        f"the weights ({gib_text(weights)}{per_node}) plus overhead ({gib_text(overhead)}) need "
        f"{gib_text(weights + overhead)}, more than the {gib_text(pool_bytes(inputs, utilization))} pool "
        f"({utilization:.2f} of {gib_text(inputs.memory_total_bytes)})"
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
    sparks = "one Spark" if nodes(inputs) == 1 else f"{nodes(inputs)} Sparks"
    return (
        f"{label}: {found}; the model does not fit {sparks} at any safe gpu_memory_utilization: "
        f"{_bigger_setup_hint(inputs)}"
    )


def _context_reason(inputs: PlanInputs, utilization: float, at_safe_limit: bool) -> str:
    capacity = longest_sequence_tokens(inputs, utilization)
    where = (
        f"at the largest safe gpu_memory_utilization {utilization:.2f}"
        if at_safe_limit
        else f"at gpu_memory_utilization {utilization:.2f}"
    )
    found = (
        f"{inputs.name}.max_model_len={inputs.max_model_len}: the KV cache admits one sequence of at most "
        f"{capacity:,} tokens {where}, less than one full-length sequence"
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


def footprint_bytes(inputs: PlanInputs) -> float:
    """What one node of the model takes with its KV cache sized in bytes: weights, overhead and that KV cache."""
    return weights_bytes_per_node(inputs) + overhead_bytes(inputs) + (inputs.kv_cache_memory_bytes or 0)


def _kv_gib_text(value: float) -> str:
    return f"{math.ceil(value / GIB * 10) / 10:g}"


def _explicit_kv_reasons(inputs: PlanInputs, utilization: float) -> list[str]:
    """With kv_cache_memory_gib, vLLM takes that KV cache whatever the share: the weights, overhead and KV cache
    must stay within the share the OS reserve is counted from, and the KV cache must hold one full sequence.
    Each suggested fix, followed alone, gives a plan that fits."""
    label = f"{inputs.name}.kv_cache_memory_gib={inputs.kv_cache_memory_bytes / GIB:g}"
    one_sequence = kv_bytes_needed(inputs, inputs.max_model_len)
    reasons = []
    needed = footprint_bytes(inputs)
    if needed > pool_bytes(inputs, utilization):
        fixes = []
        share = _share_holding(inputs, inputs.kv_cache_memory_bytes)
        if share is not None:
            fixes.append(f"gpu_memory_utilization to {share:.2f}")
        room = pool_bytes(inputs, utilization) - weights_bytes_per_node(inputs) - overhead_bytes(inputs)
        offer = math.floor(room / GIB * 10) / 10
        floor = math.ceil(one_sequence / GIB * 10) / 10
        if offer >= floor:
            fixes.append(
                f"kv_cache_memory_gib to {offer:g} or lower (not below {floor:g}, one "
                f"{inputs.max_model_len:,}-token sequence)"
            )
        fix = f"set {', or '.join(fixes)}" if fixes else _bigger_setup_hint(inputs)
        reasons.append(
            f"{label}: the weights ({gib_text(weights_bytes_per_node(inputs))}) plus overhead "
            f"({gib_text(overhead_bytes(inputs))}) plus this KV cache need {gib_text(needed)}, more than the "
            f"gpu_memory_utilization share of {gib_text(pool_bytes(inputs, utilization))} ({utilization:.2f}) that "
            f"the OS reserve is counted from; vLLM would take it anyway and leave the OS less; {fix}"
        )
    if sequences_held(inputs, utilization) < 1:
        fixes = []
        enough = math.ceil(one_sequence / GIB * 10) / 10 * GIB
        if footprint_bytes(replace(inputs, kv_cache_memory_bytes=enough)) <= pool_bytes(inputs, utilization):
            fixes.append(f"kv_cache_memory_gib to {_kv_gib_text(one_sequence)}")
        else:
            share = _share_holding(inputs, enough)
            if share is not None:
                fixes.append(
                    f"kv_cache_memory_gib to {_kv_gib_text(one_sequence)} with gpu_memory_utilization {share:.2f}"
                )
        shorter = longest_sequence_tokens(inputs, utilization) // CONTEXT_STEP * CONTEXT_STEP
        if shorter:
            fixes.append(f"max_model_len to {shorter} or lower")
        fix = f"set {', or '.join(fixes)}" if fixes else _bigger_setup_hint(inputs)
        reasons.append(
            f"{label}: the KV cache admits one sequence of at most {longest_sequence_tokens(inputs, utilization):,} "
            f"tokens, less than one {inputs.max_model_len:,}-token sequence; {fix}"
        )
    return reasons


def _share_holding(inputs: PlanInputs, kv_cache_bytes_given: float) -> float | None:
    """The smallest safe gpu_memory_utilization whose share holds the weights, overhead and a KV cache of
    `kv_cache_bytes_given`; None when no safe share does."""
    sized = replace(inputs, kv_cache_memory_bytes=kv_cache_bytes_given)
    share = hundredths(footprint_bytes(sized) / inputs.memory_total_bytes, up=True)
    return share if utilization_is_safe(inputs, share) else None


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
    if inputs.kv_cache_memory_bytes is not None:
        reasons += _explicit_kv_reasons(inputs, utilization)
    elif kv_cache_bytes(inputs, utilization) < 0:
        reasons.append(_weights_reason(inputs, utilization, at_safe_limit))
    elif sequences_held(inputs, utilization) < 1:
        reasons.append(_context_reason(inputs, utilization, at_safe_limit))
    if reasons and has_draft(inputs) and not refusal_reasons(without_draft(inputs)):
        reasons[-1] += (
            f"; or do without speculative decoding: {draft_cost(inputs)}, and without it the plan fits (drop the "
            "entry's speculative block, or set vllm_server_speculation: false for the host)"
        )
    return reasons


def draft_cost(inputs: PlanInputs) -> str:
    """What the draft takes on this node: its weights, its KV layers, and the full-length sequences they cost at
    the planned utilization."""
    utilization = inputs.gpu_memory_utilization
    lost = sequences_held(without_draft(inputs), utilization) - sequences_held(inputs, utilization)
    weights = inputs.draft_weight_bytes / inputs.tensor_parallel_size
    layers = inputs.draft_attention_layers
    return (
        f"the draft takes {gib_text(weights)} of weights and {layers} attention layer{'s' if layers != 1 else ''} "
        f"of KV cache, {lost:,} {inputs.max_model_len:,}-token sequence{'s' if lost != 1 else ''} fewer"
    )


# ---------------------------------------------------------------------------------------------------------------
# The plan


def plan(inputs: PlanInputs) -> MemoryPlan:
    utilization = inputs.gpu_memory_utilization
    found = groups(inputs)
    budget = max(0.0, kv_cache_bytes(inputs, utilization))
    return MemoryPlan(
        inputs=inputs,
        weights_bytes=weights_bytes_per_node(inputs),
        kv_bytes_per_token=kv_bytes_per_token(inputs),
        kv_bytes_per_sequence=found.bytes_per_sequence,
        pool_bytes=pool_bytes(inputs, utilization),
        kv_cache_bytes=budget,
        kv_capacity_tokens=found.kv_cache_size_tokens(budget),
        max_full_length_seqs=found.sequences_held(budget),
        os_reserve_bytes=os_reserve_bytes(inputs, utilization),
        decode_bound_tok_s=decode_bound_tok_s(inputs),
        reasons=tuple(refusal_reasons(inputs)),
        groups=found,
        max_concurrency=found.max_concurrency(budget),
        longest_sequence_tokens=found.longest_sequence(budget),
    )


def summary(memory_plan: MemoryPlan) -> str:
    """One human line: what goes where, the concurrency (in the words of vLLM's own log line) and the speed."""
    inputs = memory_plan.inputs
    found = memory_plan.groups
    per_node = "" if nodes(inputs) == 1 else f" per node of {nodes(inputs)}"
    verdict = "fits" if memory_plan.fits else "DOES NOT FIT"
    line = (
        f"{inputs.name} {verdict}{per_node}: weights {gib_text(memory_plan.weights_bytes)} + non-KV estimate "
        f"{gib_text(overhead_bytes(inputs))} + KV cache {gib_text(memory_plan.kv_cache_bytes)}"
        f"{' (kv_cache_memory_gib)' if inputs.kv_cache_memory_bytes is not None else ''} in a "
        f"{gib_text(memory_plan.pool_bytes)} pool (gpu_memory_utilization {inputs.gpu_memory_utilization:.2f} of "
        f"{gib_text(inputs.memory_total_bytes)}), {gib_text(memory_plan.os_reserve_bytes)} left for the OS; one "
        f"{inputs.max_model_len:,}-token sequence takes {memory_plan.kv_bytes_per_sequence / 2**20:,.1f} MiB "
        f"({found.blocks_per_request:,} blocks of {found.block_size:,} tokens x {found.bytes_per_block:,} B"
    )
    line += "".join(f"; {note}" for note in (*_state_parts(inputs), *found.notes))
    line += f") = {memory_plan.max_full_length_seqs:,} sequences of {inputs.max_model_len:,} tokens"
    line += (
        f" (vLLM logs: KV cache size {memory_plan.kv_capacity_tokens:,} tokens, maximum concurrency for "
        f"{inputs.max_model_len:,} tokens per request {memory_plan.max_concurrency:,.2f}x)"
    )
    if inputs.max_num_seqs > memory_plan.max_full_length_seqs:
        line += (
            f"; max_num_seqs {inputs.max_num_seqs} is more: fine, vLLM schedules by active context, so that many "
            "run at once only while their contexts are shorter"
        )
    if has_draft(inputs):
        line += f"; speculative decoding ({inputs.speculative_tokens} tokens): {draft_cost(inputs)}"
    line += f"; decode at most {memory_plan.decode_bound_tok_s:,.1f} tok/s (bandwidth bound)"
    if inputs.measured_decode_tok_s is not None:
        line += f", {inputs.measured_decode_tok_s:,.1f} tok/s measured"
    return line


def _state_parts(inputs: PlanInputs) -> list[str]:
    """What a sequence holds besides its tokens, for the summary."""
    parts = []
    if inputs.sliding_window_layers:
        parts.append(f"{inputs.sliding_window_layers} sliding-window layers keep {inputs.sliding_window:,} tokens")
    if inputs.mamba_layers:
        mode = "align mode (prefix caching)" if inputs.prefix_caching else "no prefix caching"
        parts.append(f"{inputs.mamba_layers} {inputs.mamba_kind} layers keep their state, {mode}")
    return parts


def as_dict(memory_plan: MemoryPlan) -> dict[str, Any]:
    """The module's return values."""
    inputs = memory_plan.inputs
    return {
        "weights_gib": round(memory_plan.weights_bytes / GIB, 2),
        "kv_bytes_per_token": memory_plan.kv_bytes_per_token,
        "kv_bytes_per_sequence": memory_plan.kv_bytes_per_sequence,
        "kv_capacity_tokens": memory_plan.kv_capacity_tokens,
        "max_full_length_seqs": memory_plan.max_full_length_seqs,
        "max_concurrency": round(memory_plan.max_concurrency, 2),
        "longest_sequence_tokens": memory_plan.longest_sequence_tokens,
        "block_size": memory_plan.groups.block_size,
        "os_reserve_gib": round(memory_plan.os_reserve_bytes / GIB, 2),
        "decode_bound_tok_s": round(memory_plan.decode_bound_tok_s, 1),
        "measured_decode_tok_s": inputs.measured_decode_tok_s,
        "fits": memory_plan.fits,
        "reasons": list(memory_plan.reasons),
        "pool_gib": round(memory_plan.pool_bytes / GIB, 2),
        "kv_cache_gib": round(memory_plan.kv_cache_bytes / GIB, 2),
        "memory_total_gib": round(inputs.memory_total_bytes / GIB, 2),
        "tensor_parallel_size": inputs.tensor_parallel_size,
        "pipeline_parallel_size": inputs.pipeline_parallel_size,
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "max_model_len": inputs.max_model_len,
        "max_num_seqs": inputs.max_num_seqs,
        "kv_cache_dtype": inputs.kv_cache_dtype,
        "prefix_caching": inputs.prefix_caching,
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
        "max_concurrency",
        "longest_sequence_tokens",
        "block_size",
        "os_reserve_gib",
        "decode_bound_tok_s",
        "measured_decode_tok_s",
        "pool_gib",
        "kv_cache_gib",
        "memory_total_gib",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "kv_cache_dtype",
        "prefix_caching",
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
        candidate = hundredths(limit - others, up=False)
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
        f"instance, so they take {gib_text(inputs.memory_total_bytes * total)} of the one "
        f"{gib_text(inputs.memory_total_bytes)} pool and leave {gib_text(inputs.memory_total_bytes * (1 - total))} "
        f"for the OS, Docker and page cache (os_reserve_min_gib asks for {inputs.os_reserve_min_gib:.1f} GiB)"
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
        f"{gib_text(inputs.memory_total_bytes)} ({gib_text(inputs.memory_total_bytes * total)}), "
        f"{gib_text(inputs.memory_total_bytes * (1 - total))} left for the OS"
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
