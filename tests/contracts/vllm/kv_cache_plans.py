"""vLLM's own KV cache plan for every recipe and for test shapes of each attention kind: run inside a venv that has
the release (tests/contracts/vllm/regenerate.py calls write_contract()). CI never runs this; it reads the file it
writes, tests/contracts/vllm/kv-cache-plans.json, and tests/unit/test_memory_plan_contract.py holds the planner
(module_utils/kv_cache_pages.py, module_utils/memory_plan.py) to it.

What is vLLM's and what is given. vLLM's, called as the engine calls them:
- the per-layer specs: FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, MambaSpec (v1/kv_cache_interface.py),
  with the Mamba state shapes and dtypes from the model classes' own calculators (NemotronHForCausalLM,
  Qwen3_5MoeForConditionalGeneration: get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config);
- align mode and the Mamba block size (models/config.py MambaModelConfig.verify_and_update_config), the hybrid
  attention block size and the Mamba page padding (platforms/interface.py Platform._align_hybrid_block_size, with
  the attention backend the Spark uses: TRITON_ATTN / FLASHINFER / TRITON_MLA, all "multiple of 16" kernels);
- the grouping, the blocks per request, the null block and the capacity check (v1/core/kv_cache_planning.py
  get_global_kv_cache_groups, get_kv_cache_configs, _max_memory_usage_bytes_from_groups), and the concurrency vLLM
  logs (v1/core/kv_cache_utils.py get_kv_cache_capacity).
Given, because they need a built model on a GPU: the engine config is a namespace holding vLLM's real CacheConfig
and the few fields the functions read; each Mamba layer's prefill checkpoint (mamba_mixer2.py get_kv_cache_spec:
one block, alignment 1; qwen_gdn_linear_attn.py: one block, alignment FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (64) when
GDN prefill runs on FlashInfer, which _resolve_gdn_prefill_backend picks on sm_12x with head_k_dim 128 and CUDA 13);
the KV cache layout LBNHC, which vLLM 0.33 resolves for these backends (they declare none: the default preference,
whose first is block-compact, so it holds for Gemma 4's pages of two sizes too). It is set here, not resolved: a
release whose backends declare a block-first layout would pack mixed pages instead, and this contract would not see
it; check the backends' supported_kv_cache_layouts() when regenerating for a new release.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CONTRACT = HERE / "kv-cache-plans.json"
GIB = 2**30

# The test shapes of each attention kind, beside the recipes: planner inputs as a recipe writes them.
SHAPES = {
    "dense-gqa-llama-3.3-70b-tp2": {
        "tensor_parallel_size": 2,
        "max_model_len": 131072,
        "kv_cache_dtype": "fp8",
        "architecture": {"attention_layers": 80, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"},
    },
    "dense-mla-deepseek-v3": {
        "tensor_parallel_size": 1,
        "max_model_len": 163840,
        "kv_cache_dtype": "fp8",
        "architecture": {
            "attention_layers": 61,
            "kv_heads": 1,
            "head_dim": 576,
            "dtype": "bfloat16",
            "attention_kind": "mla",
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        },
    },
    "sliding-window-gemma-like": {
        "tensor_parallel_size": 1,
        "max_model_len": 32768,
        "kv_cache_dtype": "auto",
        "serve_flags": {"max-num-batched-tokens": 8192},
        "architecture": {
            "attention_layers": 30,
            "full_attention_layers": 5,
            "sliding_window_layers": 25,
            "sliding_window": 1024,
            "kv_heads": 8,
            "head_dim": 256,
            "dtype": "bfloat16",
        },
    },
    "sliding-window-13-full-12-sliding-no-async": {
        "tensor_parallel_size": 1,
        "max_model_len": 65536,
        "kv_cache_dtype": "fp8",
        "serve_flags": {"async-scheduling": False},
        "architecture": {
            "attention_layers": 25,
            "full_attention_layers": 13,
            "sliding_window_layers": 12,
            "sliding_window": 128,
            "kv_heads": 8,
            "head_dim": 64,
            "dtype": "bfloat16",
        },
    },
    "mamba2-one-group-tp2": {
        "tensor_parallel_size": 2,
        "max_model_len": 16384,
        "kv_cache_dtype": "fp8",
        "architecture": {
            "attention_layers": 4,
            "kv_heads": 8,
            "head_dim": 128,
            "dtype": "float16",
            "mamba_kind": "mamba2",
            "mamba_layers": 20,
            "mamba_dims": {
                "mamba_num_heads": 48,
                "mamba_head_dim": 64,
                "n_groups": 1,
                "ssm_state_size": 128,
                "conv_kernel": 4,
                "ssm_dtype": "auto",
            },
        },
    },
    "mamba2-hybrid-tp2": {
        "tensor_parallel_size": 2,
        "max_model_len": 65536,
        "kv_cache_dtype": "auto",
        "architecture": {
            "attention_layers": 6,
            "kv_heads": 2,
            "head_dim": 128,
            "dtype": "bfloat16",
            "mamba_kind": "mamba2",
            "mamba_layers": 23,
            "mamba_dims": {
                "mamba_num_heads": 64,
                "mamba_head_dim": 64,
                "n_groups": 8,
                "ssm_state_size": 128,
                "conv_kernel": 4,
                "ssm_dtype": "float32",
            },
        },
    },
    "dense-mla-fp8-tp2": {
        "tensor_parallel_size": 2,
        "max_model_len": 100000,
        "kv_cache_dtype": "fp8",
        "architecture": {
            "attention_layers": 47,
            "kv_heads": 1,
            "head_dim": 576,
            "dtype": "bfloat16",
            "attention_kind": "mla",
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        },
    },
    "mla-mamba2-hybrid": {
        "tensor_parallel_size": 1,
        "max_model_len": 65536,
        "kv_cache_dtype": "auto",
        "architecture": {
            "attention_layers": 8,
            "kv_heads": 1,
            "head_dim": 576,
            "dtype": "bfloat16",
            "attention_kind": "mla",
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "mamba_kind": "mamba2",
            "mamba_layers": 40,
            "mamba_dims": {
                "mamba_num_heads": 128,
                "mamba_head_dim": 64,
                "n_groups": 8,
                "ssm_state_size": 128,
                "conv_kernel": 4,
                "ssm_dtype": "float32",
            },
        },
    },
    "mamba2-hybrid-short-context": {
        "tensor_parallel_size": 1,
        "max_model_len": 2000,
        "kv_cache_dtype": "fp8",
        "architecture": {
            "attention_layers": 6,
            "kv_heads": 2,
            "head_dim": 128,
            "dtype": "bfloat16",
            "mamba_kind": "mamba2",
            "mamba_layers": 23,
            "mamba_dims": {
                "mamba_num_heads": 64,
                "mamba_head_dim": 64,
                "n_groups": 8,
                "ssm_state_size": 128,
                "conv_kernel": 4,
                "ssm_dtype": "float32",
            },
        },
    },
    "gated-deltanet-tp2-bf16-state": {
        "tensor_parallel_size": 2,
        "max_model_len": 131072,
        "kv_cache_dtype": "fp8",
        "architecture": {
            "attention_layers": 10,
            "kv_heads": 2,
            "head_dim": 256,
            "dtype": "bfloat16",
            "mamba_kind": "gated_delta_net",
            "mamba_layers": 30,
            "mamba_dims": {
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 32,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "ssm_dtype": "bfloat16",
            },
        },
    },
    "gated-deltanet-hybrid-bf16": {
        "tensor_parallel_size": 1,
        "max_model_len": 32768,
        "kv_cache_dtype": "auto",
        "architecture": {
            "attention_layers": 12,
            "kv_heads": 2,
            "head_dim": 256,
            "dtype": "bfloat16",
            "mamba_kind": "gated_delta_net",
            "mamba_layers": 36,
            "mamba_dims": {
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 32,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "ssm_dtype": "auto",
            },
        },
    },
}

# What vLLM runs each kind with on a Spark, and the Mamba layer classes' answers it is given (module docstring).
MAMBA_MODEL = {"mamba2": "nemotron_h:NemotronHForCausalLM", "gated_delta_net": "qwen3_5:Qwen3_5MoeForCausalLM"}
CHECKPOINT_ALIGNMENT = {"mamba2": 1, "gated_delta_net": 64}
SPECULATIVE_TOKENS = (0, 3)


def load_recipes() -> dict[str, dict]:
    import yaml

    recipes = {}
    for path in sorted((ROOT / "recipes").glob("*.yml")):
        recipe = yaml.safe_load(path.read_text())
        recipes[recipe["name"]] = recipe
    return recipes


def kv_dtype(case: dict) -> str:
    """The --kv-cache-dtype vLLM runs: a recipe's "auto" means the model dtype, or what its checkpoint sets
    (recipes say so in kv_cache_dtype_auto; the planner's recipe_rules.resolved_kv_cache_dtype reads the same)."""
    asked = case.get("kv_cache_dtype", "auto")
    if asked != "auto":
        return asked
    return case["architecture"].get("kv_cache_dtype_auto") or "auto"


def _torch_dtype(name: str):
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    return STR_DTYPE_TO_TORCH_DTYPE[name]


def engine_config(case: dict, *, prefix_caching: bool, speculative_tokens: int, max_model_len: int):
    """The fields of VllmConfig the planning functions read, around vLLM's real CacheConfig."""
    from vllm.config import CacheConfig

    architecture = case["architecture"]
    flags = case.get("serve_flags") or {}
    dims = architecture.get("mamba_dims") or {}
    ssm = dims.get("ssm_dtype") or "auto"
    cache = CacheConfig(
        block_size=None,
        cache_dtype=kv_dtype(case),
        enable_prefix_caching=prefix_caching,
        mamba_ssm_cache_dtype=ssm,
    )
    cache.kv_cache_layout = "LBNHC"
    hf_config = SimpleNamespace(**{k: v for k, v in dims.items() if k != "ssm_dtype"})
    use_mla = architecture.get("attention_kind") == "mla"
    kv_heads = 1 if use_mla else architecture["kv_heads"]
    head_size = architecture["kv_lora_rank"] + architecture["qk_rope_head_dim"] if use_mla else architecture["head_dim"]
    model = SimpleNamespace(
        # config/model.py get_num_kv_heads (KV heads split over TP ranks, at least one; MLA one latent) and
        # get_head_size (MLA: kv_lora_rank + qk_rope_head_dim), for the recipe's figures
        get_num_kv_heads=lambda parallel: max(1, kv_heads // parallel.tensor_parallel_size),
        get_head_size=lambda: head_size,
        # FlashInfer's kernel block sizes ask for the query heads (large pages only on compute capability 10.x);
        # the smallest, 16, is what the block size reads, whatever the heads
        get_num_attention_heads=lambda parallel: kv_heads,
        max_model_len=max_model_len,
        original_max_model_len=max_model_len,
        dtype=_torch_dtype(architecture["dtype"]),
        use_mla=use_mla,
        hf_config=hf_config,
        hf_text_config=hf_config,
        architecture=None,
        model_impl="vllm",
        supports_kv_cache_grouping=False,  # neither NemotronH nor Qwen3.5 implements SupportsKVCacheGrouping
    )
    batched = flags.get("max-num-batched-tokens") or 2048
    batches = 1 if flags.get("async-scheduling") is False else 2
    speculative = (
        SimpleNamespace(
            num_speculative_tokens=speculative_tokens, use_eagle=lambda: False, use_eagle_block_drop=lambda: False
        )
        if speculative_tokens
        else None
    )
    config = SimpleNamespace(
        cache_config=cache,
        model_config=model,
        parallel_config=SimpleNamespace(
            tensor_parallel_size=case.get("tensor_parallel_size", 1),
            decode_context_parallel_size=1,
            pipeline_parallel_size=1,
        ),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=False,
            enable_chunked_prefill=True,
            max_num_batched_tokens=batched,
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=speculative,
        num_speculative_tokens=speculative_tokens,
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=batches * batched,
        compilation_config=SimpleNamespace(static_forward_context={}),
        additional_config={},
        mamba_config=SimpleNamespace(backend=None),
    )
    return config


def mamba_model_class(kind: str):
    import importlib

    module, _, name = MAMBA_MODEL[kind].partition(":")
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


def attention_backend(case: dict):
    from vllm.v1.attention.backends.flashinfer import FlashInferBackend
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    if case["architecture"].get("attention_kind") == "mla":
        return TritonMLABackend
    if (case.get("serve_flags") or {}).get("attention-backend") == "flashinfer":
        return FlashInferBackend
    return TritonAttentionBackend


def align_hybrid(config, case: dict) -> None:
    """vLLM's align mode and hybrid block size, with the Mamba layers' checkpoint alignment given."""
    from unittest import mock

    from vllm.model_executor.layers.mamba import abstract
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MambaModelConfig
    from vllm.platforms.interface import Platform

    kind = case["architecture"]["mamba_kind"]
    model_class = mamba_model_class(kind)
    MambaModelConfig.verify_and_update_config(config)
    alignment = CHECKPOINT_ALIGNMENT[kind] if config.cache_config.mamba_cache_mode == "align" else None
    with (
        mock.patch.object(ModelRegistry, "resolve_model_cls", return_value=(model_class, "given")),
        mock.patch.object(abstract, "get_mamba_prefill_checkpoint_alignment", return_value=alignment),
    ):
        Platform._align_hybrid_block_size(config, attention_backend(case))


def layer_specs(config, case: dict) -> dict:
    """One spec per layer that holds cache, as the model's layers report them (get_kv_cache_spec)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_quant_mode,
    )

    architecture = case["architecture"]
    cache = config.cache_config
    tp = config.parallel_config.tensor_parallel_size
    dtype = config.model_config.dtype if cache.cache_dtype == "auto" else _torch_dtype(cache.cache_dtype)
    mode = get_kv_quant_mode(cache.cache_dtype)
    block = cache.block_size
    specs = {}
    sliding = architecture.get("sliding_window_layers") or 0
    full = architecture.get("full_attention_layers")
    full = architecture["attention_layers"] - sliding if full is None else full
    if architecture.get("attention_kind") == "mla":
        for index in range(full):
            specs[f"mla.{index}"] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                head_size=architecture["kv_lora_rank"] + architecture["qk_rope_head_dim"],
                dtype=dtype if cache.cache_dtype != "auto" else config.model_config.dtype,
                cache_dtype_str=cache.cache_dtype,
                kv_quant_mode=mode,
            )
    else:
        heads = max(1, architecture["kv_heads"] // tp)
        common = {"block_size": block, "num_kv_heads": heads, "head_size": architecture["head_dim"], "dtype": dtype}
        # Gemma 4's full-attention layers have heads of their own (models/gemma4.py per_layer_config).
        full_heads = max(1, (architecture.get("full_attention_kv_heads") or architecture["kv_heads"]) // tp)
        full_head_size = architecture.get("full_attention_head_dim") or architecture["head_dim"]
        own = {**common, "num_kv_heads": full_heads, "head_size": full_head_size}
        for index in range(full):
            specs[f"full.{index}"] = FullAttentionSpec(**own, kv_quant_mode=mode)
        for index in range(sliding):
            specs[f"sliding.{index}"] = SlidingWindowSpec(
                **common, kv_quant_mode=mode, sliding_window=architecture["sliding_window"]
            )
    mamba_layers = architecture.get("mamba_layers") or 0
    if mamba_layers:
        kind = architecture["mamba_kind"]
        model_class = mamba_model_class(kind)
        spec = MambaSpec(
            shapes=tuple(model_class.get_mamba_state_shape_from_config(config)),
            dtypes=tuple(model_class.get_mamba_state_dtype_from_config(config)),
            block_size=cache.mamba_block_size,
            page_size_padded=cache.mamba_page_size_padded,
            mamba_cache_mode=cache.mamba_cache_mode,
            num_speculative_blocks=config.num_speculative_tokens,
        )
        spec = replace(  # mamba_mixer2.py / qwen_gdn_linear_attn.py get_kv_cache_spec (module docstring)
            spec,
            num_prefill_checkpoint_blocks=1,
            prefill_checkpoint_alignment=CHECKPOINT_ALIGNMENT[kind],
        )
        for index in range(mamba_layers):
            specs[f"mamba.{index}"] = spec
    assert all(isinstance(s.dtype, torch.dtype) for s in specs.values() if hasattr(s, "dtype"))
    return specs


def vllm_plan(case: dict, *, prefix_caching: bool, speculative_tokens: int, budgets: list[int]) -> dict:
    """vLLM's answer for one case: block size, pages, groups, blocks per request, and per KV budget the blocks,
    whether one max_model_len sequence is admitted, and the concurrency vLLM logs."""
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    max_model_len = case["max_model_len"]
    config = engine_config(
        case, prefix_caching=prefix_caching, speculative_tokens=speculative_tokens, max_model_len=max_model_len
    )
    hybrid = bool(case["architecture"].get("mamba_layers"))
    if hybrid:
        align_hybrid(config, case)
    specs = layer_specs(config, case)
    builder = DefaultKVCacheConfigBuilder()
    groups = planning.get_global_kv_cache_groups(config, [dict(specs)])
    bytes_per_block = planning._pool_bytes_per_block_from_builder(builder, config, groups)
    per_request = planning._max_memory_usage_bytes_from_groups(builder, config, groups)
    answer = {
        "block_size": config.cache_config.block_size,
        "mamba_cache_mode": config.cache_config.mamba_cache_mode if hybrid else None,
        "page_bytes": sorted({spec.page_size_bytes for spec in specs.values()}),
        "mamba_state_bytes": next(
            (spec.real_page_size_bytes for name, spec in specs.items() if name.startswith("mamba.")), 0
        ),
        "groups": [{"kind": group.layer_names[0].split(".")[0], "layers": len(group.layer_names)} for group in groups],
        "bytes_per_block": bytes_per_block,
        "blocks_per_request": per_request // bytes_per_block,
        "bytes_per_sequence": per_request,
        "budgets": [],
    }
    for budget in budgets:
        row = {"kv_budget_bytes": budget}
        try:
            configs = planning.get_kv_cache_configs(config, [dict(specs)], [budget], groups)
        except ValueError as error:
            row.update(admits_one_sequence=False, refusal=str(error).split(". ")[0])
        else:
            tokens, concurrency = get_kv_cache_capacity(config, configs[0])
            row.update(
                admits_one_sequence=True,
                num_blocks=configs[0].num_blocks,
                max_concurrency=round(concurrency, 6),
                kv_cache_size_tokens=tokens,
            )
        answer["budgets"].append(row)
    return answer


def cases() -> list[dict]:
    """Every recipe and test shape, with and without prefix caching and speculative tokens where they change the
    plan (hybrids), and budgets around the admission edge (one sequence plus vLLM's null block, one byte less)."""
    found = []
    for name, recipe in load_recipes().items():
        found.append({"name": name, "recipe": name, **{k: recipe.get(k) for k in RECIPE_KEYS}})
    for name, shape in SHAPES.items():
        found.append({"name": name, "recipe": None, **shape})
    out = []
    for case in found:
        hybrid = bool(case["architecture"].get("mamba_layers"))
        variants = [(True, 0), (False, 0), (True, 3), (False, 3)] if hybrid else [(True, 0)]
        for prefix_caching, speculative in variants:
            if hybrid and (case.get("serve_flags") or {}).get("enable-prefix-caching") is False and prefix_caching:
                continue
            first = vllm_plan(case, prefix_caching=prefix_caching, speculative_tokens=speculative, budgets=[])
            edge = first["bytes_per_sequence"] + first["bytes_per_block"]
            budgets = [edge, edge - 1, 16 * GIB, 40 * GIB]
            plan = vllm_plan(case, prefix_caching=prefix_caching, speculative_tokens=speculative, budgets=budgets)
            out.append(
                {
                    "case": case,
                    "prefix_caching": prefix_caching,
                    "speculative_tokens": speculative,
                    "vllm": plan,
                }
            )
    return out


RECIPE_KEYS = ("tensor_parallel_size", "max_model_len", "kv_cache_dtype", "serve_flags", "architecture")


def write_contract(version: str) -> int:
    found = cases()
    document = {
        "vllm_version": version,
        "generated_by": "tests/contracts/vllm/kv_cache_plans.py (called by regenerate.py)",
        "plans": found,
    }
    CONTRACT.write_text(json.dumps(document, indent=1, sort_keys=True, default=str) + "\n")
    assert all(math.isfinite(p["vllm"]["bytes_per_sequence"]) for p in found)
    return len(found)
