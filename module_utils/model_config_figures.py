"""A model's architecture figures from its config.json, and the KV-cache rules vLLM 0.33 sizes its cache by.

library/hf_model_figures.py reads config.json and the safetensors headers of a Hub commit and calls these functions;
module_utils/memory_plan.py can import the very same KV rules. Standard library only; no Ansible.

Where each rule comes from (vLLM 0.33.0; paths under vllm/):

- The text model: `config.get_text_config()`, i.e. `text_config` when there is one (transformers_utils/config.py
  `get_hf_text_config`); nearly every figure is read from it.
- KV bytes per token of one attention layer = num_kv_heads x (head_size + head_size_v) x dtype bytes
  (v1/kv_cache_interface.py `AttentionSpec.state_content_size_bytes`, `head_size_v` = head_size unless set):
  full and sliding-window attention store K and V, 2 x kv_heads x head_dim x bytes; multi-head latent attention
  (MLA, DeepSeek/Kimi/GLM-4.7-Flash) stores one latent vector: `MLAAttentionSpec.head_size_v = 0`,
  `num_kv_heads=1` (model_executor/layers/attention/mla_attention.py `get_kv_cache_spec`), head_size =
  kv_lora_rank + qk_rope_head_dim (same file, `self.head_size`), so (kv_lora_rank + qk_rope_head_dim) x bytes,
  no factor 2, replicated on every tensor-parallel rank (`max_tp_shards=1`); `fp8_ds_mla` / `nvfp4_ds_mla` are
  opaque 656 / 352-byte blobs per token.
- KV heads per rank: max(1, kv_heads // tensor_parallel_size); MLA always 1 (config/model.py `get_num_kv_heads`).
- A full-attention layer holds every token up to max_model_len, in whole blocks (`FullAttentionSpec.
  max_memory_usage_bytes`); a sliding-window layer holds min(window - 1 + in-flight tokens, max_model_len) tokens
  plus one block (`SlidingWindowSpec.max_admission_blocks_per_request`), in-flight tokens = concurrent batches
  (2 with async scheduling) x max_num_batched_tokens (config/vllm.py `max_in_flight_tokens`).
- Which layers slide: gpt-oss slides the even layers whatever layer_types says (model_executor/models/gpt_oss.py
  `sliding_window = config.sliding_window if self.layer_idx % 2 == 0 else None`); Llama-family models slide the
  layers layer_types calls `sliding_attention` (models/llama.py); a model without layer_types whose config has a
  sliding_window slides every layer (engine/arg_utils.py sets cache_config.sliding_window only when layer_types
  is None or all sliding).
- Gemma 4 (models/gemma4.py, the config from transformers' Gemma4TextConfig): layer_types names each layer's kind;
  a full-attention layer has its own head size, `global_head_dim` (default 512), and, when `attention_k_eq_v`,
  its own KV heads, `num_global_key_value_heads` (else num_key_value_heads): Gemma4DecoderLayer reads
  `config.per_layer_config[layer_idx]`. The last `num_kv_shared_layers` layers read an earlier layer's cache
  (`kv_sharing_target_layer_name`) and hold none of their own.
- Hybrid models keep a KV cache only in their attention layers: Nemotron-H's `hybrid_override_pattern` ('*' =
  attention, 'M' = Mamba-2, '-' = MLP, 'E' = MoE; models/nemotron_h.py `ALL_DECODER_LAYER_TYPES`), Qwen3.5's
  `layer_types` (`full_attention` / `linear_attention`). Their Mamba-2 / Gated DeltaNet layers keep a state per
  sequence instead (`MambaSpec`): model_executor/layers/mamba/mamba_utils.py `mamba2_state_shape`,
  `gated_delta_net_state_shape`; the SSM state is float32 for Nemotron-H unless its config says otherwise
  (models/config.py `NemotronHForCausalLMConfig`), the config's `mamba_ssm_dtype` or the model dtype for Qwen3.5
  (`Qwen3_5ForConditionalGenerationConfig`); the conv state has the model dtype.
- kv_cache_dtype "auto" = the model dtype, except that a ModelOpt checkpoint's kv_cache_quant_algo / kv_cache_scheme
  (config.json quantization_config, else hf_quant_config.json) turns it into fp8_e4m3 or nvfp4
  (utils/torch_utils.py `resolve_kv_cache_dtype_string`, `get_kv_cache_quant_algo_string`;
  transformers_utils/config.py reads hf_quant_config.json when config.json has no quantization_config).
- The model dtype: config `dtype`/`torch_dtype` (top level, then text_config), else the dtype every safetensors
  dtype casts to without loss (transformers_utils/model_arch_config_convertor.py `get_torch_dtype`); float32 is run
  as bfloat16 on CUDA (config/model.py `_resolve_auto_dtype`).
- max_context: the smallest of max_position_embeddings, n_positions, max_seq_len, seq_length, model_max_length,
  max_target_positions, max_sequence_length, max_seq_length, seq_len (model_max_length wins when set), times the
  RoPE factor unless the RoPE type already scales it (su, longrope, llama3, yarn, deepseek_yarn,
  deepseek_llama_scaling) (model_arch_config_convertor.py `derive_max_model_len_and_key`, config/model.py
  `_get_and_verify_max_len`).

- Parameters read per decoded token (active_params_b, active_weight_bytes): every weight of the main model, less
  - the input embedding, which a token reads one row of (layers/vocab_parallel_embedding.py
    `UnquantizedEmbeddingMethod.embedding` is `F.embedding`), unless the output head is tied to it: then the logits
    read the whole table (models/llama.py, qwen3_moe.py, qwen3_5.py `if config.tie_word_embeddings: self.lm_head =
    self.lm_head.tie_weights(self.model.embed_tokens)`; deepseek_v2.py, gpt_oss.py, nemotron_h.py never tie). A
    config that says tied while the checkpoint has its own `lm_head.weight` is untied at load (config/model.py
    `maybe_untie_word_embeddings`, transformers_utils/config.py `checkpoint_has_lm_head`) and re-tied afterwards only
    if the two tables are equal, which the headers cannot tell: counted untied. The output head (`ParallelLMHead`,
    vocab_size x hidden_size) is read whole by every token (layers/logits_processor.py `_get_logits`).
  - the routed experts a token does not use: (E - k) / E of them, k = num_experts_per_tok of E routed experts
    (fused_moe top-k); shared experts and routers run for every token, so they count whole.
- Multi-token-prediction (MTP) modules ship in the checkpoint but are not part of the main model: vLLM skips them
  at load and builds them only for `--speculative-config '{"method": "mtp"}'`. DeepSeek-V2/V3, Kimi-K2 and
  GLM-4.7-Flash skip the tensors of layers num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1
  (`model.layers.N.`, `layers.N.`, `model.language_model.layers.N.`; models/utils.py
  `get_spec_layer_idx_from_weight_name`, called in deepseek_v2.py `DeepseekV2Model.load_weights` and glm4_moe_lite.py
  `Glm4MoeLiteModel.load_weights`); Nemotron-H drops every tensor whose name starts with `mtp` and Qwen3.5 every one
  under `mtp.` (nemotron_h.py `NemotronHForCausalLM.hf_to_vllm_mapper` orig_to_new_prefix {"mtp": None},
  qwen3_5.py `Qwen3_5ForCausalLMBase` / `Qwen3_5ForConditionalGeneration.hf_to_vllm_mapper` {"mtp.": None}; a
  WeightsMapper target of None means "ignore", models/utils.py). The MTP depth is `num_nextn_predict_layers`
  (DeepSeek, GLM, Nemotron-H) or `mtp_num_hidden_layers` (Qwen3.5), what config/speculative.py
  `hf_config_override` takes as n_predict. These tensors are reported apart (mtp_*) and left out of every other
  figure.

A config this module does not understand fails with FiguresError naming the file and the key, instead of a guess:
an unknown model_type, a layer_types value it has no rule for, a missing figure whose default differs between
model classes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.kv_cache_pages import SSM_DTYPES, mamba_state_bytes

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"

# Bytes per element of the model dtypes vLLM runs with, and of the --kv-cache-dtype choices modelled here.
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
CONFIG_DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
}
KV_CACHE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
# MLA-only layouts with an opaque per-token size (mla_attention.py get_kv_cache_spec, state_content_bytes).
MLA_STATE_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
MODELOPT_KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}  # utils/torch_utils.py

MAX_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
ROPE_TYPES_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
LAYER_TYPE_NAMES = {"full_attention", "sliding_attention", "linear_attention", "indexed_attention", "mlp", "moe"}
# transformers' configuration_utils.py _LEGACY_LAYER_TYPE_REMAP
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}

EXPERT_COUNT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
EXPERTS_PER_TOKEN_KEYS = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "top_k_experts",
    "moe_topk",
    "moe_top_k",
    "top_k",
)

# The safetensors dtypes vLLM maps to torch dtypes when it takes the model dtype from the weights
# (safetensors/torch.py _TYPES), with what torch.finfo / torch.iinfo say of them (read with torch 2.x).
_PRECISION_LEVEL = {"BOOL": 0, "C64": 3}
_INT_RANGE = {
    "I64": (-(2**63), 2**63 - 1),
    "I32": (-(2**31), 2**31 - 1),
    "I16": (-(2**15), 2**15 - 1),
    "I8": (-128, 127),
    "U8": (0, 255),
    "U16": (0, 2**16 - 1),
    "U32": (0, 2**32 - 1),
    "U64": (0, 2**64 - 1),
}
_FLOAT_RANGE = {  # max (min = -max), resolution
    "F64": (1.7976931348623157e308, 1e-15),
    "F32": (3.4028234663852886e38, 1e-06),
    "BF16": (3.3895313892515355e38, 0.01),
    "F16": (65504.0, 0.001),
    "F8_E4M3": (448.0, 1.0),
    "F8_E4M3FNUZ": (240.0, 1.0),
    "F8_E5M2": (57344.0, 1.0),
    "F8_E5M2FNUZ": (57344.0, 1.0),
}
_SAFETENSORS_TO_MODEL_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float32"}


class FiguresError(ValueError):
    """A config this module does not understand; the message names the file and the key."""


# ---------------------------------------------------------------------------------------------------------------
# Reading keys, and remembering where each figure came from


@dataclass(frozen=True)
class Keys:
    """A config mapping and where it lives (`config.json`, `config.json:text_config.`), for reads and sources."""

    data: Mapping[str, Any]
    file: str = CONFIG
    prefix: str = ""

    def where(self, key: str) -> str:
        return f"{self.file}:{self.prefix}{key}"

    def value(self, key: str) -> Any:
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, why: str = "", minimum: int = 1) -> int:
        """A required whole number >= minimum; FiguresError names the key otherwise."""
        value = self.data.get(key)
        if value is None:
            raise FiguresError(f"{self.where(key)} is missing{why}")
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise FiguresError(f"{self.where(key)}={value!r}: must be a whole number >= {minimum}")
        return value

    def first(self, keys: Iterable[str]) -> tuple[str, Any] | tuple[None, None]:
        """The first of `keys` present with a value (vLLM's getattr_iter over its alias lists)."""
        for key in keys:
            if self.data.get(key) is not None:
                return key, self.data[key]
        return None, None


def read_config(raw: bytes, name: str = CONFIG) -> dict[str, Any]:
    """config.json (or hf_quant_config.json) as a dict; FiguresError when it is not a JSON object."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise FiguresError(f"{name} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise FiguresError(f"{name} is not a JSON object")
    return data


def text_keys(config: Mapping[str, Any]) -> Keys:
    """The text model's config: `text_config` when there is one (vLLM's hf_text_config), else the config."""
    nested = config.get("text_config")
    if nested is None:
        return Keys(config)
    if not isinstance(nested, dict):
        raise FiguresError(f"{CONFIG}:text_config must be an object, not {type(nested).__name__}")
    text = Keys(nested, prefix="text_config.")
    if not text.has("num_attention_heads"):  # vLLM refuses such a text_config (get_hf_text_config)
        raise FiguresError(f"{text.where('num_attention_heads')} is missing (vLLM requires it in a text_config)")
    return text


# ---------------------------------------------------------------------------------------------------------------
# The attention layout: which layers hold a KV cache, of what shape; which keep a per-sequence state


@dataclass(frozen=True)
class AttentionLayout:
    """What vLLM allocates cache for, per decoder layer kind (whole model, tensor parallel size 1)."""

    model_type: str
    kind: str  # "full" (K and V per KV head) or "mla" (one latent vector)
    layers: int  # decoder layers
    full_attention_layers: int
    sliding_window_layers: int
    sliding_window: int | None
    kv_heads: int  # KV heads per token and layer (MLA: 1)
    head_dim: int  # elements per head (MLA: kv_lora_rank + qk_rope_head_dim)
    # The full-attention layers' own heads where they differ (Gemma 4's global layers); None: kv_heads, head_dim.
    full_attention_kv_heads: int | None = None
    full_attention_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    mamba_kind: str | None = None  # "mamba2" (Nemotron-H) or "gated_delta_net" (Qwen3.5)
    mamba_layers: int = 0
    mamba_dims: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def attention_layers(self) -> int:
        """Layers with a KV cache (full and sliding-window attention)."""
        return self.full_attention_layers + self.sliding_window_layers


@dataclass(frozen=True)
class Family:
    """How vLLM builds one model_type's layers: its attention rule and the defaults its config class applies."""

    rule: str  # standard | qwen | gpt_oss | nemotron_h | mla | qwen3_5 | gemma4
    vllm_source: str
    kv_heads_default_to_heads: bool = False  # a missing num_key_value_heads means num_attention_heads
    head_dim_default_from_hidden: bool = False  # a missing head_dim means hidden_size // num_attention_heads

    @property
    def recurrent_layers(self) -> str | None:
        """The recurrent layers vLLM builds for a hybrid family (a recipe must declare them), else None."""
        return {"nemotron_h": "mamba2", "qwen3_5": "gated_delta_net"}.get(self.rule)


FAMILIES = {
    "llama": Family("standard", "model_executor/models/llama.py", True, True),
    "phi3": Family("standard", "model_executor/models/phi3.py (LlamaForCausalLM)", True, True),
    "qwen2": Family("qwen", "model_executor/models/qwen2.py", False, True),
    "qwen3": Family("qwen", "model_executor/models/qwen3.py"),
    "qwen3_moe": Family("qwen", "model_executor/models/qwen3_moe.py"),
    "gpt_oss": Family("gpt_oss", "model_executor/models/gpt_oss.py"),
    "nemotron_h": Family("nemotron_h", "model_executor/models/nemotron_h.py"),
    "deepseek_v2": Family("mla", "model_executor/models/deepseek_v2.py"),
    "deepseek_v3": Family("mla", "model_executor/models/deepseek_v2.py"),
    "kimi_k2": Family("mla", "model_executor/models/deepseek_v2.py"),
    "glm4_moe_lite": Family("mla", "model_executor/models/glm4_moe_lite.py"),
    "qwen3_5_text": Family("qwen3_5", "model_executor/models/qwen3_5.py"),
    "gemma4_text": Family("gemma4", "model_executor/models/gemma4.py"),
    "qwen3_5_moe_text": Family("qwen3_5", "model_executor/models/qwen3_5.py"),
}


def _layer_types(text: Keys, key: str = "layer_types") -> list[str] | None:
    value = text.value(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise FiguresError(f"{text.where(key)} must be a list of layer type names")
    return [LEGACY_LAYER_TYPES.get(item, item) for item in value]


def _unknown_layer_type(text: Keys, key: str, index: int, value: str, known: Iterable[str], model_type: str):
    return FiguresError(
        f"{text.where(key)}[{index}]={value!r}: no rule for this layer type in a {model_type!r} model (known here: "
        f"{', '.join(sorted(known))}); the KV cache it needs is not modelled"
    )


def _kv_heads_and_head_dim(text: Keys, family: Family, sources: dict[str, str]) -> tuple[int, int]:
    heads = text.integer("num_attention_heads")
    if text.has("num_key_value_heads"):
        kv_heads = text.integer("num_key_value_heads")
        sources["kv_heads"] = text.where("num_key_value_heads")
    elif family.kv_heads_default_to_heads:
        kv_heads = heads
        sources["kv_heads"] = f"{text.where('num_attention_heads')} (no num_key_value_heads: one KV head per head)"
    else:
        raise FiguresError(
            f"{text.where('num_key_value_heads')} is missing (its default differs between model classes; not guessed)"
        )
    if text.has("head_dim"):
        head_dim = text.integer("head_dim")
        sources["head_dim"] = text.where("head_dim")
    elif family.head_dim_default_from_hidden:
        hidden = text.integer("hidden_size")
        if hidden % heads:
            raise FiguresError(f"{text.where('hidden_size')}={hidden} is not a multiple of num_attention_heads={heads}")
        head_dim = hidden // heads
        sources["head_dim"] = f"{text.where('hidden_size')} / {text.where('num_attention_heads')} (no head_dim)"
    else:
        raise FiguresError(f"{text.where('head_dim')} is missing (its default differs between model classes)")
    return kv_heads, head_dim


def _sliding_window(text: Keys) -> int | None:
    if not text.has("sliding_window"):
        return None
    window = text.integer("sliding_window", minimum=0)
    return window or None  # vLLM treats 0 as no sliding window (config/model.py)


def _standard_layers(text: Keys, model_type: str, sources: dict[str, str]) -> tuple[int, int, int | None]:
    """(full, sliding, window) for a Llama-family model (models/llama.py, engine/arg_utils.py)."""
    layers = text.integer("num_hidden_layers")
    window = _sliding_window(text)
    types = _layer_types(text)
    if types is None:
        if window is None:
            sources["attention_layers"] = text.where("num_hidden_layers")
            return layers, 0, None
        sources["attention_layers"] = text.where("num_hidden_layers")
        sources["sliding_window"] = f"{text.where('sliding_window')} (no layer_types: every layer slides)"
        return 0, layers, window
    if len(types) != layers:
        raise FiguresError(f"{text.where('layer_types')} has {len(types)} entries for {layers} num_hidden_layers")
    known = {"full_attention", "sliding_attention"}
    for index, value in enumerate(types):
        if value not in known:
            raise _unknown_layer_type(text, "layer_types", index, value, known, model_type)
    sliding = types.count("sliding_attention")
    if sliding and window is None:
        raise FiguresError(f"{text.where('layer_types')} has sliding_attention layers but sliding_window is not set")
    sources["attention_layers"] = text.where("layer_types")
    if sliding:
        sources["sliding_window"] = text.where("sliding_window")
    return layers - sliding, sliding, window if sliding else None


def _qwen_layers(text: Keys, model_type: str, sources: dict[str, str]) -> tuple[int, int, int | None]:
    """Qwen2/Qwen3: transformers drops sliding_window unless use_sliding_window; vLLM then slides no layer."""
    if text.value("use_sliding_window"):
        raise FiguresError(
            f"{text.where('use_sliding_window')}=true: which layers slide then depends on max_window_layers in a way "
            "vLLM only partly supports; not modelled"
        )
    layers = text.integer("num_hidden_layers")
    types = _layer_types(text) or []
    for index, value in enumerate(types):
        if value != "full_attention":
            raise _unknown_layer_type(text, "layer_types", index, value, {"full_attention"}, model_type)
    sources["attention_layers"] = text.where("num_hidden_layers")
    return layers, 0, None


def _gpt_oss_layers(text: Keys, sources: dict[str, str], warnings: list[str]) -> tuple[int, int, int | None]:
    """gpt-oss: vLLM slides the even layers (layer_idx % 2 == 0) and ignores layer_types."""
    layers = text.integer("num_hidden_layers")
    window = _sliding_window(text)
    if window is None:
        raise FiguresError(f"{text.where('sliding_window')} is missing; gpt-oss slides its even layers over it")
    sliding = (layers + 1) // 2
    types = _layer_types(text)
    expected = ["sliding_attention" if index % 2 == 0 else "full_attention" for index in range(layers)]
    if types is not None and types != expected:
        warnings.append(
            f"{text.where('layer_types')} differs from vLLM's rule for gpt-oss (even layers slide); vLLM's rule is used"
        )
    rule = "vLLM gpt_oss.py: layer_idx % 2 == 0 slides"
    sources["attention_layers"] = text.where("num_hidden_layers")
    sources["sliding_window_layers"] = f"{text.where('num_hidden_layers')} ({rule})"
    sources["sliding_window"] = text.where("sliding_window")
    return layers - sliding, sliding, window


def _nemotron_h_pattern(text: Keys) -> tuple[list[str], str]:
    """The layer kinds of a Nemotron-H model: layer_types (transformers 5 names) or hybrid_override_pattern."""
    for key in ("layer_types", "layers_block_type"):
        types = _layer_types(text, key)
        if types is not None:
            return types, key
    pattern = text.value("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise FiguresError(f"{text.where('hybrid_override_pattern')} is missing: the layer kinds are unknown")
    for index, char in enumerate(pattern):
        if char not in NEMOTRON_H_PATTERN:
            raise FiguresError(
                f"{text.where('hybrid_override_pattern')}[{index}]={char!r}: no rule for this layer kind "
                f"(known: {', '.join(NEMOTRON_H_PATTERN)})"
            )
    return [NEMOTRON_H_PATTERN[char] for char in pattern], "hybrid_override_pattern"


def _mamba2_dims(text: Keys, sources: dict[str, str]) -> dict[str, Any]:
    dims = {
        key: text.integer(key)
        for key in ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")
    }
    ssm = text.value("mamba_ssm_cache_dtype")
    dims["ssm_dtype"] = "float32" if ssm is None else ssm
    ssm_source = text.where("mamba_ssm_cache_dtype") if ssm is not None else "float32 (vLLM's NemotronH default)"
    sources["mamba_dims"] = (
        f"{text.where('mamba_num_heads')}, mamba_head_dim, n_groups, ssm_state_size, conv_kernel; SSM state "
        f"dtype {ssm_source}; conv state in the model dtype (vLLM mamba_utils.py mamba2_state_shape)"
    )
    return dims


def _gdn_dims(text: Keys, sources: dict[str, str]) -> dict[str, Any]:
    keys = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    dims: dict[str, Any] = {key: text.integer(key) for key in keys}
    dims["ssm_dtype"] = text.value("mamba_ssm_dtype")  # None: the model dtype
    ssm_source = text.where("mamba_ssm_dtype") if dims["ssm_dtype"] is not None else "the model dtype"
    sources["mamba_dims"] = (
        f"{text.where('linear_num_key_heads')}, linear_num_value_heads, linear_key_head_dim, "
        f"linear_value_head_dim, linear_conv_kernel_dim; recurrent state dtype {ssm_source} (vLLM mamba_utils.py "
        "gated_delta_net_state_shape)"
    )
    return dims


def _hybrid_counts(types: list[str], text: Keys, key: str, model_type: str, known: set[str]) -> dict[str, int]:
    for index, value in enumerate(types):
        if value not in known:
            raise _unknown_layer_type(text, key, index, value, known, model_type)
    return {kind: types.count(kind) for kind in known}


def attention_layout(config: Mapping[str, Any]) -> AttentionLayout:
    """The attention layout of a config.json (see the module docstring); FiguresError for what it cannot model."""
    text = text_keys(config)
    model_type = text.value("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise FiguresError(f"{text.where('model_type')} is missing: the model's layers are unknown")
    family = FAMILIES.get(model_type)
    if family is None:
        raise FiguresError(
            f"{text.where('model_type')}={model_type!r}: no rule for this model type's attention (known: "
            f"{', '.join(sorted(FAMILIES))}); add one to module_utils/model_config_figures.py from vLLM's model file"
        )
    sources: dict[str, str] = {"attention_kind": f"{text.where('model_type')} (vLLM {family.vllm_source})"}
    warnings: list[str] = []
    common = {"model_type": model_type}
    if family.rule == "mla":
        return _mla_layout(text, model_type, sources)
    kv_heads, head_dim = _kv_heads_and_head_dim(text, family, sources)
    common.update(kind="full", kv_heads=kv_heads, head_dim=head_dim)
    if family.rule == "gemma4":
        return _gemma4_layout(text, model_type, common, sources)
    if family.rule in ("standard", "qwen", "gpt_oss"):
        if family.rule == "standard":
            full, sliding, window = _standard_layers(text, model_type, sources)
        elif family.rule == "qwen":
            full, sliding, window = _qwen_layers(text, model_type, sources)
        else:
            full, sliding, window = _gpt_oss_layers(text, sources, warnings)
        layers = full + sliding
        return AttentionLayout(
            **common,
            layers=layers,
            full_attention_layers=full,
            sliding_window_layers=sliding,
            sliding_window=window,
            sources=sources,
            warnings=tuple(warnings),
        )
    if family.rule == "nemotron_h":
        types, key = _nemotron_h_pattern(text)
        counts = _hybrid_counts(types, text, key, model_type, {"full_attention", "linear_attention", "mlp", "moe"})
        mamba_kind, dims = "mamba2", _mamba2_dims(text, sources)
        attention = counts["full_attention"]
        window = _sliding_window(text)  # nemotron_h.py passes config.sliding_window to every attention layer
    else:  # qwen3_5
        types = _layer_types(text)
        key = "layer_types"
        if types is None:
            raise FiguresError(f"{text.where('layer_types')} is missing: which layers are attention is unknown")
        layers = text.integer("num_hidden_layers")
        if len(types) != layers:
            raise FiguresError(f"{text.where('layer_types')} has {len(types)} entries for {layers} num_hidden_layers")
        counts = _hybrid_counts(types, text, key, model_type, {"full_attention", "linear_attention"})
        mamba_kind, dims = "gated_delta_net", _gdn_dims(text, sources)
        attention = counts["full_attention"]
        window = None
    attention_mark, mamba_mark = (
        ("'*'", "'M'") if key == "hybrid_override_pattern" else ("full_attention", "linear_attention")
    )
    sources["attention_layers"] = f"{text.where(key)} (count of {attention_mark})"
    sources["mamba_layers"] = f"{text.where(key)} (count of {mamba_mark})"
    sources["mamba_kind"] = f"{text.where('model_type')} (vLLM {family.vllm_source}: {mamba_kind} layers)"
    if window is not None:
        sources["sliding_window"] = text.where("sliding_window")
    return AttentionLayout(
        **common,
        layers=len(types),
        full_attention_layers=0 if window else attention,
        sliding_window_layers=attention if window else 0,
        sliding_window=window,
        mamba_kind=mamba_kind,
        mamba_layers=counts["linear_attention"],
        mamba_dims=dims,
        sources=sources,
    )


def _gemma4_layout(text: Keys, model_type: str, common: dict, sources: dict[str, str]) -> AttentionLayout:
    """Gemma 4: sliding and full layers of different heads, the last num_kv_shared_layers without a cache of their
    own (models/gemma4.py; transformers' Gemma4TextConfig builds per_layer_config from the keys read here)."""
    layers = text.integer("num_hidden_layers")
    if text.has("per_layer_config"):  # Gemma4TextConfig then ignores global_head_dim and num_global_key_value_heads
        raise FiguresError(
            f"{text.where('per_layer_config')} is set: each layer's heads are read from it, which is not modelled; "
            "state the recipe's full_attention_kv_heads and full_attention_head_dim by hand"
        )
    types = _layer_types(text)
    if types is None:
        raise FiguresError(f"{text.where('layer_types')} is missing: which Gemma 4 layers slide is unknown")
    if len(types) != layers:
        raise FiguresError(f"{text.where('layer_types')} has {len(types)} entries for {layers} num_hidden_layers")
    if types and types[-1] != "full_attention":  # Gemma4TextConfig forces the last layer to full attention
        types = [*types[:-1], "full_attention"]
    shared = text.integer("num_kv_shared_layers", minimum=0) if text.has("num_kv_shared_layers") else 0
    if shared >= layers:
        raise FiguresError(f"{text.where('num_kv_shared_layers')}={shared}: leaves no layer with a cache")
    own = types[: layers - shared]
    counts = _hybrid_counts(own, text, "layer_types", model_type, {"full_attention", "sliding_attention"})
    full_head_dim = text.integer("global_head_dim") if text.has("global_head_dim") else 512
    full_kv_heads = common["kv_heads"]
    if text.value("attention_k_eq_v") and text.has("num_global_key_value_heads"):
        full_kv_heads = text.integer("num_global_key_value_heads")
        sources["full_attention_kv_heads"] = f"{text.where('num_global_key_value_heads')} (attention_k_eq_v)"
    else:
        sources["full_attention_kv_heads"] = f"{sources['kv_heads']} (no attention_k_eq_v global heads)"
    sources["full_attention_head_dim"] = (
        text.where("global_head_dim") if text.has("global_head_dim") else "Gemma4TextConfig's global_head_dim default"
    )
    window = _sliding_window(text) if counts["sliding_attention"] else None
    if counts["sliding_attention"] and window is None:
        raise FiguresError(f"{text.where('sliding_window')} is missing for the sliding_attention layers")
    if window and text.value("use_bidirectional_attention") == "all":  # Gemma4TextConfig.__post_init__ halves it
        window = window // 2 + 1
    shared_note = f", less the last {shared} num_kv_shared_layers" if shared else ""
    sources["full_attention_layers"] = f"{text.where('layer_types')} (count of full_attention{shared_note})"
    sources["sliding_window_layers"] = f"{text.where('layer_types')} (count of sliding_attention{shared_note})"
    if window:
        sources["sliding_window"] = text.where("sliding_window")
    return AttentionLayout(
        **common,
        layers=layers,
        full_attention_layers=counts["full_attention"],
        sliding_window_layers=counts["sliding_attention"],
        sliding_window=window,
        full_attention_kv_heads=full_kv_heads,
        full_attention_head_dim=full_head_dim,
        sources=sources,
    )


def _mla_layout(text: Keys, model_type: str, sources: dict[str, str]) -> AttentionLayout:
    """DeepSeek-style multi-head latent attention: one latent vector of kv_lora_rank + qk_rope_head_dim per token
    and layer (vLLM is_deepseek_mla: the model type and a kv_lora_rank)."""
    if not text.has("kv_lora_rank"):
        raise FiguresError(
            f"{text.where('kv_lora_rank')} is missing or null: a {model_type!r} model without latent attention is not "
            "modelled"
        )
    rank = text.integer("kv_lora_rank")
    rope = text.integer("qk_rope_head_dim")
    layers = text.integer("num_hidden_layers")
    sources.update(
        attention_layers=text.where("num_hidden_layers"),
        kv_heads="vLLM MLA: one latent vector per token and layer (mla_attention.py num_kv_heads=1)",
        head_dim=f"{text.where('kv_lora_rank')} + {text.where('qk_rope_head_dim')}",
        kv_lora_rank=text.where("kv_lora_rank"),
        qk_rope_head_dim=text.where("qk_rope_head_dim"),
    )
    return AttentionLayout(
        model_type=model_type,
        kind="mla",
        layers=layers,
        full_attention_layers=layers,
        sliding_window_layers=0,
        sliding_window=None,
        kv_heads=1,
        head_dim=rank + rope,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        sources=sources,
    )


# ---------------------------------------------------------------------------------------------------------------
# The KV rules (what the planner imports)


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per element of a resolved --kv-cache-dtype (not "auto"); FiguresError for layouts not modelled."""
    if kv_cache_dtype in KV_CACHE_DTYPE_BYTES:
        return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    if kv_cache_dtype in MODEL_DTYPE_BYTES:
        return MODEL_DTYPE_BYTES[kv_cache_dtype]
    raise FiguresError(
        f"kv_cache_dtype {kv_cache_dtype!r} is not modelled (its page layout depends on the attention backend); "
        f"modelled: auto, {', '.join([*KV_CACHE_DTYPE_BYTES, *MLA_STATE_BYTES])}"
    )


def kv_bytes_per_token_per_layer(kind: str, kv_heads: int, head_dim: int, kv_cache_dtype: str, tp: int = 1) -> int:
    """Bytes one attention layer stores per token on one tensor-parallel rank (see the module docstring)."""
    if kind == "mla":
        if kv_cache_dtype in MLA_STATE_BYTES:
            return MLA_STATE_BYTES[kv_cache_dtype]
        return head_dim * kv_dtype_bytes(kv_cache_dtype)  # one latent vector, no separate V, on every rank
    if kv_cache_dtype in MLA_STATE_BYTES:
        raise FiguresError(f"kv_cache_dtype {kv_cache_dtype!r} is for multi-head latent attention models only")
    heads = max(1, kv_heads // tp)
    return heads * 2 * head_dim * kv_dtype_bytes(kv_cache_dtype)


def full_attention_bytes_per_token_per_layer(layout: AttentionLayout, kv_cache_dtype: str, tp: int = 1) -> int:
    """Bytes one full-attention layer stores per token on one rank, with its own heads where they differ."""
    kv_heads = layout.full_attention_kv_heads or layout.kv_heads
    head_dim = layout.full_attention_head_dim or layout.head_dim
    return kv_bytes_per_token_per_layer(layout.kind, kv_heads, head_dim, kv_cache_dtype, tp)


def kv_bytes_per_token(layout: AttentionLayout, kv_cache_dtype: str, tp: int = 1) -> int:
    """Bytes per token over the full-attention layers: what grows with every token of a sequence."""
    return layout.full_attention_layers * full_attention_bytes_per_token_per_layer(layout, kv_cache_dtype, tp)


def sliding_window_kv_bytes_per_token(layout: AttentionLayout, kv_cache_dtype: str, tp: int = 1) -> int:
    """Bytes per token over the sliding-window layers; they hold only the last tokens of a sequence (how many:
    module_utils/kv_cache_pages.py)."""
    per_layer = kv_bytes_per_token_per_layer(layout.kind, layout.kv_heads, layout.head_dim, kv_cache_dtype, tp)
    return layout.sliding_window_layers * per_layer


def recipe_mamba_dims(layout: AttentionLayout) -> dict[str, Any] | None:
    """The recipe's mamba_dims: config.json's figures of the Mamba-2 / Gated DeltaNet layers and the SSM state's
    dtype by name ("auto": the model's), the way module_utils/kv_cache_pages.py reads them; None without such
    layers."""
    if not layout.mamba_kind:
        return None
    dims = dict(layout.mamba_dims)
    ssm_dtype = dims.get("ssm_dtype") or "auto"
    name = ssm_dtype if ssm_dtype == "auto" else CONFIG_DTYPE_NAMES.get(ssm_dtype, ssm_dtype)
    if name not in SSM_DTYPES:
        raise FiguresError(f"mamba SSM cache dtype {ssm_dtype!r} is not one of {', '.join(SSM_DTYPES)}")
    dims["ssm_dtype"] = name
    return dims


def mamba_state_bytes_per_layer(layout: AttentionLayout, model_dtype: str) -> int:
    """One Mamba-2 / Gated DeltaNet layer's state for one sequence (conv + SSM state), tensor parallel size 1, no
    speculative tokens, before vLLM pads it to the attention page size (kv_cache_pages.mamba_state_bytes)."""
    dims = recipe_mamba_dims(layout)
    return 0 if dims is None else mamba_state_bytes(layout.mamba_kind, dims, model_dtype)


# ---------------------------------------------------------------------------------------------------------------
# Dtypes, quantisation, context, experts


def _lossless(source: str, target: str) -> bool:
    """torch's is_lossless_cast (vLLM utils/torch_utils.py) over safetensors dtype names."""
    if source == target:
        return True
    levels = [_PRECISION_LEVEL.get(d, 2 if d in _FLOAT_RANGE else 1) for d in (source, target)]
    if levels[0] != levels[1]:
        return levels[0] < levels[1]
    if source in _INT_RANGE and target in _INT_RANGE:
        (smin, smax), (tmin, tmax) = _INT_RANGE[source], _INT_RANGE[target]
        return smin >= tmin and smax <= tmax
    if source in _FLOAT_RANGE and target in _FLOAT_RANGE:
        (smax, sres), (tmax, tres) = _FLOAT_RANGE[source], _FLOAT_RANGE[target]
        return smax <= tmax and sres >= tres
    return False


def dtype_from_weights(header_dtypes: Iterable[str]) -> str:
    """The dtype every weight dtype casts to without loss (vLLM common_broadcastable_dtype), as a model dtype."""
    known = sorted(d for d in set(header_dtypes) if d in _INT_RANGE or d in _FLOAT_RANGE or d in _PRECISION_LEVEL)
    if not known:
        raise FiguresError(f"{CONFIG} names no dtype and the safetensors headers hold no dtype vLLM maps")
    scores = {d: sum(_lossless(other, d) for other in known) for d in known}
    best = max(scores.values())
    winners = [d for d, score in scores.items() if score == best]
    if len(winners) > 1 or winners[0] not in _SAFETENSORS_TO_MODEL_DTYPE:
        raise FiguresError(
            f"{CONFIG} names no dtype (dtype/torch_dtype) and the weights' dtypes {', '.join(known)} do not decide "
            "one model dtype"
        )
    return _SAFETENSORS_TO_MODEL_DTYPE[winners[0]]


def model_dtype(config: Mapping[str, Any], header_dtypes: Iterable[str]) -> tuple[str, str]:
    """(the dtype vLLM runs the model in with --dtype auto on a GB10, where it came from)."""
    candidates = [Keys(config)]
    if isinstance(config.get("text_config"), dict):
        candidates.append(Keys(config["text_config"], prefix="text_config."))
    for keys in candidates:
        key, value = keys.first(("dtype", "torch_dtype"))
        if key is None:
            continue
        name = CONFIG_DTYPE_NAMES.get(value) if isinstance(value, str) else None
        if name is None:
            raise FiguresError(f"{keys.where(key)}={value!r}: not one of {', '.join(CONFIG_DTYPE_NAMES)}")
        source = keys.where(key)
        break
    else:
        dtypes = sorted(set(header_dtypes))
        name = dtype_from_weights(dtypes)
        source = f"safetensors header dtypes {', '.join(dtypes)} (no dtype in {CONFIG})"
    if name == "float32":
        return "bfloat16", f"{source}: float32, run as bfloat16 (vLLM _resolve_auto_dtype on CUDA)"
    return name, source


def quantization_config(
    config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """(the checkpoint's quantisation config, the file:key it came from), as vLLM finds it: config.json's
    quantization_config (or compression_config), else hf_quant_config.json (ModelOpt <= 0.29)."""
    for key in ("quantization_config", "compression_config"):
        if isinstance(config.get(key), dict):
            return dict(config[key]), f"{CONFIG}:{key}"
    if hf_quant_config is not None:
        return dict(hf_quant_config), HF_QUANT_CONFIG
    return None, None


def quant_method(quant: Mapping[str, Any] | None) -> str:
    """quant_method as vLLM normalises it (model_arch_config_convertor.py _normalize_quantization_config):
    ModelOpt configs (producer modelopt) become modelopt / modelopt_fp4 / modelopt_mixed from quant_algo."""
    if quant is None:
        return ""
    method = str(quant.get("quant_method") or "").lower()
    inner = quant.get("quantization")
    producer = quant.get("producer") if isinstance(quant.get("producer"), dict) else {}
    legacy = isinstance(inner, dict) and "modelopt_quant_config" in inner
    if producer.get("name") == "modelopt" or legacy:
        algo = str((inner if isinstance(inner, dict) else {}).get("quant_algo") or "").upper()
        method = {
            "FP8": "modelopt",
            "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
            "FP8_PB_WO": "modelopt",
            "NVFP4": "modelopt_fp4",
            "MIXED_PRECISION": "modelopt_mixed",
        }.get(algo, method)
    return method.replace("compressed_tensors", "compressed-tensors")


def weight_scheme(quant: Mapping[str, Any] | None, source: str | None) -> str:
    """Which tensor layout rule counts this checkpoint's parameters (safetensors_header.SCHEMES)."""
    method = quant_method(quant)
    if quant is None:
        return "none"
    if method == "mxfp4":
        return "mxfp4"
    if method.startswith("modelopt"):
        return "modelopt"
    if method == "fp8":
        return "fp8"
    raise FiguresError(
        f"{source}: quant_method {method or '(none)'!r} is a weight layout this module does not count (known: "
        "mxfp4, modelopt FP8/NVFP4, fp8); its parameter count would be a guess"
    )


def kv_cache_dtype_auto(quant: Mapping[str, Any] | None, source: str | None, dtype: str) -> tuple[str, str]:
    """(what --kv-cache-dtype auto means for this checkpoint, why): ModelOpt's kv_cache_quant_algo /
    kv_cache_scheme when set (fp8 -> fp8_e4m3, nvfp4), else the model dtype (get_kv_cache_quant_algo_string)."""
    if quant is not None and quant_method(quant).startswith("modelopt"):
        inner = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else quant
        for key, holder in (
            ("kv_cache_scheme", inner),
            ("kv_cache_scheme", quant),
            ("kv_cache_quant_algo", inner),
            ("kv_cache_quant_algo", quant),
        ):
            algo = holder.get(key)
            if not algo:
                continue
            separator = "." if ":" in str(source) else ":"
            where = f"{source}{separator}{'quantization.' if holder is not quant else ''}{key}"
            shown = algo
            if isinstance(algo, dict):
                if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
                    algo = "fp8"
                elif algo.get("num_bits") == 4 and algo.get("type") == "float":
                    algo = "nvfp4"
            if isinstance(algo, str) and algo.lower() in MODELOPT_KV_CACHE_DTYPES:
                return MODELOPT_KV_CACHE_DTYPES[algo.lower()], f"{where}={shown!r} (vLLM resolve_kv_cache_dtype_string)"
            return dtype, f"{where}={shown!r} is not a kv algo vLLM knows: auto stays the model dtype"
    return dtype, "the model dtype (vLLM kv_cache_dtype_str_to_dtype)"


def _rope_parameters(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The top-level config's RoPE parameters, one dict per layer type when nested (vLLM iter_rope_parameters;
    legacy `rope_scaling` and `type` as transformers and vLLM rename them)."""
    rope = config.get("rope_parameters", config.get("rope_scaling"))
    if not isinstance(rope, dict) or not rope:
        return []
    nested = set(rope) <= (LAYER_TYPE_NAMES | {"main", "compress"})
    items = [p for p in rope.values() if isinstance(p, dict) and p] if nested else [rope]
    return [{**item, "rope_type": item.get("rope_type", item.get("type", "default"))} for item in items]


def max_context(config: Mapping[str, Any]) -> tuple[int, str]:
    """(the longest max_model_len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN, where it came from)."""
    text = text_keys(config)
    found = [(text.value(key), key) for key in MAX_LENGTH_KEYS if text.has(key)]
    for value, key in found:
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise FiguresError(f"{text.where(key)}={value!r}: must be a positive number")
    if not found:
        raise FiguresError(
            f"{text.where('max_position_embeddings')} is missing (and no other context key): vLLM would assume 2048"
        )
    value, key = min(found)
    if text.has("model_max_length"):
        value, key = text.value("model_max_length"), "model_max_length"
    source = text.where(key)
    model_type = str(config.get("model_type") or "")
    factor = 1.0
    if "gemma3" not in model_type:
        for params in _rope_parameters(config):
            if params["rope_type"] not in ROPE_TYPES_ALREADY_SCALED:
                factor = params.get("factor", factor)
    if factor is None:
        factor = 1.0
    if factor != 1.0:
        source += f" x RoPE factor {factor:g} ({CONFIG}:rope_scaling)"
    return int(value * factor), source


def experts(config: Mapping[str, Any]) -> tuple[int | None, int | None, dict[str, str]]:
    """(routed experts, experts per token, sources) from the text config's alias keys (vLLM CONFIG_FIELD_ALIASES)."""
    text = text_keys(config)
    count_key, count = text.first(EXPERT_COUNT_KEYS)
    top_key, top = text.first(EXPERTS_PER_TOKEN_KEYS)
    sources = {}
    if count_key:
        sources["experts"] = text.where(count_key)
    if top_key:
        sources["experts_per_token"] = text.where(top_key)
    for key, value in ((count_key, count), (top_key, top)):
        if key and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise FiguresError(f"{text.where(key)}={value!r}: must be a whole number")
    return count, top, sources


def active_parameters(
    total: int, routed_expert: int, config: Mapping[str, Any], input_embedding: int = 0, tied: bool = False
) -> tuple[int, str]:
    """(parameters read per decoded token, how): all of them, less the share of the routed experts a token does
    not use, (E - k) / E of the routed expert parameters, and less the input embedding unless the output head is
    tied to it (see the module docstring)."""
    count, top, keys = experts(config)
    embedding = 0 if tied else input_embedding
    if tied:
        head = "; the input embedding is the output head (tied), so it counts whole"
    elif input_embedding:
        head = f" - the input embedding {input_embedding} (a token reads one row of it)"
    else:
        head = ""
    if routed_expert == 0:
        if count:
            raise FiguresError(
                f"{keys['experts']}={count} but no safetensors tensor is under an 'experts' module: the expert "
                "weights are named in a way this module does not know"
            )
        return total - embedding, f"dense: every parameter is read per token{head}"
    if not count or not top:
        missing = "the number of experts" if not count else "experts per token"
        raise FiguresError(f"{CONFIG}: the weights hold routed experts but {missing} is not set ({', '.join(keys)})")
    if top > count:
        raise FiguresError(f"{keys['experts_per_token']}={top}: more than {keys['experts']}={count}")
    active = total - routed_expert * (count - top) // count - embedding
    how = (
        f"total - routed-expert parameters x ({keys['experts']} - {keys['experts_per_token']}) / "
        f"{keys['experts']} = {total} - {routed_expert} x ({count} - {top}) / {count}{head}"
    )
    return active, how


# ---------------------------------------------------------------------------------------------------------------
# What a tensor is: the input embedding, a multi-token-prediction (MTP) module's, or neither

# The values safetensors_header.count_parameters takes from a role function (its INPUT_EMBEDDING, MTP).
ROLE_INPUT_EMBEDDING = "input_embedding"
ROLE_MTP = "mtp"
# The input embedding's name in the checkpoints of FAMILIES: `model.embed_tokens.weight` (Llama, Qwen, gpt-oss,
# DeepSeek), `model.language_model.embed_tokens.weight` (Qwen3.5 VL), `backbone.embeddings.weight` (Nemotron-H,
# renamed by nemotron_h.py's hf_to_vllm_mapper {"embeddings": "embed_tokens"}).
INPUT_EMBEDDING_NAME = re.compile(r"(^|\.)(embed_tokens|embeddings)\.weight$")
# How each attention rule's vLLM model leaves its MTP tensors out (see the module docstring).
MTP_RULES = {
    "mla": ("layers_after", "num_nextn_predict_layers"),
    "nemotron_h": ("prefix:mtp", "num_nextn_predict_layers"),
    "qwen3_5": ("prefix:mtp.", "mtp_num_hidden_layers"),
}
MTP_RULE_SOURCES = {
    "layers_after": "vLLM models/utils.py get_spec_layer_idx_from_weight_name, skipped by the model's load_weights",
    "prefix:mtp": "vLLM nemotron_h.py hf_to_vllm_mapper orig_to_new_prefix {'mtp': None}",
    "prefix:mtp.": "vLLM qwen3_5.py hf_to_vllm_mapper orig_to_new_prefix {'mtp.': None}",
}


@dataclass(frozen=True)
class TensorRoles:
    """Which checkpoint tensors are the input embedding and which an MTP module's, for one config."""

    model_type: str
    mtp_rule: str | None  # "layers_after", "prefix:<p>", or None (the model has no MTP rule)
    mtp_layers: int  # the config's MTP depth (0 when it names none)
    mtp_source: str
    mtp_key: str = ""  # where the depth is read (config.json:num_nextn_predict_layers, ...)
    first_mtp_layer: int = 0  # layers_after: num_hidden_layers
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None  # as the config says; None when it does not say
    tie_source: str = ""

    def is_mtp(self, name: str) -> bool:
        """Whether vLLM's main model leaves this tensor out as part of an MTP module."""
        if self.mtp_rule is None:
            return False
        if self.mtp_rule.startswith("prefix:"):
            return name.startswith(self.mtp_rule[len("prefix:") :])
        for index in range(self.first_mtp_layer, self.first_mtp_layer + self.mtp_layers):
            if name.startswith((f"model.layers.{index}.", f"layers.{index}.", f"model.language_model.layers.{index}.")):
                return True
        return False

    def role(self, tensor: Any) -> str | None:
        """ROLE_MTP, ROLE_INPUT_EMBEDDING or None for a safetensors_header.Tensor (name, shape)."""
        if self.is_mtp(tensor.name):
            return ROLE_MTP
        named = INPUT_EMBEDDING_NAME.search(tensor.name) is not None and len(tensor.shape) == 2
        if named and (self.vocab_size is None or tensor.shape[0] == self.vocab_size):
            return ROLE_INPUT_EMBEDDING
        return None


def tensor_roles(config: Mapping[str, Any]) -> TensorRoles:
    """The TensorRoles of a config.json (call attention_layout first: it refuses what this cannot know)."""
    text = text_keys(config)
    model_type = str(text.value("model_type") or "")
    family = FAMILIES.get(model_type)
    rule, key = MTP_RULES.get(family.rule, (None, "")) if family else (None, "")
    depth = 0
    source = f"none: vLLM's {model_type!r} model has no multi-token-prediction module to leave out"
    if rule is not None:
        if text.has(key):
            depth = text.integer(key, minimum=0)
        source = (
            f"{text.where(key)} ({MTP_RULE_SOURCES[rule]})" if text.has(key) else f"no {key} ({MTP_RULE_SOURCES[rule]})"
        )
    first = text.integer("num_hidden_layers") if rule == "layers_after" and depth else 0
    vocab = text.value("vocab_size")
    tie, tie_source = None, f"{CONFIG} names no tie_word_embeddings"
    for keys in (text, Keys(config)):
        if keys.has("tie_word_embeddings"):
            tie, tie_source = keys.value("tie_word_embeddings"), keys.where("tie_word_embeddings")
            if not isinstance(tie, bool):
                raise FiguresError(f"{tie_source}={tie!r}: must be true or false")
            break
    return TensorRoles(
        model_type=model_type,
        mtp_rule=rule,
        mtp_layers=depth,
        mtp_source=source,
        mtp_key=text.where(key) if rule is not None else "",
        first_mtp_layer=first,
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None,
        tie_word_embeddings=tie,
        tie_source=tie_source,
    )


def embeddings_tied(roles: TensorRoles, lm_head_tensors: Iterable[str]) -> tuple[bool, str]:
    """(whether the output head is the input embedding, why), as vLLM decides it: the config's
    tie_word_embeddings, unless the checkpoint has an `lm_head.weight` of its own, which vLLM then loads
    (config/model.py maybe_untie_word_embeddings). A config that does not say is read from the checkpoint: without
    an output head of its own the model can only run tied."""
    heads = sorted(lm_head_tensors)
    if roles.tie_word_embeddings is False:
        return False, f"untied: {roles.tie_source}=false"
    if heads:
        if roles.tie_word_embeddings:
            return False, (
                f"untied: {roles.tie_source}=true but the checkpoint has its own {heads[0]}, which vLLM loads "
                "(config/model.py maybe_untie_word_embeddings)"
            )
        return False, f"untied: {roles.tie_source}, and the checkpoint has its own {heads[0]}"
    if roles.tie_word_embeddings:
        return True, f"tied: {roles.tie_source}=true, and the checkpoint has no lm_head.weight"
    return True, f"tied: {roles.tie_source}, and the checkpoint has no lm_head.weight of its own"


# ---------------------------------------------------------------------------------------------------------------
# Everything together: the recipe's architecture block


@dataclass(frozen=True)
class Figures:
    """The recipe's `architecture` block, where each figure came from, and what needs a person's eye."""

    architecture: dict[str, Any]
    sources: dict[str, str]
    warnings: tuple[str, ...]
    active_parameters: int
    tied_embeddings: bool = False  # the output head is the input embedding (embeddings_tied)


def architecture_figures(
    config: Mapping[str, Any],
    layout: AttentionLayout,
    quant: tuple[Mapping[str, Any] | None, str | None],
    parameters: Mapping[str, int],
    header_dtypes: Iterable[str],
    weights: Mapping[str, Any],
    kv_cache_dtype: str = "auto",
) -> Figures:
    """The architecture figures of a checkpoint.

    `quant` is quantization_config()'s answer; `parameters` holds `total` and `routed_expert` (parameters, packed
    FP4 counted 2 per byte, scales left out), `tensor_bytes` and `routed_expert_bytes` (the headers' tensor sizes,
    scales included), all of the main model (MTP tensors left out), and, as safetensors_header.count_parameters
    counts them with tensor_roles(config).role, `input_embedding` and `input_embedding_bytes` (with the names in
    `input_embedding_tensors`), `lm_head_tensors`, and the MTP tensors' `mtp` (parameters), `mtp_bytes` and
    `mtp_tensors` (a count); `weights` holds `bytes` (the weight files' sizes, MTP tensors included), `source`
    (which files, and how the parameters were counted) and `bytes_source`."""
    dtype, dtype_source = model_dtype(config, header_dtypes)
    context, context_source = max_context(config)
    auto, auto_source = kv_cache_dtype_auto(quant[0], quant[1], dtype)
    kv_dtype = auto if kv_cache_dtype == "auto" else kv_cache_dtype
    if kv_cache_dtype == "auto" and auto not in KV_CACHE_DTYPE_BYTES and auto not in MODEL_DTYPE_BYTES:
        raise FiguresError(
            f"{auto_source}: kv_cache_dtype auto means {auto} for this checkpoint, a cache layout not modelled; "
            "give kv_cache_dtype explicitly (e.g. fp8)"
        )
    total = parameters["total"]
    if total <= 0:
        raise FiguresError("the safetensors headers hold no parameters")
    roles = tensor_roles(config)
    warnings = list(layout.warnings)
    embedding_names = list(parameters.get("input_embedding_tensors", ()))
    if len(embedding_names) > 1:
        raise FiguresError(
            f"{len(embedding_names)} tensors look like the input embedding ({', '.join(sorted(embedding_names))}); "
            "which one the model reads a row of is not known here"
        )
    tied, tied_source = embeddings_tied(roles, parameters.get("lm_head_tensors", ()))
    embedding, embedding_bytes = parameters.get("input_embedding", 0), parameters.get("input_embedding_bytes", 0)
    if not embedding_names:
        warnings.append(
            "no safetensors tensor is named like the input embedding (*embed_tokens.weight, *embeddings.weight with "
            "vocab_size rows): active_params_b counts every non-expert parameter"
        )
    active, active_source = active_parameters(total, parameters["routed_expert"], config, embedding, tied)
    active_bytes = parameters["tensor_bytes"] - (0 if tied else embedding_bytes)
    if parameters["routed_expert"]:
        count, top, _ = experts(config)
        active_bytes -= parameters["routed_expert_bytes"] * (count - top) // count
    mtp, mtp_bytes = parameters.get("mtp", 0), parameters.get("mtp_bytes", 0)
    mtp_tensors = parameters.get("mtp_tensors", 0)
    if roles.mtp_layers and not mtp_tensors:
        warnings.append(
            f"{roles.mtp_key}={roles.mtp_layers} but no safetensors tensor belongs to an MTP module: this checkpoint "
            "cannot serve --speculative-config method mtp"
        )
    elif mtp_tensors and not roles.mtp_layers:
        warnings.append(f"{mtp_tensors} tensors under mtp but {roles.mtp_source}: they are left out as vLLM does")
    weight_bytes = int(weights["bytes"]) - mtp_bytes
    mamba_dims = recipe_mamba_dims(layout)
    architecture = {
        "total_params_b": total / 1e9,
        "active_params_b": active / 1e9,
        "bytes_per_param": round(weight_bytes / total, 4),
        "weight_bytes": weight_bytes,
        "active_weight_bytes": active_bytes,
        "mtp_layers": roles.mtp_layers,
        "mtp_params_b": mtp / 1e9,
        "mtp_weight_bytes": mtp_bytes,
        "attention_layers": layout.attention_layers,
        # What tensor parallelism splits (module_utils/parallel_layout.py; vLLM's total_num_attention_heads).
        "attention_heads": text_keys(config).integer("num_attention_heads"),
        "kv_heads": layout.kv_heads,
        "head_dim": layout.head_dim,
        "max_context": context,
        "dtype": dtype,
        "attention_kind": layout.kind,
        "full_attention_layers": layout.full_attention_layers,
        "full_attention_kv_heads": layout.full_attention_kv_heads,
        "full_attention_head_dim": layout.full_attention_head_dim,
        "sliding_window": layout.sliding_window,
        "sliding_window_layers": layout.sliding_window_layers,
        "kv_lora_rank": layout.kv_lora_rank,
        "qk_rope_head_dim": layout.qk_rope_head_dim,
        "model_type": layout.model_type,
        "mamba_kind": layout.mamba_kind,
        "mamba_layers": layout.mamba_layers,
        "mamba_dims": mamba_dims,
        "kv_cache_dtype_auto": auto,
        "kv_cache_dtype": kv_dtype,
        "kv_bytes_per_token": kv_bytes_per_token(layout, kv_dtype),
        "sliding_window_kv_bytes_per_token": sliding_window_kv_bytes_per_token(layout, kv_dtype),
    }
    per_layer = f"{layout.kind} attention: " + (
        "(kv_lora_rank + qk_rope_head_dim) x dtype bytes, one latent vector (vLLM MLAAttentionSpec)"
        if layout.kind == "mla"
        else "2 (K, V) x kv_heads x head_dim x dtype bytes (vLLM AttentionSpec)"
    )
    no_mtp = roles.mtp_source if roles.mtp_rule is None else f"none: no tensor is an MTP module's ({roles.mtp_source})"
    mtp_params_left_out = (
        f"; the {mtp_tensors} MTP tensors left out, as vLLM loads them only for MTP speculative decoding" if mtp else ""
    )
    mtp_bytes_left_out = (
        f", less the {mtp_bytes} bytes of the {mtp_tensors} MTP tensors (their headers' data_offsets), which vLLM's "
        "main model does not load"
        if mtp_bytes
        else ""
    )
    sources = {
        **layout.sources,
        "attention_heads": text_keys(config).where("num_attention_heads"),
        "total_params_b": weights["source"] + mtp_params_left_out,
        "active_params_b": f"{active_source}; output head {tied_source}",
        "bytes_per_param": "weight_bytes / total parameters",
        "weight_bytes": weights["bytes_source"] + mtp_bytes_left_out,
        "active_weight_bytes": (
            "safetensors headers: all tensor bytes (scales included) less the routed experts' bytes a token does not"
            " read" + ("" if tied else " and the input embedding's") + ", as for active_params_b"
        ),
        "mtp_layers": roles.mtp_source,
        "mtp_params_b": (
            f"safetensors headers: the {mtp_tensors} tensors of the MTP module(s), counted as total_params_b"
            if mtp_tensors
            else no_mtp
        ),
        "mtp_weight_bytes": (
            f"safetensors headers: data_offsets of the {mtp_tensors} MTP tensors" if mtp_tensors else no_mtp
        ),
        "max_context": context_source,
        "dtype": dtype_source,
        "kv_cache_dtype_auto": auto_source,
        "kv_bytes_per_token": f"full_attention_layers x {per_layer}"
        + (" (their own full_attention_kv_heads, full_attention_head_dim)" if layout.full_attention_head_dim else "")
        + f", kv_cache_dtype {kv_dtype}",
        "sliding_window_kv_bytes_per_token": f"sliding_window_layers x {per_layer}, kv_cache_dtype {kv_dtype}",
    }
    sources.setdefault("full_attention_layers", sources.get("attention_layers", ""))
    if layout.sliding_window_layers == 0:
        sources["sliding_window_layers"] = "none: no sliding_window in config.json for this model's layers"
        sources["sliding_window"] = sources["sliding_window_layers"]
    sources.setdefault("sliding_window_layers", sources.get("attention_layers", ""))
    sources["model_type"] = layout.sources.get("attention_kind", f"{CONFIG}:model_type")
    if layout.mamba_kind is None:
        none = f"none: a {layout.model_type!r} model has no Mamba or linear-attention layers"
        sources.update(mamba_layers=none, mamba_dims=none)
    sources["kv_cache_dtype"] = (
        "kv_cache_dtype auto, resolved as kv_cache_dtype_auto"
        if kv_cache_dtype == "auto"
        else "the kv_cache_dtype asked"
    )
    return Figures(architecture, sources, tuple(warnings), active, tied)
