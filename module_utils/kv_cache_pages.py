"""How vLLM 0.33 lays out its KV cache in pages and blocks, and so how many sequences a KV budget holds.

The memory planner (module_utils/memory_plan.py) asks this module one question: for these layers and flags, what
does one sequence of max_model_len tokens take, and how many such sequences does a budget of bytes admit? The
answer follows vLLM's own planning, rule by rule (paths under vllm/ of the 0.33.0 wheel), and
tests/unit/test_memory_plan_contract.py holds it to vLLM's answer, computed with the real classes
(tests/contracts/vllm/kv_cache_plans.py writes it):

- A page holds `block_size` tokens of one layer. Attention page = block_size x KV heads per rank x (K + V head
  size) x dtype bytes (v1/kv_cache_interface.py AttentionSpec.page_size_bytes); an MLA layer stores one latent
  vector, no V (MLAAttentionSpec). The block size is 16 (config/cache.py DEFAULT_BLOCK_SIZE; the Spark's attention
  kernels, TRITON_ATTN / FLASHINFER / TRITON_MLA, take multiples of 16).
- A Mamba-2 / Gated DeltaNet layer keeps a state per sequence: a conv state (conv_dim / TP x (conv_kernel - 1 +
  speculative tokens)) in the model dtype and an SSM state (heads / TP x head_dim x state) in the SSM cache dtype
  (model_executor/layers/mamba/mamba_utils.py mamba2_state_shape, gated_delta_net_state_shape).
- A hybrid model's attention block size is raised until one attention page holds a Mamba state, in steps of the
  kernel alignment (16; 128 for MLA; with prefix caching also lcm with the Mamba layers' prefill checkpoint
  alignment: 1 for Mamba-2, 64 for Gated DeltaNet on FlashInfer's prefill, which sm_12x runs), and the Mamba page
  is padded up to that attention page (platforms/interface.py Platform._align_hybrid_block_size).
- Prefix caching is on by default, and for a hybrid it sets the Mamba cache mode "align" (models/config.py
  MambaModelConfig): each Mamba layer then holds 2 + speculative tokens + 1 prefill checkpoint pages per request,
  else 1 + speculative tokens (MambaSpec.max_memory_usage_bytes; mamba_mixer2.py / qwen_gdn_linear_attn.py
  get_kv_cache_spec set the checkpoint).
- Full-attention layers whose heads differ from the sliding-window layers' (Gemma 4: wider heads, fewer KV heads
  on its full layers) have pages of another size. vLLM 0.33 resolves such a model to the layer-outermost layout
  LBNHC (the first of the default preference that is block-compact: v1/attention/backends/utils.py
  resolve_kv_cache_layout), so it does not pack; it unifies the pages (v1/core/kv_cache_planning.py
  unify_kv_cache_spec_page_size): a smaller page that divides the largest gets its block size times the ratio,
  any other is padded to the largest page. A group's block size is then its own.
- Layers of one kind share a group; with several kinds every group has the same number of layer slots, the
  smallest kind's count (or the largest when it is under 1.5 x the smallest), the last group of a kind padded
  (v1/core/kv_cache_planning.py _get_kv_cache_groups_uniform_page_size). A block is one page of every slot of a
  group: bytes per block = slots x page. A request takes, in every group, the blocks of its kind: full attention
  cdiv(max_model_len, block_size); sliding window cdiv(min(window - 1 + tokens in flight, max_model_len),
  block_size) + 1 (SlidingWindowSpec.max_admission_blocks_per_request); Mamba its pages.
- The budget is cut into budget // bytes_per_block blocks, one of which is the null block vLLM holds back
  (get_kv_cache_configs): a max_model_len sequence is admitted when budget - one block covers its blocks. vLLM logs
  "Maximum concurrency for N tokens per request: X" with X = blocks / blocks per request, null block included
  (v1/core/kv_cache_utils.py get_kv_cache_capacity), and "KV cache size: X x max_model_len tokens".

Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE = 16  # config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE; the Spark's attention kernels take multiples of 16
# The smallest kernel block of TRITON_ATTN, FLASHINFER and TRITON_MLA (get_supported_kernel_block_sizes).
KERNEL_ALIGNMENT = 16
MLA_HYBRID_ALIGNMENT = 128  # _align_hybrid_block_size: MLA decode kernels want the block a multiple of 128
# Tokens a Mamba layer's prefill checkpoint lands on, in align mode (get_prefill_checkpoint_alignment):
# mamba_mixer2.py exports any position; Gated DeltaNet on FlashInfer's prefill every 64 (gdn_attn.py).
CHECKPOINT_ALIGNMENT = {"mamba2": 1, "gated_delta_net": 64}
PREFILL_CHECKPOINT_PAGES = 1  # mamba_mixer2.py / qwen_gdn_linear_attn.py num_prefill_checkpoint_blocks
GROUP_SIZE_RATIO = 1.5  # _get_kv_cache_groups_uniform_page_size: use the largest count when under 1.5 x smallest

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAMBA_DIMS = {
    "mamba2": ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel"),
    "gated_delta_net": (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
}
SSM_DTYPES = ("auto", *DTYPE_BYTES)  # "auto": the model dtype


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CacheLayers:
    """The layers that hold cache on one node, and the flags that size them."""

    attention_bytes_per_token: int  # one attention layer, one token, this node (MLA: the latent vector)
    full_attention_layers: int
    # One full-attention layer, one token, this node, where its heads differ from the others' (0: the same).
    full_bytes_per_token: int = 0
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    max_in_flight_tokens: int = 0  # concurrent batches x max_num_batched_tokens
    mla: bool = False
    mamba_kind: str | None = None
    mamba_layers: int = 0
    mamba_state_bytes: int = 0  # one Mamba layer, one sequence, this node (mamba_state_bytes())
    prefix_caching: bool = True
    speculative_tokens: int = 0

    @property
    def hybrid(self) -> bool:
        return bool(self.mamba_layers)

    def bytes_per_token(self, kind: str) -> int:
        """One layer of KIND (full, sliding), one token, this node."""
        return (
            self.full_bytes_per_token or self.attention_bytes_per_token
            if kind == "full"
            else self.attention_bytes_per_token
        )

    @property
    def align_mode(self) -> bool:
        """vLLM's Mamba cache mode "align": prefix caching on a hybrid model."""
        return self.hybrid and self.prefix_caching


def mamba_state_bytes(kind: str, dims: Mapping[str, Any], model_dtype: str, tp: int = 1, speculative: int = 0) -> int:
    """One Mamba-2 / Gated DeltaNet layer's state for one sequence on one of `tp` ranks, as vLLM shapes it
    (mamba_utils.py): the conv state in the model dtype, the SSM state in dims["ssm_dtype"] ("auto": the model's)."""
    conv_bytes = DTYPE_BYTES[model_dtype]
    ssm = dims.get("ssm_dtype") or "auto"
    ssm_bytes = conv_bytes if ssm == "auto" else DTYPE_BYTES[ssm]
    if kind == "mamba2":
        groups = dims["n_groups"]
        if groups % tp:  # extra_groups_for_head_shards: groups replicated so that every head keeps its group
            groups = tp
        conv_dim = dims["mamba_num_heads"] * dims["mamba_head_dim"] + 2 * groups * dims["ssm_state_size"]
        conv = conv_dim // tp * (dims["conv_kernel"] - 1 + speculative)
        ssm_elements = dims["mamba_num_heads"] // tp * dims["mamba_head_dim"] * dims["ssm_state_size"]
    else:
        conv_dim = (
            dims["linear_key_head_dim"] * dims["linear_num_key_heads"] * 2
            + dims["linear_value_head_dim"] * dims["linear_num_value_heads"]
        )
        conv = conv_dim // tp * (dims["linear_conv_kernel_dim"] - 1 + speculative)
        heads = dims["linear_num_value_heads"] // tp
        ssm_elements = heads * dims["linear_value_head_dim"] * dims["linear_key_head_dim"]
    return conv * conv_bytes + ssm_elements * ssm_bytes


def mamba_dims_problems(kind: object, dims: object, label: str) -> list[str]:
    """What is wrong with a recipe's mamba_kind / mamba_dims, one message each."""
    if kind not in MAMBA_DIMS:
        return [f"{label}.mamba_kind={kind!r}: expected one of {', '.join(MAMBA_DIMS)}"]
    if not isinstance(dims, Mapping):
        return [
            f"{label}.mamba_dims is missing: a {kind} layer's state is sized from {', '.join(MAMBA_DIMS[kind])} and "
            "ssm_dtype (config.json; library/hf_model_figures measures them)"
        ]
    problems = []
    for key in MAMBA_DIMS[kind]:
        value = dims.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            problems.append(f"{label}.mamba_dims.{key}={value!r}: expected a whole number > 0 (config.json {key})")
    extra = sorted(set(dims) - {*MAMBA_DIMS[kind], "ssm_dtype"})
    if extra:
        problems.append(f"{label}.mamba_dims: unknown key(s) {', '.join(extra)} for a {kind} layer")
    if (dims.get("ssm_dtype") or "auto") not in SSM_DTYPES:
        problems.append(
            f"{label}.mamba_dims.ssm_dtype={dims.get('ssm_dtype')!r}: expected one of {', '.join(SSM_DTYPES)} "
            "(config.json mamba_ssm_cache_dtype / mamba_ssm_dtype)"
        )
    return problems


@dataclass(frozen=True)
class CacheGroups:
    """vLLM's KV cache groups for some layers: block size, page, groups, and what one request takes."""

    layers: CacheLayers
    max_model_len: int
    block_size: int
    page_bytes: int
    slots_per_group: int
    groups: tuple[tuple[str, int], ...]  # (kind, groups of that kind)
    blocks_per_request: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Each kind's own block size where it differs from block_size (unified pages: unify_block_sizes()).
    kind_block_sizes: tuple[tuple[str, int], ...] = ()

    @property
    def bytes_per_block(self) -> int:
        return self.slots_per_group * self.page_bytes

    @property
    def bytes_per_sequence(self) -> int:
        """What one max_model_len sequence takes of the pool (vLLM's per-request memory)."""
        return self.blocks_per_request * self.bytes_per_block

    def num_blocks(self, budget: float) -> int:
        return max(0, int(budget // self.bytes_per_block))

    def admits_one_sequence(self, budget: float) -> bool:
        """vLLM's start check: the budget less the null block holds one max_model_len sequence."""
        return budget - self.bytes_per_block >= self.bytes_per_sequence

    def sequences_held(self, budget: float) -> int:
        """Full-length sequences that fit at once in the blocks vLLM can hand out (all but the null block)."""
        return max(0, (self.num_blocks(budget) - 1) // self.blocks_per_request)

    def max_concurrency(self, budget: float) -> float:
        """vLLM's logged 'Maximum concurrency for max_model_len tokens per request' (null block included)."""
        return self.num_blocks(budget) / self.blocks_per_request

    def kv_cache_size_tokens(self, budget: float) -> int:
        """vLLM's logged 'KV cache size: N tokens' = concurrency x max_model_len."""
        return int(self.max_concurrency(budget) * self.max_model_len)

    def longest_sequence(self, budget: float) -> int:
        """The longest single sequence the budget admits (vLLM's estimated maximum model length): the largest
        length whose blocks fit beside the null block, found the way vLLM searches for it."""
        low, high, best = 1, self.max_model_len, 0
        if not cache_groups(self.layers, low).admits_one_sequence(budget):
            return 0
        while low <= high:
            middle = (low + high) // 2
            if cache_groups(self.layers, middle, block_size=self.block_size).admits_one_sequence(budget):
                best, low = middle, middle + 1
            else:
                high = middle - 1
        return best


def hybrid_block_size(layers: CacheLayers) -> int:
    """The attention block size that makes one attention page hold a Mamba state (_align_hybrid_block_size)."""
    if not layers.hybrid:
        return BLOCK_SIZE
    alignment = max(KERNEL_ALIGNMENT, BLOCK_SIZE)
    if layers.mla:
        alignment = max(alignment, MLA_HYBRID_ALIGNMENT)
    if layers.align_mode:
        alignment = math.lcm(alignment, CHECKPOINT_ALIGNMENT[layers.mamba_kind])
    block = alignment * _cdiv(layers.mamba_state_bytes, alignment * layers.attention_bytes_per_token)
    block = KERNEL_ALIGNMENT * _cdiv(block, KERNEL_ALIGNMENT)
    return max(BLOCK_SIZE, block)


def _slots_per_group(counts: list[int]) -> int:
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * GROUP_SIZE_RATIO else smallest


def _blocks_of_kind(kind: str, layers: CacheLayers, max_model_len: int, block_size: int) -> int:
    if kind == "full":
        return _cdiv(max_model_len, block_size)
    if kind == "sliding":
        tokens = min(layers.sliding_window - 1 + layers.max_in_flight_tokens, max_model_len)
        return _cdiv(tokens, block_size) + 1
    if layers.align_mode:  # the running state, the one before, one per speculative token, the prefill checkpoint
        return 2 + layers.speculative_tokens + PREFILL_CHECKPOINT_PAGES
    return 1 + layers.speculative_tokens


def unify_block_sizes(layers: CacheLayers, block: int, kinds: list[str]) -> tuple[int, dict[str, int], list[str]]:
    """The common page of attention layers whose pages differ, and each kind's block size, as vLLM's
    unify_kv_cache_spec_page_size makes them: a page that divides the largest scales its block size, any other is
    padded to the largest page (its block size kept)."""
    pages = {kind: block * layers.bytes_per_token(kind) for kind in kinds}
    largest = max(pages.values())
    sizes, notes = {}, []
    for kind, page in pages.items():
        if page == largest:
            sizes[kind] = block
        elif largest % page == 0:
            sizes[kind] = block * (largest // page)
            notes.append(f"{kind} layers' {page:,} B page unified to {largest:,} B: block size {sizes[kind]}")
        else:
            sizes[kind] = block
            notes.append(f"{kind} layers' {page:,} B page padded to {largest:,} B")
    return largest, sizes, notes


def cache_groups(layers: CacheLayers, max_model_len: int, block_size: int | None = None) -> CacheGroups:
    """vLLM's groups for `layers` at `max_model_len` (the block size is the model's, whatever the length)."""
    block = hybrid_block_size(layers) if block_size is None else block_size
    page = block * layers.attention_bytes_per_token
    kinds = [
        (kind, count)
        for kind, count in (
            ("full", layers.full_attention_layers),
            ("sliding", layers.sliding_window_layers),
            ("mamba", layers.mamba_layers),
        )
        if count
    ]
    if not kinds:
        raise ValueError("no layer holds a KV cache")
    if not layers.attention_bytes_per_token:
        raise ValueError("an attention layer stores no bytes per token")
    notes = []
    sizes = {kind: block for kind, _ in kinds}
    attention = [kind for kind, _ in kinds if kind in ("full", "sliding")]
    if layers.full_bytes_per_token and not layers.hybrid and not layers.mla:
        page, sizes, notes = unify_block_sizes(layers, block, attention)
        if "full" in sizes and "sliding" not in sizes:  # one kind alone: its own page, no unifying
            page = block * layers.bytes_per_token("full")
    slots = kinds[0][1] if len(kinds) == 1 else _slots_per_group([count for _, count in kinds])
    groups = tuple((kind, _cdiv(count, slots)) for kind, count in kinds)
    blocks = sum(number * _blocks_of_kind(kind, layers, max_model_len, sizes[kind]) for kind, number in groups)
    padded = [f"{kind} {count} -> {_cdiv(count, slots) * slots}" for kind, count in kinds if count % slots]
    if padded:
        notes.append(f"layers padded to groups of {slots}: {', '.join(padded)}")
    if layers.hybrid and page != layers.mamba_state_bytes:
        notes.append(f"Mamba state {layers.mamba_state_bytes:,} B padded to the {page:,} B attention page")
    return CacheGroups(
        layers=layers,
        max_model_len=max_model_len,
        block_size=block,
        page_bytes=page,
        slots_per_group=slots,
        groups=groups,
        blocks_per_request=blocks,
        notes=tuple(notes),
        kind_block_sizes=tuple((kind, size) for kind, size in sizes.items() if size != block),
    )
