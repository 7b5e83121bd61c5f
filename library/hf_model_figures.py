#!/usr/bin/python
"""Ansible module hf_model_figures: a model's architecture figures, measured from its config.json and the
safetensors headers of a pinned Hub commit (the recipe's `architecture` block)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_figures
short_description: Measure a Hugging Face model's architecture figures (parameters, KV cache) at a pinned commit
description:
  - Resolves O(revision) of O(repo_id) to a commit, lists the top of the repository at that commit through the
    Hub's tree API, reads C(config.json) (and C(hf_quant_config.json) and C(model.safetensors.index.json) when the
    repository has them), then reads only the header of each safetensors file vLLM would load, with two HTTP Range
    requests per file (the first 8 bytes, then the header). No weight byte is downloaded, so a 120B model takes
    seconds.
  - Returns the recipe's C(architecture) block (see C(recipes/README.md)), measured rather than copied from a model
    card. Parameters are counted per dtype from the headers; packed 4-bit weights (MXFP4 C(*_blocks), ModelOpt
    NVFP4 C(U8) weights) count two parameters per byte and quantisation scales are not parameters. Active
    parameters of a mixture of experts are the total less the share of the routed expert tensors a token does not
    use. C(weight_bytes) is the sum of the weight files' sizes in the tree listing.
  - The KV-cache figures follow vLLM 0.33's rules per attention kind, which module_utils/model_config_figures.py
    cites. They cover full attention with grouped KV heads, sliding-window layers (gpt-oss slides its even
    layers), hybrid Mamba-2 / Gated DeltaNet models (only the attention layers hold a KV cache; the others keep a
    state per sequence), multi-head latent attention (DeepSeek, Kimi, GLM-4.7-Flash; one latent vector per token
    and layer), and text configs nested under C(text_config).
  - A config it has no rule for (an unknown C(model_type), a C(layer_types) value, a quantisation layout) fails
    naming the file and the key, instead of guessing.
  - Read-only; never reports a change. Needs only the Python standard library on the host.
version_added: "0.1.0"
author: sparkfleet
options:
  repo_id:
    description: Model repository on the Hub, V(org/name).
    type: str
    required: true
  revision:
    description:
      - Branch, tag or 40-hex commit id. It is resolved to a commit, returned as RV(commit); every file is read at
        that commit.
    type: str
    default: main
  endpoint:
    description: The Hub, or a mirror of it (the value huggingface_hub reads from C(HF_ENDPOINT)).
    type: str
    default: https://huggingface.co
  token:
    description:
      - Hugging Face token for gated or private repositories. Sent only to the host of O(endpoint), never to the
        storage host the Hub redirects weight files to, and never shown in a message.
    type: str
  kv_cache_dtype:
    description:
      - The C(--kv-cache-dtype) the KV figures are computed for. V(auto) is what vLLM makes of it for this
        checkpoint (the model dtype, or FP8 for a ModelOpt checkpoint that asks for an FP8 KV cache), returned as
        RV(architecture.kv_cache_dtype_auto).
    type: str
    choices: [auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla, nvfp4_ds_mla]
    default: auto
  timeout_s:
    description: Seconds to wait for each HTTP answer.
    type: float
    default: 30
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - The figures are for one node (tensor parallel size 1) and a batch of one. What the KV cache needs for a given
    C(max_model_len), C(max_num_seqs) and C(max_num_batched_tokens) is the planner's arithmetic on these figures
    (C(full_attention_tokens_per_sequence), C(sliding_window_tokens_per_sequence) in
    module_utils/model_config_figures.py).
  - vLLM also takes the minimum with C(tokenizer_config.json)'s C(model_max_length); this module does not read it.
"""

EXAMPLES = r"""
- name: Measure gpt-oss-120b at the commit its recipe pins
  hf_model_figures:
    repo_id: openai/gpt-oss-120b
    revision: b5c939de8f754692c1647ca79fbf85e8c1e70f8a
  register: figures

- name: Show the architecture block for the recipe
  ansible.builtin.debug:
    msg: "{{ figures.architecture | to_nice_yaml }}"

- name: Measure a gated model through a mirror, for an FP8 KV cache
  hf_model_figures:
    repo_id: meta-llama/Llama-3.3-70B-Instruct
    revision: main
    endpoint: https://hf-mirror.example.internal
    token: "{{ hf_token }}"
    kv_cache_dtype: fp8
"""

RETURN = r"""
commit:
  description: The commit O(revision) resolved to; every figure was read at it.
  returned: success
  type: str
  sample: b5c939de8f754692c1647ca79fbf85e8c1e70f8a
architecture:
  description:
    - The recipe's architecture block (whole model, tensor parallel size 1). The first nine keys are the ones
      recipes carry today (recipes/README.md); the others describe the attention kinds.
    - total_params_b, active_params_b - parameters and parameters read per decoded token, billions.
    - bytes_per_param - weight_bytes / total parameters. weight_bytes - sum of the loaded safetensors files' sizes.
      active_weight_bytes - the tensor bytes a decoded token reads (all, less the routed experts it does not use);
      a better numerator than active_params_b x bytes_per_param when experts and attention differ in precision.
    - attention_layers - layers with a KV cache (full plus sliding-window). kv_heads - KV heads per token and layer
      (1 for MLA). head_dim - elements per head (MLA - kv_lora_rank + qk_rope_head_dim). max_context - the longest
      max_model_len vLLM accepts. dtype - the dtype vLLM runs the model in with C(--dtype auto).
    - attention_kind - V(full) (K and V per KV head) or V(mla) (one latent vector). full_attention_layers,
      sliding_window_layers, sliding_window (tokens, or null).
    - kv_lora_rank, qk_rope_head_dim - MLA dimensions, null otherwise.
    - mamba_kind (V(mamba2), V(gated_delta_net) or null), mamba_layers, mamba_state_bytes_per_sequence (the state
      of all those layers for one sequence, before vLLM pads it to the attention page size).
    - The sample is the scaled-down gpt-oss-shaped test fixture (tests/fixtures/build_figure_models.py).
    - kv_cache_dtype_auto - what C(--kv-cache-dtype auto) means here. kv_cache_dtype - the dtype the next two
      figures are for.
    - kv_bytes_per_token - KV bytes per token over the full-attention layers. sliding_window_kv_bytes_per_token -
      bytes per token over the sliding-window layers, which hold only the last sliding_window tokens (plus the
      tokens in flight) of a sequence.
  returned: success
  type: dict
  sample:
    total_params_b: 0.001387696
    active_params_b: 0.000991408
    bytes_per_param: 1.1736
    weight_bytes: 1628640
    active_weight_bytes: 1405280
    attention_layers: 4
    kv_heads: 2
    head_dim: 32
    max_context: 131072
    dtype: bfloat16
    attention_kind: full
    full_attention_layers: 2
    sliding_window: 128
    sliding_window_layers: 2
    kv_lora_rank:
    qk_rope_head_dim:
    mamba_kind:
    mamba_layers: 0
    mamba_state_bytes_per_sequence: 0
    kv_cache_dtype_auto: bfloat16
    kv_cache_dtype: bfloat16
    kv_bytes_per_token: 512
    sliding_window_kv_bytes_per_token: 512
sources:
  description: For each figure, the file and key it came from, or the rule that made it.
  returned: success
  type: dict
  sample:
    kv_heads: config.json:num_key_value_heads
    head_dim: config.json:head_dim
    sliding_window_layers: "config.json:num_hidden_layers (vLLM gpt_oss.py: layer_idx % 2 == 0 slides)"
parameters:
  description:
    - Exact counts behind the figures - total, active, routed_expert (in routed expert tensors), tensor_bytes and
      routed_expert_bytes (the headers' tensor sizes, scales included), by_dtype (packed FP4 under its own label),
      scale_elements (quantisation scales, not counted as parameters), scheme (the weight layout rule used).
  returned: success
  type: dict
files:
  description: The weight files read - path, size, header_bytes (the header's length), tensors.
  returned: success
  type: list
  elements: dict
bytes_read:
  description: Bytes of the weight files this run downloaded (the 8-byte prefixes and the headers).
  returned: success
  type: int
"""

import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.input_rules import hf_commit, hf_repo
from ansible.module_utils.model_config_figures import (
    CONFIG,
    HF_QUANT_CONFIG,
    FiguresError,
    architecture_figures,
    attention_layout,
    quantization_config,
    read_config,
    weight_scheme,
)
from ansible.module_utils.safetensors_header import (
    HEADER_LENGTH_BYTES,
    INDEX_FILE,
    HeaderError,
    ParameterCounts,
    count_parameters,
    header_length,
    parse_header,
    weight_files,
)

NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
USER_AGENT = "sparkfleet-hf_model_figures/1 (python urllib)"
MAX_WORKERS = 8
MAX_JSON_BYTES = 64 * 1024 * 1024


class HubError(Exception):
    """A Hub answer that stops the run; the message says what failed and what to do."""


def origin(url: str) -> tuple[str, str]:
    """(scheme, host:port) of a URL, with the default port made explicit: the token goes only to this origin."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), f"{(parts.hostname or '').lower()}:{port}"


class TokenOnlyToEndpoint(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does (the Range header goes along; the Authorization header, added as an
    unredirected header, does not), and adds the token again only when the redirect stays on the endpoint."""

    def __init__(self, endpoint_origin: tuple[str, str], token: str | None):
        super().__init__()
        self.endpoint_origin = endpoint_origin
        self.token = token

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.token and origin(newurl) == self.endpoint_origin:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


class Hub:
    """The few Hub calls this module makes, with urllib (standard library only)."""

    def __init__(self, endpoint: str, repo_id: str, revision: str, token: str | None, timeout_s: float):
        self.endpoint = endpoint.rstrip("/")
        self.repo_id = repo_id
        self.revision = revision
        self.token = token or None
        self.timeout_s = timeout_s
        self.endpoint_origin = origin(self.endpoint)
        self.opener = urllib.request.build_opener(TokenOnlyToEndpoint(self.endpoint_origin, self.token))
        self.bytes_read = 0
        self.lock = threading.Lock()

    # --- plumbing

    def _request(self, url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
        if self.token and origin(url) == self.endpoint_origin:
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def _open(self, url: str, what: str, headers: dict[str, str] | None = None):
        try:
            return self.opener.open(self._request(url, headers), timeout=self.timeout_s)
        except urllib.error.HTTPError as error:
            raise self._hub_error(error, what) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise HubError(
                f"{what}: {self.endpoint} did not answer ({reason}); check endpoint and the network"
            ) from None

    def _hub_error(self, error: urllib.error.HTTPError, what: str) -> HubError:
        """The Hub's answer as something a person can act on (the Hub's X-Error-Code / X-Error-Message)."""
        code = error.headers.get("X-Error-Code") if error.headers else None
        message = (error.headers.get("X-Error-Message") if error.headers else None) or error.reason
        where = f"{self.repo_id}@{self.revision} on {self.endpoint}"
        if code == "RepoNotFound":
            if self.token:
                return HubError(
                    f"{self.repo_id} was not found on {self.endpoint}, or the token given has no access to it; "
                    "check repo_id and the token's permissions"
                )
            return HubError(
                f"{self.repo_id} was not found on {self.endpoint} (or it is private or gated and no token was "
                "given); check repo_id, or give a token"
            )
        if code == "RevisionNotFound":
            return HubError(f"revision {self.revision!r} does not exist in {self.repo_id}; check the revision")
        if code == "GatedRepo" or error.code == 403:
            return HubError(f"{where} is gated: accept its licence on the Hub with the token's account, then rerun")
        if error.code == 401:
            if self.token:
                return HubError(
                    f"{where} refused the token (HTTP 401: {message}): it is invalid or expired; give a valid "
                    "Hugging Face token"
                )
            return HubError(f"{where} asks for a token (HTTP 401: {message}); give one")
        if code == "EntryNotFound":
            return HubError(f"{what}: the file is not in {self.repo_id} at that commit (HTTP 404)")
        return HubError(f"{what} failed: HTTP {error.code} {message}")

    def _count(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_read += nbytes

    # --- calls

    def api_json(self, path: str, what: str) -> tuple[object, dict[str, str]]:
        """A JSON answer of the API, with its headers."""
        with self._open(path if "://" in path else f"{self.endpoint}{path}", what) as answer:
            body = answer.read(MAX_JSON_BYTES + 1)
            headers = dict(answer.headers.items())
        if len(body) > MAX_JSON_BYTES:
            raise HubError(f"{what}: an answer of more than {MAX_JSON_BYTES:,} bytes")
        try:
            return json.loads(body.decode("utf-8")), headers
        except (UnicodeDecodeError, ValueError) as error:
            raise HubError(f"{what}: the answer is not JSON ({error})") from None

    def commit(self) -> str:
        """The commit the revision names (GET /api/models/REPO/revision/REV, as huggingface_hub's model_info)."""
        revision = urllib.parse.quote(self.revision, safe="")
        info, _ = self.api_json(f"/api/models/{self.repo_id}/revision/{revision}", f"resolving {self.revision!r}")
        sha = info.get("sha") if isinstance(info, dict) else None
        if hf_commit(sha) is not None:
            raise HubError(f"resolving {self.revision!r}: the Hub's answer has no commit sha")
        return sha

    def top_files(self, commit: str) -> list[dict]:
        """The entries at the top of the repo at COMMIT (GET /api/models/REPO/tree/COMMIT), following pages."""
        url: str | None = f"{self.endpoint}/api/models/{self.repo_id}/tree/{commit}"
        entries: list[dict] = []
        while url:
            page, headers = self.api_json(url, f"listing {self.repo_id} at {commit}")
            if not isinstance(page, list):
                raise HubError(f"listing {self.repo_id} at {commit}: the answer is not a list")
            entries += [entry for entry in page if isinstance(entry, dict) and isinstance(entry.get("path"), str)]
            link = next((value for name, value in headers.items() if name.lower() == "link"), "")
            match = NEXT_LINK.search(link)
            url = urllib.parse.urljoin(url, match.group(1)) if match else None
        return entries

    def file(self, commit: str, path: str) -> bytes:
        """A small file of the repo at COMMIT."""
        url = f"{self.endpoint}/{self.repo_id}/resolve/{commit}/{urllib.parse.quote(path)}"
        with self._open(url, f"reading {path}") as answer:
            body = answer.read(MAX_JSON_BYTES + 1)
        if len(body) > MAX_JSON_BYTES:
            raise HubError(f"reading {path}: more than {MAX_JSON_BYTES:,} bytes, not a config file")
        return body

    def byte_range(self, commit: str, path: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of a file: a Range request, redirects followed with the Range resent.
        A server that ignores Range is read only as far as needed."""
        url = f"{self.endpoint}/{self.repo_id}/resolve/{commit}/{urllib.parse.quote(path)}"
        what = f"reading bytes {start}-{start + length - 1} of {path}"
        with self._open(url, what, {"Range": f"bytes={start}-{start + length - 1}"}) as answer:
            if answer.status == 206:
                content_range = answer.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise HubError(f"{what}: the server answered another range ({content_range!r})")
                data = answer.read(length)
            else:
                data = answer.read(start + length)[start:]
        self._count(len(data))
        if len(data) != length:
            raise HubError(
                f"{what}: the answer ended after {len(data)} bytes; the file is shorter than its header says"
            )
        return data


# ---------------------------------------------------------------------------------------------------------------


def read_headers(hub: Hub, commit: str, files: list[dict], scheme: str) -> tuple[ParameterCounts, set[str], list]:
    """Every weight file's header (8 bytes, then the header), counted: (parameters, dtypes, per-file facts)."""

    def one(item: dict) -> tuple[ParameterCounts, set[str], dict]:
        length = header_length(hub.byte_range(commit, item["path"], 0, HEADER_LENGTH_BYTES), item["path"])
        header = hub.byte_range(commit, item["path"], HEADER_LENGTH_BYTES, length)
        tensors = parse_header(header, item["path"], item["size"] or None)
        counts = count_parameters(tensors, scheme, item["path"])
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
    counts, dtypes, facts = read_headers(hub, commit, files, scheme)
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
            "by_dtype": dict(sorted(counts.by_dtype.items())),
            "scale_elements": counts.scale_elements,
            "scheme": scheme,
        },
        "files": facts,
        "bytes_read": hub.bytes_read,
    }
    return result, list(figures.warnings)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token": {"type": "str", "no_log": True},
            "kv_cache_dtype": {
                "type": "str",
                "default": "auto",
                "choices": [
                    "auto",
                    "bfloat16",
                    "float16",
                    "fp8",
                    "fp8_e4m3",
                    "fp8_e5m2",
                    "fp8_inc",
                    "fp8_ds_mla",
                    "nvfp4_ds_mla",
                ],
            },
            "timeout_s": {"type": "float", "default": 30},
        },
        supports_check_mode=True,
    )
    params = module.params
    token = params.get("token") or None

    def fail(msg: str) -> None:
        module.fail_json(msg=msg.replace(token, "********") if token else msg)

    repo_problem = hf_repo(params["repo_id"])
    if repo_problem:
        fail(f"repo_id={params['repo_id']!r} {repo_problem}")
    if not params["revision"]:
        fail("revision must be a branch, tag or 40-hex commit id, not empty")
    if urllib.parse.urlsplit(params["endpoint"]).scheme not in ("http", "https"):
        fail(f"endpoint={params['endpoint']!r}: must be an http:// or https:// URL, e.g. https://huggingface.co")
    if params["timeout_s"] <= 0:
        fail(f"timeout_s={params['timeout_s']}: must be a positive number of seconds")
    hub = Hub(params["endpoint"], params["repo_id"], params["revision"], token, params["timeout_s"])
    try:
        result, warnings = measure(hub, params["kv_cache_dtype"])
    except HubError as error:
        fail(str(error))
    except (FiguresError, HeaderError) as error:
        fail(f"{params['repo_id']}@{params['revision']}: {error}")
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
