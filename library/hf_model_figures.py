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
    NVFP4 C(U8) weights) count two parameters per byte and quantisation scales are not parameters.
  - The figures are those of the model vLLM loads. A multi-token-prediction (MTP) module in the checkpoint
    (DeepSeek-V3's layer 61 under C(num_nextn_predict_layers), Nemotron-H's and Qwen3.5's C(mtp.*) tensors), which
    vLLM builds only for MTP speculative decoding, is reported apart (RV(architecture.mtp_params_b)) and left out of
    the parameters and the bytes. Active parameters are the ones a decoded token reads - the routed experts it uses
    (k of E), shared experts and the output head whole, and the input embedding only when the output head is tied to
    it (a token reads one row of it otherwise). C(weight_bytes) is the sum of the weight files' sizes in the tree
    listing, less the MTP tensors' bytes.
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
    (vLLM 0.33's pages and blocks, module_utils/kv_cache_pages.py).
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
    - The recipe's architecture block (whole model, tensor parallel size 1). Recipes carry total_params_b,
      active_params_b, bytes_per_param, weight_bytes, attention_layers, kv_heads, head_dim, max_context and dtype
      (recipes/README.md); the MTP keys describe what the figures leave out, the others the attention kinds.
    - total_params_b - parameters of the main model, billions (MTP modules left out). active_params_b - parameters
      read per decoded token - all, less the (E - k) / E of the routed experts a token does not use and less the
      input embedding (one row of it is read) unless it is tied to the output head; the output head counts whole.
    - bytes_per_param - weight_bytes / total parameters. weight_bytes - sum of the loaded safetensors files' sizes,
      less the bytes of any MTP module's tensors. active_weight_bytes - the tensor bytes a decoded token reads, by
      the rule of active_params_b; a better numerator than active_params_b x bytes_per_param when experts and
      attention differ in precision.
    - mtp_layers - the checkpoint's multi-token-prediction depth (C(num_nextn_predict_layers), Qwen3.5's
      C(mtp_num_hidden_layers)), 0 without one. mtp_params_b, mtp_weight_bytes - that module's parameters (billions)
      and tensor bytes, which vLLM loads only with C(--speculative-config) method mtp.
    - attention_layers - layers with a KV cache (full plus sliding-window). kv_heads - KV heads per token and layer
      (1 for MLA). head_dim - elements per head (MLA - kv_lora_rank + qk_rope_head_dim). max_context - the longest
      max_model_len vLLM accepts. dtype - the dtype vLLM runs the model in with C(--dtype auto).
    - attention_kind - V(full) (K and V per KV head) or V(mla) (one latent vector). full_attention_layers,
      sliding_window_layers, sliding_window (tokens, or null).
    - full_attention_kv_heads, full_attention_head_dim - the full-attention layers' own KV heads and head size where
      the model gives them their own (Gemma 4's global layers), null otherwise.
    - kv_lora_rank, qk_rope_head_dim - MLA dimensions, null otherwise.
    - model_type - config.json's (a hybrid one makes the recipe declare its recurrent layers).
    - mamba_kind (V(mamba2), V(gated_delta_net) or null), mamba_layers, mamba_dims (config.json's figures that size
      one layer's state, and ssm_dtype, the SSM state's dtype or V(auto) for the model's; null without such layers).
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
    active_params_b: 0.000860336
    bytes_per_param: 1.1736
    weight_bytes: 1628632
    active_weight_bytes: 1143136
    mtp_layers: 0
    mtp_params_b: 0.0
    mtp_weight_bytes: 0
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
    model_type: gpt_oss
    mamba_kind:
    mamba_layers: 0
    mamba_dims:
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
    mtp_params_b: "none: vLLM's 'gpt_oss' model has no multi-token-prediction module to leave out"
parameters:
  description:
    - Exact counts behind the figures, all of the main model (MTP tensors left out) - total, active,
      routed_expert (in routed expert tensors), tensor_bytes and routed_expert_bytes (the headers' tensor sizes,
      scales included), input_embedding (the input embedding's parameters), tied_word_embeddings (whether the
      output head is the input embedding, as vLLM decides it), by_dtype (packed FP4 under its own label),
      scale_elements (quantisation scales, not counted as parameters), scheme (the weight layout rule used).
    - mtp, mtp_scale_elements, mtp_tensor_bytes - the same counts for the MTP module's tensors.
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

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hf_hub_api import Hub, HubError
from ansible.module_utils.hf_model_measure import input_problem, measure
from ansible.module_utils.model_config_figures import FiguresError
from ansible.module_utils.safetensors_header import HeaderError


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

    problem = input_problem(params)
    if problem:
        fail(problem)
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
