"""Reading a safetensors header, and counting a checkpoint's parameters from the headers alone (no weights).

The format (huggingface/safetensors README "Format", and its parser safetensors/src/tensor.rs): 8 bytes N, an
unsigned little-endian 64-bit integer; then N bytes of UTF-8 JSON that starts with `{` (and may be right-padded with
spaces) mapping each tensor name to `{"dtype", "shape", "data_offsets": [BEGIN, END]}`, offsets into the byte
buffer that follows the header, plus an optional `"__metadata__"` map of strings to strings; then the byte buffer,
with no holes. So reading bytes 0-7 and then bytes 8..8+N-1 of each shard (two HTTP Range requests) tells every
tensor's name, dtype and shape without a byte of the weights.

Counting parameters. A tensor holds prod(shape) elements; a parameter count must not count what is not a weight:

- packed 4-bit formats store two values per byte in a U8 tensor: gpt-oss's MXFP4 expert weights
  (`*_blocks`, U8 [E, rows, K/32, 16], transformers integrations/mxfp4.py; vLLM loads them as uint8 of
  hidden//2, model_executor/layers/quantization/mxfp4.py) and ModelOpt NVFP4 weights (`*.weight`, U8 [out, in/2],
  "2 fp4 items are packed in the input dimension", vLLM model_executor/layers/quantization/modelopt.py). Each byte
  counts as 2 parameters;
- quantisation scales are not parameters: MXFP4 `*_scales` (one E8M0 byte per 32 values), ModelOpt
  `*.weight_scale` (FP8 per 16 values), `*.weight_scale_2`, `*.input_scale`, `*.k_scale`, `*.v_scale`, and the FP8
  block scales `*.weight_scale_inv`. They are counted apart (`scale_elements`).

Other packings (AWQ/GPTQ int32 words, compressed-tensors `weight_packed`) are refused, naming the tensor, rather
than counted wrongly. Routed MoE experts are the tensors under a module named `experts` (`mlp.experts.3.up_proj`,
gpt-oss's fused `mlp.experts.gate_up_proj_blocks`, Nemotron-H's `mixer.experts.0.up_proj`); `shared_experts` and
`shared_expert` are always active, so they are not among them.

Which tensors are the input embedding and which belong to a multi-token-prediction (MTP) module depends on the
model's config, so the caller says so with a `role` function (module_utils/model_config_figures.py `TensorRoles`):
the input embedding is counted as usual and also apart (`input_embedding`); an MTP tensor, which vLLM does not load
into the main model, is counted only apart (`mtp_*`), never in `by_dtype`, `total`, `routed_expert` or
`tensor_bytes`.

Standard library only; nothing here imports Ansible, so the planner and pytest can call these functions directly.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

HEADER_LENGTH_BYTES = 8
# safetensors refuses a longer header (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
MAX_HEADER_BYTES = 100_000_000

# Bits per element of every dtype name a header may carry (safetensors/src/tensor.rs, Dtype::bitsize).
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# How each quantisation scheme this module understands lays its tensors out (see the module docstring).
# scheme -> (name suffixes of scale tensors, name suffixes of U8 tensors packing two 4-bit values per byte)
SCHEMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "none": ((), ()),
    "mxfp4": (("_scales",), ("_blocks",)),
    "modelopt": (
        (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale", ".pre_quant_scale"),
        (".weight",),
    ),
    "fp8": ((".weight_scale_inv", ".weight_scale", ".input_scale", ".k_scale", ".v_scale"), ()),
}
PACKED_LABEL = "FP4 (packed 2 per byte in U8)"
# Integer dtypes: in a quantised checkpoint a tensor of these that no rule explains is a packing this module
# does not know, so it is refused instead of counted as one parameter per element.
INTEGER_DTYPES = frozenset({"U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"})

ROUTED_EXPERT = re.compile(r"(^|\.)experts(\.|$)")
# What a role function (count_parameters) may call a tensor.
INPUT_EMBEDDING = "input_embedding"
MTP = "mtp"
# vLLM's test for a checkpoint's own output head (transformers_utils/config.py checkpoint_has_lm_head).
LM_HEAD_SUFFIX = "lm_head.weight"


class HeaderError(ValueError):
    """A safetensors header this module cannot read; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Tensor:
    """One entry of a header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass
class ParameterCounts:
    """Parameters of a checkpoint by dtype (packed FP4 under PACKED_LABEL), the part in routed experts, and the
    quantisation scale elements left out."""

    by_dtype: dict[str, int] = field(default_factory=dict)
    routed_expert: int = 0
    scale_elements: int = 0
    tensor_bytes: int = 0  # every tensor's bytes, scales included
    routed_expert_bytes: int = 0  # the bytes of the routed experts' tensors, their scales included
    tensors: int = 0
    input_embedding: int = 0  # parameters of the tensor(s) the role function calls the input embedding
    input_embedding_bytes: int = 0
    input_embedding_tensors: list[str] = field(default_factory=list)
    lm_head_tensors: list[str] = field(default_factory=list)  # names ending in `lm_head.weight`, MTP or not
    mtp_parameters: int = 0  # MTP tensors: counted here only
    mtp_scale_elements: int = 0
    mtp_tensor_bytes: int = 0
    mtp_tensors: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())

    def add(self, other: ParameterCounts) -> None:
        for dtype, count in other.by_dtype.items():
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + count
        self.routed_expert += other.routed_expert
        self.scale_elements += other.scale_elements
        self.tensor_bytes += other.tensor_bytes
        self.routed_expert_bytes += other.routed_expert_bytes
        self.tensors += other.tensors
        self.input_embedding += other.input_embedding
        self.input_embedding_bytes += other.input_embedding_bytes
        self.input_embedding_tensors += other.input_embedding_tensors
        self.lm_head_tensors += other.lm_head_tensors
        self.mtp_parameters += other.mtp_parameters
        self.mtp_scale_elements += other.mtp_scale_elements
        self.mtp_tensor_bytes += other.mtp_tensor_bytes
        self.mtp_tensors += other.mtp_tensors


def header_length(first_bytes: bytes, name: str) -> int:
    """N, from the first 8 bytes of a safetensors file; HeaderError when they cannot start one."""
    if len(first_bytes) < HEADER_LENGTH_BYTES:
        raise HeaderError(f"{name}: {len(first_bytes)} bytes where a safetensors file starts with 8")
    (length,) = struct.unpack("<Q", first_bytes[:HEADER_LENGTH_BYTES])
    if length < 2 or length > MAX_HEADER_BYTES:
        raise HeaderError(
            f"{name}: a header of {length:,} bytes (safetensors allows 2 to {MAX_HEADER_BYTES:,}); "
            "this is not a safetensors file (a git-lfs pointer or an HTML page?)"
        )
    return length


def _shape(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        return None
    return tuple(value) if all(d >= 0 for d in value) else None


def _offsets(value: object) -> tuple[int, int] | None:
    if not (isinstance(value, list) and len(value) == 2):
        return None
    begin, end = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (begin, end)) or not 0 <= begin <= end:
        return None
    return begin, end


def parse_header(header: bytes, name: str, file_size: int | None = None) -> list[Tensor]:
    """The tensors of a header (the N bytes after the first 8), checked as safetensors checks them: known dtypes,
    whole-byte sizes that match the offsets, a byte buffer with no holes; and, when `file_size` is given, a buffer
    that ends where the file ends. HeaderError names the file and the tensor at fault."""
    if not header.startswith(b"{"):
        raise HeaderError(f"{name}: the header does not start with '{{'")
    try:
        entries = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise HeaderError(f"{name}: the header is not JSON ({error})") from None
    if not isinstance(entries, dict):
        raise HeaderError(f"{name}: the header is not a JSON object")
    metadata = entries.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{name}: __metadata__ must map strings to strings")
    tensors, spans = [], []
    for tensor_name, entry in entries.items():
        where = f"{name}: tensor {tensor_name!r}"
        if not isinstance(entry, dict):
            raise HeaderError(f"{where}: not an object")
        dtype, shape, offsets = entry.get("dtype"), _shape(entry.get("shape")), _offsets(entry.get("data_offsets"))
        if dtype not in DTYPE_BITS:
            raise HeaderError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
        if shape is None or offsets is None:
            raise HeaderError(f"{where}: shape and data_offsets must be lists of non-negative integers")
        tensor = Tensor(tensor_name, dtype, shape, offsets[1] - offsets[0])
        bits = tensor.elements * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != tensor.nbytes:
            raise HeaderError(
                f"{where}: {dtype} {list(shape)} takes {bits / 8:g} bytes but data_offsets span {tensor.nbytes}"
            )
        tensors.append(tensor)
        spans.append((offsets, tensor_name))
    position = 0
    for (begin, end), tensor_name in sorted(spans):
        if begin != position:
            raise HeaderError(
                f"{name}: tensor {tensor_name!r} starts at {begin}, not at {position} (a hole or overlap)"
            )
        position = end
    if file_size is not None and HEADER_LENGTH_BYTES + len(header) + position != file_size:
        raise HeaderError(
            f"{name}: header and tensors take {HEADER_LENGTH_BYTES + len(header) + position:,} bytes but the file "
            f"has {file_size:,}"
        )
    return tensors


def is_routed_expert(tensor_name: str) -> bool:
    """Whether a tensor belongs to a routed MoE expert (a module named `experts` on its path)."""
    return ROUTED_EXPERT.search(tensor_name) is not None


def count_parameters(
    tensors: Iterable[Tensor], scheme: str, name: str, role: Callable[[Tensor], str | None] | None = None
) -> ParameterCounts:
    """The parameters of one file's tensors under a quantisation scheme of SCHEMES. HeaderError names a tensor
    whose packing the scheme does not explain (so a parameter count is never silently wrong).

    `role(tensor)` says what a tensor is beyond its name's rules: INPUT_EMBEDDING (counted as usual and also in
    `input_embedding`), MTP (counted only in `mtp_*`) or None."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    scale_suffixes, packed_suffixes = SCHEMES[scheme]
    counts = ParameterCounts()
    for tensor in tensors:
        kind = role(tensor) if role is not None else None
        if tensor.name.endswith(LM_HEAD_SUFFIX):
            counts.lm_head_tensors.append(tensor.name)
        scale = bool(scale_suffixes) and tensor.name.endswith(scale_suffixes)
        if scale:
            label, params = None, 0
        elif tensor.dtype == "U8" and packed_suffixes and tensor.name.endswith(packed_suffixes):
            label, params = PACKED_LABEL, 2 * tensor.elements
        elif scheme != "none" and tensor.dtype in INTEGER_DTYPES:
            raise HeaderError(
                f"{name}: tensor {tensor.name!r} is {tensor.dtype} {list(tensor.shape)} in a {scheme!r} checkpoint, "
                "a packing this module does not know how to count"
            )
        else:
            label, params = tensor.dtype, tensor.elements
        if kind == MTP:
            counts.mtp_tensors += 1
            counts.mtp_tensor_bytes += tensor.nbytes
            counts.mtp_parameters += params
            counts.mtp_scale_elements += tensor.elements if scale else 0
            continue
        counts.tensors += 1
        counts.tensor_bytes += tensor.nbytes
        routed = is_routed_expert(tensor.name)
        counts.routed_expert_bytes += tensor.nbytes if routed else 0
        if scale:
            counts.scale_elements += tensor.elements
            continue
        counts.by_dtype[label] = counts.by_dtype.get(label, 0) + params
        if routed:
            counts.routed_expert += params
        if kind == INPUT_EMBEDDING:
            counts.input_embedding += params
            counts.input_embedding_bytes += tensor.nbytes
            counts.input_embedding_tensors.append(tensor.name)
    return counts


def tensor_dtypes(tensors_by_file: Mapping[str, Iterable[Tensor]]) -> set[str]:
    """Every dtype the headers hold (what vLLM reads when config.json names no dtype)."""
    return {tensor.dtype for tensors in tensors_by_file.values() for tensor in tensors}


INDEX_FILE = "model.safetensors.index.json"


def weight_files(tree: Iterable[Mapping], index: Mapping | None) -> list[dict]:
    """The safetensors files vLLM loads, as {path, size}: those at the top of the repo (its default loader globs
    `*.safetensors` in the model folder, so `original/` or `metal/` copies are not loaded), and, when the repo has
    model.safetensors.index.json, only those its weight_map names (weight_utils.py
    filter_duplicate_safetensors_files). ValueError names an index entry with no file."""
    files = {
        entry["path"]: int(entry.get("size") or 0)
        for entry in tree
        if entry.get("type") == "file" and "/" not in entry["path"] and entry["path"].endswith(".safetensors")
    }
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{INDEX_FILE} has no weight_map object")
        named = set(weight_map.values())
        missing = sorted(named - set(files))
        if missing:
            raise ValueError(f"{INDEX_FILE} names weight files the repo does not have at the top: {', '.join(missing)}")
        files = {path: size for path, size in files.items() if path in named}
    return [{"path": path, "size": files[path]} for path in sorted(files)]
