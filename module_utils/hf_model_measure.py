"""A model's architecture figures measured at a pinned Hub commit (hf_model_figures): the configs and the
safetensors headers read through hf_hub_api.Hub (no weight byte), counted by safetensors_header.py and turned into
the recipe's architecture block by model_config_figures.py.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.hf_hub_api import Hub, HubError
from ansible.module_utils.input_rules import hf_repo
from ansible.module_utils.model_config_figures import (
    CONFIG,
    HF_QUANT_CONFIG,
    architecture_figures,
    attention_layout,
    quantization_config,
    read_config,
    tensor_roles,
    weight_scheme,
)
from ansible.module_utils.safetensors_header import (
    HEADER_LENGTH_BYTES,
    INDEX_FILE,
    ParameterCounts,
    Tensor,
    count_parameters,
    header_length,
    parse_header,
    weight_files,
)

MAX_WORKERS = 8


def input_problem(params: dict) -> str | None:
    """What is wrong with the module's arguments, the first thing found; None when nothing is."""
    repo_problem = hf_repo(params["repo_id"])
    if repo_problem:
        return f"repo_id={params['repo_id']!r} {repo_problem}"
    if not params["revision"]:
        return "revision must be a branch, tag or 40-hex commit id, not empty"
    if urllib.parse.urlsplit(params["endpoint"]).scheme not in ("http", "https"):
        return f"endpoint={params['endpoint']!r}: must be an http:// or https:// URL, e.g. https://huggingface.co"
    if params["timeout_s"] <= 0:
        return f"timeout_s={params['timeout_s']}: must be a positive number of seconds"
    return None


def read_headers(
    hub: Hub, commit: str, files: list[dict], scheme: str, role: Callable[[Tensor], str | None] | None = None
) -> tuple[ParameterCounts, set[str], list]:
    """Every weight file's header (8 bytes, then the header), counted: (parameters, dtypes, per-file facts).
    `role` tells the input embedding and the MTP tensors (model_config_figures.TensorRoles.role)."""

    def one(item: dict) -> tuple[ParameterCounts, set[str], dict]:
        length = header_length(hub.byte_range(commit, item["path"], 0, HEADER_LENGTH_BYTES), item["path"])
        header = hub.byte_range(commit, item["path"], HEADER_LENGTH_BYTES, length)
        tensors = parse_header(header, item["path"], item["size"] or None)
        counts = count_parameters(tensors, scheme, item["path"], role)
        facts = {"path": item["path"], "size": item["size"], "header_bytes": length, "tensors": len(tensors)}
        return counts, {tensor.dtype for tensor in tensors}, facts

    total, dtypes, facts = ParameterCounts(), set(), []
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(files))) as pool:
        for counts, file_dtypes, file_facts in pool.map(one, files):
            total.add(counts)
            dtypes |= file_dtypes
            facts.append(file_facts)
    return total, dtypes, facts


def measure(hub: Hub, kv_cache_dtype: str) -> tuple[dict, list[str]]:
    """(the module's result, warnings): resolve, list, read the configs, then the headers, then the figures."""
    commit = hub.commit()
    tree = hub.top_files(commit)
    names = {entry["path"] for entry in tree if entry.get("type") == "file"}
    if CONFIG not in names:
        raise HubError(f"{hub.repo_id} has no {CONFIG} at {commit}: not a transformers model repository")
    config = read_config(hub.file(commit, CONFIG))
    layout = attention_layout(config)  # an unknown config fails here, before any weight file is touched
    roles = tensor_roles(config)
    hf_quant = None
    if "quantization_config" not in config and "compression_config" not in config and HF_QUANT_CONFIG in names:
        hf_quant = read_config(hub.file(commit, HF_QUANT_CONFIG), HF_QUANT_CONFIG)
    quant = quantization_config(config, hf_quant)
    scheme = weight_scheme(*quant)
    index = read_config(hub.file(commit, INDEX_FILE), INDEX_FILE) if INDEX_FILE in names else None
    try:
        files = weight_files(tree, index)
    except ValueError as error:
        raise HubError(f"{hub.repo_id}@{commit}: {error}") from None
    if not files:
        raise HubError(f"{hub.repo_id}@{commit} has no .safetensors file at its top: vLLM would find no weights")
    counts, dtypes, facts = read_headers(hub, commit, files, scheme, roles.role)
    weight_bytes = sum(item["size"] for item in files)
    names_read = f"{files[0]['path']}" + (f" .. {files[-1]['path']}" if len(files) > 1 else "")
    scheme_rule = {
        "none": "one parameter per element",
        "mxfp4": "U8 *_blocks count 2 per byte (MXFP4), *_scales are not parameters",
        "modelopt": "U8 *.weight count 2 per byte (NVFP4), *_scale* tensors are not parameters",
        "fp8": "*.weight_scale_inv / *_scale tensors are not parameters",
    }[scheme]
    weights = {
        "bytes": weight_bytes,
        "source": f"safetensors headers of {len(files)} file(s) ({names_read}): elements per dtype; {scheme_rule}",
        "bytes_source": f"tree listing at {commit}: sum of the sizes of {len(files)} top-level .safetensors file(s)"
        + (f" named by {INDEX_FILE}" if index is not None else ""),
    }
    parameters = {
        "total": counts.total,
        "routed_expert": counts.routed_expert,
        "tensor_bytes": counts.tensor_bytes,
        "routed_expert_bytes": counts.routed_expert_bytes,
        "input_embedding": counts.input_embedding,
        "input_embedding_bytes": counts.input_embedding_bytes,
        "input_embedding_tensors": counts.input_embedding_tensors,
        "lm_head_tensors": counts.lm_head_tensors,
        "mtp": counts.mtp_parameters,
        "mtp_bytes": counts.mtp_tensor_bytes,
        "mtp_tensors": counts.mtp_tensors,
    }
    figures = architecture_figures(config, layout, quant, parameters, dtypes, weights, kv_cache_dtype)
    result = {
        "changed": False,
        "commit": commit,
        "architecture": figures.architecture,
        "sources": figures.sources,
        "parameters": {
            "total": counts.total,
            "active": figures.active_parameters,
            "routed_expert": counts.routed_expert,
            "tensor_bytes": counts.tensor_bytes,
            "routed_expert_bytes": counts.routed_expert_bytes,
            "input_embedding": counts.input_embedding,
            "tied_word_embeddings": figures.tied_embeddings,
            "by_dtype": dict(sorted(counts.by_dtype.items())),
            "scale_elements": counts.scale_elements,
            "mtp": counts.mtp_parameters,
            "mtp_scale_elements": counts.mtp_scale_elements,
            "mtp_tensor_bytes": counts.mtp_tensor_bytes,
            "scheme": scheme,
        },
        "files": facts,
        "bytes_read": hub.bytes_read,
    }
    return result, list(figures.warnings)
