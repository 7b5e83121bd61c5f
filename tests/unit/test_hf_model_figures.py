"""library/hf_model_figures.py against the stand-in Hub (tests/standins/hf_hub) on loopback, in process.

The fixture repos (tests/fixtures/build_figure_models.py) have config.json files shaped like the real models' and
safetensors files with real headers over zeros. Every figure the module returns is checked against a value this
file computes from the fixture's config and tensor list with the rule written out here, not by calling the
module's own functions. Five full-size checkpoints (Llama-3.3-70B, Qwen3-30B-A3B, Nemotron-3-Nano-30B-A3B,
gpt-oss-120b, DeepSeek-V3: real configs, every tensor's real name, shape and dtype, sparse files) are measured from a
folder and held to the parameter counts their makers publish. The last tests check module_utils' KV rules on
full-size configs against the per-token figures worked out by hand from vLLM 0.33's source (see
module_utils/model_config_figures.py for the lines).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import safetensors_header
from helpers import hf_standin, wait_until
from hf_model_measure import measure
from kv_cache_pages import mamba_state_bytes
from model_config_figures import (
    ROLE_INPUT_EMBEDDING,
    ROLE_MTP,
    FiguresError,
    active_parameters,
    attention_layout,
    embeddings_tied,
    kv_bytes_per_token,
    mamba_state_bytes_per_layer,
    max_context,
    sliding_window_kv_bytes_per_token,
    tensor_roles,
)
from safetensors_header import HeaderError, Tensor, parse_header, weight_files

MODULE = "hf_model_figures"
WRONG_TOKEN = "hf_wrong_token_should_never_show_7c1d"


BUILD = hf_standin.figure_builder()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict]]:
    """(stand-in URL, its root, the fixture models by repo id), built and started once for the module."""
    root = tmp_path_factory.mktemp("figures-hub")
    models = BUILD.build(root)
    with hf_standin.running_standin(root) as url:
        yield url, root, models


@pytest.fixture(autouse=True)
def fresh(hub, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Zeroed stats, LFS files served directly, and no proxy between the module and loopback."""
    url, root, _ = hub
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    hf_standin.set_lfs_redirect(root, None)
    hf_standin.reset(url)
    yield
    hf_standin.set_lfs_redirect(root, None)


def figures(run_module, hub, repo_id: str, **args) -> dict:
    url = hub[0]
    return run_module(MODULE, {"repo_id": repo_id, "endpoint": url, **args})


# --- what the figures must be, computed from each fixture's config and tensors ------------------------------------


# The input embedding's name in each fixture's checkpoint, and where an MTP module's tensors live (vLLM skips them:
# qwen3_5.py maps `mtp.` to None; deepseek_v2.py skips layers num_hidden_layers and up).
EMBEDDINGS = {"model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "backbone.embeddings.weight"}


def is_mtp(name: str, config: dict) -> bool:
    text = config.get("text_config", config)
    if name.startswith("mtp."):
        return True
    layers, extra = text.get("num_hidden_layers", 0), text.get("num_nextn_predict_layers", 0)
    return any(name.startswith(f"model.layers.{i}.") for i in range(layers, layers + extra))


def tied(model) -> bool:
    """The output head is the embedding: the config says so and the checkpoint has no lm_head of its own."""
    names = {name for tensors in model.shards.values() for name, _, _ in tensors}
    return bool(model.config.get("tie_word_embeddings")) and "lm_head.weight" not in names


def parameters(model, packed: str | None) -> dict[str, int]:
    """The parameters of the top-level weight files: one per element; 2 per byte of a packed FP4 U8 tensor
    (`_blocks` for MXFP4, `.weight` for NVFP4); scales not at all. `total` and `routed` (in routed experts) leave
    the MTP tensors out, `mtp` counts them, `embedding` is the input embedding's."""
    scales = {
        None: (),
        "mxfp4": ("_scales",),
        "nvfp4": (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale"),
    }[packed]
    counts = {"total": 0, "routed": 0, "mtp": 0, "embedding": 0}
    for tensors in model.shards.values():
        for name, dtype, shape in tensors:
            if scales and name.endswith(scales):
                continue
            count = 1
            for dim in shape:
                count *= dim
            if dtype == "U8" and packed == "mxfp4" and name.endswith("_blocks"):
                count *= 2
            if dtype == "U8" and packed == "nvfp4" and name.endswith(".weight"):
                count *= 2
            if is_mtp(name, model.config):
                counts["mtp"] += count
                continue
            counts["total"] += count
            counts["routed"] += count if ".experts." in name else 0
            counts["embedding"] += count if name in EMBEDDINGS else 0
    return counts


DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


def tensor_bytes(model) -> dict[str, int]:
    """Bytes of the tensors of the top-level weight files, scales included: `total` (MTP left out), `routed` (the
    routed experts'), `embedding` (the input embedding's), `mtp` (the MTP module's)."""
    counts = {"total": 0, "routed": 0, "mtp": 0, "embedding": 0}
    for tensors in model.shards.values():
        for name, dtype, shape in tensors:
            size = DTYPE_BYTES[dtype]
            for dim in shape:
                size *= dim
            if is_mtp(name, model.config):
                counts["mtp"] += size
                continue
            counts["total"] += size
            counts["routed"] += size if ".experts." in name else 0
            counts["embedding"] += size if name in EMBEDDINGS else 0
    return counts


def weight_bytes(root: Path, model) -> int:
    folder = root.joinpath(*model.repo_id.split("/"), model.commit)
    return sum((folder / name).stat().st_size for name in model.shards)


def no_extras() -> dict:
    return {
        "mtp_layers": 0,
        "sliding_window": None,
        "sliding_window_layers": 0,
        "kv_lora_rank": None,
        "qk_rope_head_dim": None,
        "mamba_kind": None,
        "mamba_layers": 0,
        "mamba_dims": None,
        "sliding_window_kv_bytes_per_token": 0,
    }


def expected_llama(c: dict) -> dict:
    head_dim = c["hidden_size"] // c["num_attention_heads"]  # no head_dim key in Llama 3.1's config
    layers, kv = c["num_hidden_layers"], c["num_key_value_heads"]
    return {
        **no_extras(),
        "attention_layers": layers,
        "full_attention_layers": layers,
        "kv_heads": kv,
        "head_dim": head_dim,
        "max_context": c["max_position_embeddings"],  # llama3 RoPE: already scaled
        "dtype": "bfloat16",
        "attention_kind": "full",
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": 2 * layers * kv * head_dim * 2,
        "experts": (None, None),
    }


def expected_qwen3_moe(c: dict) -> dict:
    layers, kv, head_dim = c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"]
    assert head_dim != c["hidden_size"] // c["num_attention_heads"]  # the fixture tells them apart
    return {
        **no_extras(),
        "attention_layers": layers,
        "full_attention_layers": layers,
        "kv_heads": kv,
        "head_dim": head_dim,
        "max_context": c["max_position_embeddings"],
        "dtype": "bfloat16",
        "attention_kind": "full",
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": 2 * layers * kv * head_dim * 2,
        "experts": (c["num_experts"], c["num_experts_per_tok"]),
    }


def expected_nemotron_h(c: dict) -> dict:
    pattern = c["hybrid_override_pattern"]
    attention, mamba = pattern.count("*"), pattern.count("M")
    kv, head_dim = c["num_key_value_heads"], c["head_dim"]
    conv_dim = c["mamba_num_heads"] * c["mamba_head_dim"] + 2 * c["n_groups"] * c["ssm_state_size"]
    conv_state = conv_dim * (c["conv_kernel"] - 1) * 2  # bfloat16, the model dtype
    ssm_state = c["mamba_num_heads"] * c["mamba_head_dim"] * c["ssm_state_size"] * 4  # float32, from the config
    return {
        **no_extras(),
        "attention_layers": attention,
        "full_attention_layers": attention,
        "kv_heads": kv,
        "head_dim": head_dim,
        "max_context": c["max_position_embeddings"],
        "dtype": "bfloat16",
        "attention_kind": "full",
        "mamba_kind": "mamba2",
        "mamba_layers": mamba,
        "mamba_dims": {
            **{key: c[key] for key in ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size")},
            "conv_kernel": c["conv_kernel"],
            "ssm_dtype": "float32",
        },
        "_mamba_state_bytes_per_layer": conv_state + ssm_state,
        # hf_quant_config.json says kv_cache_quant_algo FP8: vLLM's "auto" is then fp8_e4m3, one byte
        "kv_cache_dtype_auto": "fp8_e4m3",
        "kv_cache_dtype": "fp8_e4m3",
        "kv_bytes_per_token": 2 * attention * kv * head_dim * 1,
        "experts": (c["n_routed_experts"], c["num_experts_per_tok"]),
    }


def expected_gpt_oss(c: dict) -> dict:
    layers, kv, head_dim = c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"]
    sliding = len(range(0, layers, 2))  # vLLM: even layers slide
    per_layer = 2 * kv * head_dim * 2  # no dtype in the config: BF16 from the headers
    return {
        **no_extras(),
        "attention_layers": layers,
        "full_attention_layers": layers - sliding,
        "sliding_window": c["sliding_window"],
        "sliding_window_layers": sliding,
        "kv_heads": kv,
        "head_dim": head_dim,
        "max_context": c["max_position_embeddings"],  # yarn: already scaled
        "dtype": "bfloat16",
        "attention_kind": "full",
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": (layers - sliding) * per_layer,
        "sliding_window_kv_bytes_per_token": sliding * per_layer,
        "experts": (c["num_local_experts"], c["num_experts_per_tok"]),
    }


def expected_deepseek_mla(c: dict) -> dict:
    layers, rank, rope = c["num_hidden_layers"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    return {
        **no_extras(),
        "attention_layers": layers,
        "full_attention_layers": layers,
        "kv_heads": 1,
        "head_dim": rank + rope,
        "kv_lora_rank": rank,
        "qk_rope_head_dim": rope,
        "max_context": c["max_position_embeddings"],
        "dtype": "bfloat16",
        "attention_kind": "mla",
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": layers * (rank + rope) * 2,  # one latent vector, no factor 2
        "experts": (c["n_routed_experts"], c["num_experts_per_tok"]),
    }


def expected_qwen3_5(c: dict) -> dict:
    t = c["text_config"]
    attention, linear = t["layer_types"].count("full_attention"), t["layer_types"].count("linear_attention")
    conv_dim = 2 * t["linear_num_key_heads"] * t["linear_key_head_dim"] + (
        t["linear_num_value_heads"] * t["linear_value_head_dim"]
    )
    conv_state = conv_dim * (t["linear_conv_kernel_dim"] - 1) * 2
    recurrent = t["linear_num_value_heads"] * t["linear_value_head_dim"] * t["linear_key_head_dim"] * 2
    return {
        **no_extras(),
        "attention_layers": attention,
        "full_attention_layers": attention,
        "kv_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"],
        "max_context": t["max_position_embeddings"],
        "dtype": t["dtype"],  # the top level names none
        "attention_kind": "full",
        "mamba_kind": "gated_delta_net",
        "mamba_layers": linear,
        "mamba_dims": {
            key: t[key]
            for key in (
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
            )
        }
        | {"ssm_dtype": "auto"},
        "_mamba_state_bytes_per_layer": conv_state + recurrent,
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": 2 * attention * t["num_key_value_heads"] * t["head_dim"] * 2,
        "mtp_layers": t["mtp_num_hidden_layers"],
        "experts": (t["num_experts"], t["num_experts_per_tok"]),
    }


def expected_qwen3_dense(c: dict) -> dict:
    layers, kv, head_dim = c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"]
    return {
        **no_extras(),
        "attention_layers": layers,
        "full_attention_layers": layers,
        "kv_heads": kv,
        "head_dim": head_dim,
        "max_context": c["max_position_embeddings"],
        "dtype": "bfloat16",
        "attention_kind": "full",
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": 2 * layers * kv * head_dim * 2,
        "experts": (None, None),
    }


CASES = {
    "sparkfleet-test/llama-dense": (expected_llama, None),
    "sparkfleet-test/qwen3-moe": (expected_qwen3_moe, None),
    "sparkfleet-test/nemotron-h-nvfp4": (expected_nemotron_h, "nvfp4"),
    "sparkfleet-test/gpt-oss-mxfp4": (expected_gpt_oss, "mxfp4"),
    "sparkfleet-test/deepseek-v2-lite-mla": (expected_deepseek_mla, None),
    "sparkfleet-test/qwen3.5-moe-vl": (expected_qwen3_5, None),
    "sparkfleet-test/qwen3-dense-tied": (expected_qwen3_dense, None),
}


@pytest.mark.parametrize("repo_id", list(CASES))
def test_every_figure_matches_the_config_and_the_headers(run_module, hub, repo_id):
    _, root, models = hub
    model = models[repo_id]
    expect, packed = CASES[repo_id]
    expected = expect(model.config)
    experts, top = expected.pop("experts")
    state_bytes = expected.pop("_mamba_state_bytes_per_layer", 0)
    counted, sizes = parameters(model, packed), tensor_bytes(model)
    total, routed = counted["total"], counted["routed"]
    # Read per decoded token: k of E routed experts, and not the input embedding (one row of it) unless it is tied
    # to the output head.
    embedding, embedding_bytes = (0, 0) if tied(model) else (counted["embedding"], sizes["embedding"])
    active = total - (routed * (experts - top) // experts if experts else 0) - embedding
    active_bytes = sizes["total"] - (sizes["routed"] * (experts - top) // experts if experts else 0) - embedding_bytes
    size = weight_bytes(root, model) - sizes["mtp"]  # the files, less the MTP tensors vLLM does not load

    result = figures(run_module, hub, repo_id)

    assert not result.get("failed"), result.get("msg")
    assert result["commit"] == model.commit
    assert result["changed"] is False
    architecture = result["architecture"]
    assert counted["embedding"] > 0
    assert result["parameters"]["total"] == total
    assert result["parameters"]["active"] == active
    assert result["parameters"]["routed_expert"] == routed
    assert result["parameters"]["input_embedding"] == counted["embedding"]
    assert result["parameters"]["tied_word_embeddings"] is tied(model)
    assert result["parameters"]["mtp"] == counted["mtp"]
    assert architecture["total_params_b"] == pytest.approx(total / 1e9)
    assert architecture["active_params_b"] == pytest.approx(active / 1e9)
    assert architecture["weight_bytes"] == size
    assert architecture["active_weight_bytes"] == active_bytes
    assert architecture["mtp_params_b"] == pytest.approx(counted["mtp"] / 1e9)
    assert architecture["mtp_weight_bytes"] == sizes["mtp"]
    assert result["parameters"]["tensor_bytes"] == sizes["total"]
    assert architecture["bytes_per_param"] == pytest.approx(size / total, abs=1e-4)
    for key, value in expected.items():
        assert architecture[key] == value, key
    # the Mamba dims as kv_cache_pages sizes a state: the config's conv and SSM state, from the dims alone
    dims = architecture["mamba_dims"]
    assert (dims and mamba_state_bytes(architecture["mamba_kind"], dims, architecture["dtype"])) == (
        state_bytes or None
    )
    text_config = model.config.get("text_config") or model.config
    assert architecture["model_type"] == text_config["model_type"]
    assert architecture["attention_heads"] == text_config["num_attention_heads"]
    assert set(architecture) == {
        *expected,
        "model_type",
        "attention_heads",
        "total_params_b",
        "active_params_b",
        "bytes_per_param",
        "weight_bytes",
        "active_weight_bytes",
        "mtp_params_b",
        "mtp_weight_bytes",
        "full_attention_kv_heads",
        "full_attention_head_dim",
    }
    # Only Gemma 4 gives its full-attention layers heads of their own (test_gemma4_layout.py).
    assert (architecture["full_attention_kv_heads"], architecture["full_attention_head_dim"]) == (None, None)
    # Every figure says where it came from.
    missing = [key for key, value in architecture.items() if value is not None and key not in result["sources"]]
    assert missing == [], missing


def test_sources_name_the_file_and_key(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/qwen3.5-moe-vl")
    sources = result["sources"]
    assert sources["kv_heads"] == "config.json:text_config.num_key_value_heads"
    assert sources["head_dim"] == "config.json:text_config.head_dim"
    assert sources["dtype"] == "config.json:text_config.dtype"
    assert sources["max_context"] == "config.json:text_config.max_position_embeddings"
    assert sources["attention_layers"].startswith("config.json:text_config.layer_types")
    nemotron = figures(run_module, hub, "sparkfleet-test/nemotron-h-nvfp4")["sources"]
    assert nemotron["kv_cache_dtype_auto"].startswith("hf_quant_config.json:quantization.kv_cache_quant_algo")
    assert nemotron["attention_layers"].startswith("config.json:hybrid_override_pattern")
    llama = figures(run_module, hub, "sparkfleet-test/llama-dense")["sources"]
    assert llama["head_dim"].startswith("config.json:hidden_size / config.json:num_attention_heads")


def header_span(root: Path, model, name: str) -> int:
    """8 + the header length of one fixture file: the bytes a header-only read takes."""
    path = root.joinpath(*model.repo_id.split("/"), model.commit, name)
    with path.open("rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


def test_only_the_headers_of_the_loaded_weight_files_are_read(run_module, hub):
    url, root, models = hub
    model = models["sparkfleet-test/gpt-oss-mxfp4"]

    result = figures(run_module, hub, model.repo_id)

    # The stand-in counts a response's bytes once its handler has written them all, which can be after the client
    # has read them: wait for the count to reach what the module read, then hold it to the exact figures.
    wait_until(
        lambda: hf_standin.stats(url)["bytes_served_total"] >= result["bytes_read"],
        "the stand-in Hub counting the bytes it served",
        seconds=60,
    )
    stats = hf_standin.stats(url)
    served = stats["bytes_served"]
    for name in model.shards:
        assert served[f"{model.repo_id}/{name}"] == header_span(root, model, name), name
    assert f"{model.repo_id}/original/model.safetensors" not in served  # vLLM does not load original/
    assert stats["range_requests"] == 2 * len(model.shards)
    assert result["bytes_read"] == sum(header_span(root, model, name) for name in model.shards)
    assert [item["path"] for item in result["files"]] == sorted(model.shards)


def test_the_hub_redirect_is_followed_with_the_range_and_without_the_token(run_module, hub):
    url, root, models = hub
    model = models["sparkfleet-test/llama-dense-private"]
    hf_standin.set_lfs_redirect(root, url.replace("127.0.0.1", "localhost"))  # another host: the "CDN"

    result = figures(run_module, hub, model.repo_id, token=BUILD.PRIVATE_TOKEN)

    assert not result.get("failed"), result.get("msg")
    assert result["architecture"]["kv_bytes_per_token"] == expected_llama(model.config)["kv_bytes_per_token"]
    stats = hf_standin.stats(url)
    assert stats["redirects"] == 2 * len(model.shards)
    assert stats["cdn_requests"] == 2 * len(model.shards)
    assert stats["cdn_requests_with_authorization"] == 0
    for name in model.shards:
        assert stats["bytes_served"][f"{model.repo_id}/{name}"] == header_span(root, model, name)


@pytest.mark.parametrize("revision", ["release", "main"])
def test_a_branch_revision_resolves_to_its_commit(run_module, hub, revision):
    model = hub[2]["sparkfleet-test/deepseek-v2-lite-mla"]
    result = figures(run_module, hub, model.repo_id, revision=revision)
    assert result["commit"] == model.commit
    again = figures(run_module, hub, model.repo_id, revision=model.commit)
    assert again["commit"] == model.commit
    assert again["architecture"] == result["architecture"]


def test_check_mode_measures_the_same_and_changes_nothing(run_module, hub):
    checked = run_module(MODULE, {"repo_id": "sparkfleet-test/qwen3-moe", "endpoint": hub[0]}, check_mode=True)
    real = figures(run_module, hub, "sparkfleet-test/qwen3-moe")
    assert checked["changed"] is False and real["changed"] is False
    assert checked["architecture"] == real["architecture"]


def test_an_unknown_model_type_fails_naming_the_key_before_any_weight_is_read(run_module, hub):
    url = hub[0]
    result = figures(run_module, hub, "sparkfleet-test/unknown-arch")
    assert result["failed"]
    assert "config.json:model_type='mystery_lm'" in result["msg"]
    assert "no rule" in result["msg"]
    served = hf_standin.stats(url)["bytes_served"]
    assert not [key for key in served if key.endswith(".safetensors")]


def test_a_layer_type_without_a_rule_fails_naming_it(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/odd-layer-types")
    assert result["failed"]
    assert "config.json:layer_types[1]='chunked_attention'" in result["msg"]


def test_a_wrong_token_fails_clearly_without_showing_it(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/llama-dense-private", token=WRONG_TOKEN)
    assert result["failed"]
    assert "refused the token" in result["msg"] and "401" in result["msg"]
    assert WRONG_TOKEN not in json.dumps(result)


def test_a_private_repository_without_a_token_is_named(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/llama-dense-private")
    assert result["failed"]
    assert "sparkfleet-test/llama-dense-private was not found" in result["msg"]
    assert "no token was given" in result["msg"]


def test_a_missing_revision_is_named(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/llama-dense", revision="no-such-branch")
    assert result["failed"]
    assert "revision 'no-such-branch' does not exist" in result["msg"]


@pytest.mark.parametrize(
    ("repo_id", "kv_cache_dtype", "per_token"),
    [
        # 2 K/V x 4 layers x 2 KV heads x 32 dims x 1 byte
        ("sparkfleet-test/llama-dense", "fp8", 2 * 4 * 2 * 32 * 1),
        # an explicit bfloat16 overrides the checkpoint's FP8 wish: 2 x 2 layers x 2 heads x 64 dims x 2 bytes
        ("sparkfleet-test/nemotron-h-nvfp4", "bfloat16", 2 * 2 * 2 * 64 * 2),
        # fp8_ds_mla: an opaque 656-byte blob per token and layer (vLLM mla_attention.py)
        ("sparkfleet-test/deepseek-v2-lite-mla", "fp8_ds_mla", 3 * 656),
    ],
)
def test_an_explicit_kv_cache_dtype_sizes_the_cache(run_module, hub, repo_id, kv_cache_dtype, per_token):
    result = figures(run_module, hub, repo_id, kv_cache_dtype=kv_cache_dtype)
    assert result["architecture"]["kv_cache_dtype"] == kv_cache_dtype
    assert result["architecture"]["kv_bytes_per_token"] == per_token


def test_an_mla_only_kv_dtype_on_a_gqa_model_fails(run_module, hub):
    result = figures(run_module, hub, "sparkfleet-test/llama-dense", kv_cache_dtype="fp8_ds_mla")
    assert result["failed"]
    assert "multi-head latent attention models only" in result["msg"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"repo_id": "not-a-repo"}, "repo_id='not-a-repo' is not a Hugging Face repo id ORG/NAME"),
        ({"repo_id": "a/b", "endpoint": "ftp://example.invalid"}, "must be an http:// or https:// URL"),
        ({"repo_id": "a/b", "kv_cache_dtype": "half"}, "kv_cache_dtype"),
    ],
)
def test_bad_input_is_named(run_module, args, words):
    result = run_module(MODULE, args)
    assert result["failed"]
    assert words in result["msg"]


# --- full-size checkpoints against the figures their makers publish ------------------------------------------------


class FolderHub:
    """What hf_model_measure.measure asks of hf_hub_api.Hub, answered from a snapshot folder that
    build_figure_models.write_model wrote: the tree listing gives each file's size from os.stat (which counts the
    sparse data region, as the Hub's listing counts the real one), byte_range reads the header bytes. The stand-in
    Hub would hash every byte of the 685 GB DeepSeek-V3 shape; this reads its 10 MB of headers."""

    def __init__(self, folder: Path, repo_id: str, commit: str):
        self.folder, self.repo_id, self.sha, self.bytes_read = folder, repo_id, commit, 0

    def commit(self) -> str:
        return self.sha

    def top_files(self, commit: str) -> list[dict]:
        return [
            {"type": "file", "path": path.name, "size": path.stat().st_size}
            for path in sorted(self.folder.iterdir())
            if path.is_file()
        ]

    def file(self, commit: str, path: str) -> bytes:
        return (self.folder / path).read_bytes()

    def byte_range(self, commit: str, path: str, start: int, length: int) -> bytes:
        with (self.folder / path).open("rb") as handle:
            handle.seek(start)
            data = handle.read(length)
        self.bytes_read += len(data)
        return data


@pytest.fixture(scope="module")
def full_size(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, object, int]]:
    """{repo_id: (hf_model_measure.measure's result, the Model, the files' summed size)} for the five full-size
    shapes, written as sparse files (about 26 MB on disk for 950 GB of checkpoints) and measured once."""
    root = tmp_path_factory.mktemp("full-size")
    measured = {}
    for model in BUILD.full_size_models():
        folder = BUILD.write_model(root, model) / model.commit
        result, warnings = measure(FolderHub(folder, model.repo_id, model.commit), "auto")
        assert warnings == [], warnings
        files = sum((folder / name).stat().st_size for name in model.shards)
        measured[model.repo_id] = (result, model, files)
    return measured


# What each maker publishes. active_params_b leaves the input embedding out (a token reads one row of it; none of
# these ties it to the output head) and counts the output head; a maker's "active" that counts the embedding is
# compared with active_params_b plus the embedding:
# - Llama-3.3-70B-Instruct: 70.6B, dense (Hugging Face's model page, "Model size 70.6B params": its safetensors
#   metadata, api/models/meta-llama/Llama-3.3-70B-Instruct?expand=safetensors, 70,553,706,496 BF16 parameters).
#   A dense card's active is its total: the input embedding counted.
# - Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated", "Number of Paramaters
#   (Non-Embedding): 29.9B" (huggingface.co/Qwen/Qwen3-30B-A3B model card). 30.5B - 29.9B is the input embedding
#   and the output head, 0.3B each, so the 3.3B counts the input embedding (without it: about 3.0B).
# - NVIDIA-Nemotron-3-Nano-30B-A3B: "31.6B total parameters out of which 3.2B are active (3.6B including
#   embeddings)" (the Nemotron 3 Nano technical report, arXiv 2512.20848, and the Base model's card).
# - gpt-oss-120b: 116.83B total, 5.13B active; "Unembedding parameters are counted towards active, but not
#   embeddings" (gpt-oss-120b & gpt-oss-20b model card, arXiv 2508.10925, Table 1).
# - DeepSeek-V3: "671B total parameters with 37B activated for each token" (DeepSeek-V3 technical report, arXiv
#   2412.19437); "The total size of DeepSeek-V3 models on Hugging Face is 685B, which includes 671B of the Main Model
#   weights and 14B of the Multi-Token Prediction (MTP) Module weights" (its README.md); README_WEIGHTS.md: main
#   model "Activation parameters: 36.6B (including 0.9B for the output Head)", MTP "11.5B unique parameters
#   (excluding the shared 0.9B Embedding and 0.9B output Head)".
PUBLISHED = {
    # repo: (total B, active B without the input embedding, active B with it); None where not published
    "meta-llama/Llama-3.3-70B-Instruct": (70.6, None, 70.6),
    "Qwen/Qwen3-30B-A3B": (30.5, None, 3.3),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (31.6, 3.2, 3.6),
    "openai/gpt-oss-120b": (116.83, 5.13, None),
    "deepseek-ai/DeepSeek-V3": (671.0, 37.0, None),
}


# (routed experts E, experts per token k) of each full-size config.json; None for the dense one.
EXPERTS = {
    "meta-llama/Llama-3.3-70B-Instruct": None,
    "Qwen/Qwen3-30B-A3B": (128, 8),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (128, 6),
    "openai/gpt-oss-120b": (128, 4),
    "deepseek-ai/DeepSeek-V3": (256, 8),
}


@pytest.mark.parametrize("repo_id", list(PUBLISHED))
def test_full_size_parameters_match_the_published_figures(full_size, repo_id):
    result, _, _ = full_size[repo_id]
    architecture, counts = result["architecture"], result["parameters"]
    total, active, active_with_embedding = PUBLISHED[repo_id]
    assert architecture["total_params_b"] == pytest.approx(total, rel=0.015)
    embedding_b = counts["input_embedding"] / 1e9
    assert embedding_b > 0.3  # each has an untied input embedding of vocab_size x hidden_size
    assert counts["tied_word_embeddings"] is False
    if active is not None:
        assert architecture["active_params_b"] == pytest.approx(active, rel=0.05)
    if active_with_embedding is not None:
        assert architecture["active_params_b"] + embedding_b == pytest.approx(active_with_embedding, rel=0.05)
    # The rule exactly: the total, less the routed experts a token does not use, less the input embedding.
    unused = 0
    if EXPERTS[repo_id]:
        count, top = EXPERTS[repo_id]
        unused = counts["routed_expert"] * (count - top) // count
    else:
        assert counts["routed_expert"] == 0
    assert counts["active"] == counts["total"] - unused - counts["input_embedding"]


def test_full_size_exact_counts_match_the_published_headers(full_size):
    """Where a checkpoint's exact parameter count is published, the headers built here hold exactly that many."""
    llama = full_size["meta-llama/Llama-3.3-70B-Instruct"][0]["parameters"]
    assert llama["total"] == 70_553_706_496  # Hugging Face safetensors metadata (see PUBLISHED)
    qwen = full_size["Qwen/Qwen3-30B-A3B"][0]["parameters"]
    assert qwen["total"] == 30_532_122_624  # a public header dump of Qwen3-Coder-30B-A3B-Instruct, the same shapes
    # DeepSeek-V3(-0324)'s safetensors metadata on the Hub, and a public header dump of DeepSeek-R1 (same layout):
    # 684,531,386,000 elements in 91,991 tensors, FP8 block scales and the MTP module included.
    deepseek, model, _ = full_size["deepseek-ai/DeepSeek-V3"]
    counts = deepseek["parameters"]
    assert sum(len(tensors) for tensors in model.shards.values()) == 91_991
    everything = counts["total"] + counts["scale_elements"] + counts["mtp"] + counts["mtp_scale_elements"]
    assert everything == 684_531_386_000
    gpt_oss = full_size["openai/gpt-oss-120b"][0]["parameters"]
    assert gpt_oss["total"] == pytest.approx(116.83e9, rel=5e-5)  # the model card's 116.83B, to its last digit


def test_deepseek_v3_mtp_module_is_reported_apart(full_size):
    result, model, files = full_size["deepseek-ai/DeepSeek-V3"]
    architecture, counts = result["architecture"], result["parameters"]
    assert architecture["mtp_layers"] == 1
    # DeepSeek: 14B of MTP module weights; 11.5B of them its own, besides copies of the 0.9B embedding and head.
    assert architecture["mtp_params_b"] == pytest.approx(14.0, rel=0.05)
    own_copies = 2 * model.config["vocab_size"] * model.config["hidden_size"]  # layer 61's embed_tokens, shared_head
    assert (counts["mtp"] - own_copies) / 1e9 == pytest.approx(11.5, rel=0.015)
    assert architecture["total_params_b"] + architecture["mtp_params_b"] == pytest.approx(685.0, rel=0.015)
    # The main model's active figure: README_WEIGHTS.md's 36.6B, output head included.
    assert architecture["active_params_b"] == pytest.approx(36.6, rel=0.01)
    # Bytes: the files, less the MTP tensors; the MTP tensors are layer 61's.
    mtp_bytes = sum(
        DTYPE_BYTES[dtype] * math.prod(shape)
        for tensors in model.shards.values()
        for name, dtype, shape in tensors
        if name.startswith("model.layers.61.")
    )
    assert architecture["mtp_weight_bytes"] == mtp_bytes == counts["mtp_tensor_bytes"]
    assert architecture["weight_bytes"] == files - mtp_bytes
    assert architecture["bytes_per_param"] == pytest.approx(architecture["weight_bytes"] / counts["total"], abs=1e-4)
    assert "MTP tensors" in result["sources"]["weight_bytes"]
    # The KV cache is the main model's 61 layers, not the MTP layer's.
    assert architecture["attention_layers"] == 61


@pytest.mark.parametrize("repo_id", [repo for repo in PUBLISHED if repo != "deepseek-ai/DeepSeek-V3"])
def test_full_size_checkpoints_without_mtp_report_none(full_size, repo_id):
    result, _, files = full_size[repo_id]
    architecture = result["architecture"]
    assert (architecture["mtp_layers"], architecture["mtp_params_b"], architecture["mtp_weight_bytes"]) == (0, 0, 0)
    assert architecture["weight_bytes"] == files


# --- which tensors are the input embedding and which an MTP module's (vLLM 0.33's loaders) -------------------------


def tensor(name: str, shape: tuple[int, ...] = (8, 4)) -> Tensor:
    return Tensor(name, "BF16", shape, 2 * math.prod(shape))


@pytest.mark.parametrize(
    ("config", "names", "mtp"),
    [
        # deepseek_v2.py / glm4_moe_lite.py: layers num_hidden_layers .. + num_nextn_predict_layers - 1, under the
        # three prefixes of models/utils.py get_spec_layer_idx_from_weight_name
        (
            {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_nextn_predict_layers": 1},
            [
                "model.layers.61.eh_proj.weight",
                "layers.61.enorm.weight",
                "model.language_model.layers.61.mlp.experts.0.up_proj.weight",
                "model.layers.60.mlp.experts.0.up_proj.weight",
                "model.layers.62.enorm.weight",
                "model.layers.6.enorm.weight",
            ],
            [True, True, True, False, False, False],
        ),
        # without num_nextn_predict_layers nothing is an MTP tensor
        ({"model_type": "deepseek_v3", "num_hidden_layers": 61}, ["model.layers.61.eh_proj.weight"], [False]),
        # nemotron_h.py: hf_to_vllm_mapper drops every name that starts with "mtp"
        (
            {"model_type": "nemotron_h", "num_nextn_predict_layers": 1},
            [
                "mtp.layers.0.mixer.q_proj.weight",
                "mtp.layers.1.mixer.experts.0.up_proj.weight",
                "backbone.norm_f.weight",
            ],
            [True, True, False],
        ),
        # qwen3_5.py: "mtp." is dropped, in the text model and the multimodal one alike
        (
            {"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text", "num_attention_heads": 4}},
            [
                "mtp.fc.weight",
                "mtp.layers.0.mlp.experts.3.up_proj.weight",
                "model.language_model.layers.0.mlp.gate.weight",
            ],
            [True, True, False],
        ),
        # a model whose vLLM class has no MTP rule keeps every tensor
        ({"model_type": "llama", "num_hidden_layers": 2}, ["model.layers.2.mlp.up_proj.weight"], [False]),
    ],
)
def test_mtp_tensors_are_the_ones_vllm_leaves_out(config, names, mtp):
    roles = tensor_roles(config)
    assert [roles.role(tensor(name)) == ROLE_MTP for name in names] == mtp


def test_the_input_embedding_is_the_vocab_sized_embedding_table():
    roles = tensor_roles({"model_type": "nemotron_h", "vocab_size": 8})
    assert roles.role(tensor("backbone.embeddings.weight")) == ROLE_INPUT_EMBEDDING
    assert roles.role(tensor("model.embed_tokens.weight")) == ROLE_INPUT_EMBEDDING
    assert roles.role(tensor("model.embed_tokens.weight", (16, 4))) is None  # not vocab_size rows
    assert roles.role(tensor("model.visual.pos_embed.weight")) is None
    assert roles.role(tensor("lm_head.weight")) is None
    # the role names are the ones safetensors_header.count_parameters acts on
    assert (ROLE_INPUT_EMBEDDING, ROLE_MTP) == (safetensors_header.INPUT_EMBEDDING, safetensors_header.MTP)


@pytest.mark.parametrize(
    ("tie", "heads", "expected"),
    [
        (False, ["lm_head.weight"], False),
        (True, [], True),  # Qwen3-0.6B: the output head is the embedding table
        (True, ["lm_head.weight"], False),  # vLLM loads the checkpoint's own head (maybe_untie_word_embeddings)
        (None, [], True),  # the config does not say; without a head of its own the model can only run tied
        (None, ["lm_head.weight"], False),
    ],
)
def test_tied_embeddings_as_vllm_decides(tie, heads, expected):
    config = {"model_type": "llama"} | ({} if tie is None else {"tie_word_embeddings": tie})
    assert embeddings_tied(tensor_roles(config), heads)[0] is expected


def test_a_tied_checkpoint_counts_its_embedding_as_active():
    assert active_parameters(1000, 0, {"model_type": "llama"}, input_embedding=300, tied=True)[0] == 1000
    assert active_parameters(1000, 0, {"model_type": "llama"}, input_embedding=300, tied=False)[0] == 700


# --- module_utils' KV rules on full-size configs (values from the research notes' hand arithmetic) ---------------


def full_size_configs() -> dict[str, dict]:
    """The figures of real config.json files that the KV rules read (public copies; see the research notes)."""
    return {
        "Llama-3.1-8B": {
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
        },
        "Qwen3-30B-A3B": {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "use_sliding_window": False,
            "sliding_window": None,
        },
        "gpt-oss-120b": {
            "model_type": "gpt_oss",
            "num_hidden_layers": 36,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
        },
        "Nemotron-3-Nano-30B-A3B": {
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "mamba_num_heads": 64,
            "mamba_head_dim": 64,
            "n_groups": 8,
            "ssm_state_size": 128,
            "conv_kernel": 4,
            "mamba_ssm_cache_dtype": "float32",
        },
        "DeepSeek-V2-Lite": {
            "model_type": "deepseek_v2",
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        },
    }


@pytest.mark.parametrize(
    ("name", "full_bytes", "sliding_bytes"),
    [
        ("Llama-3.1-8B", 131_072, 0),  # 2 x 32 layers x 8 heads x 128 x 2 bytes
        ("Qwen3-30B-A3B", 98_304, 0),  # 2 x 48 x 4 x 128 x 2
        ("gpt-oss-120b", 36_864, 36_864),  # 18 full + 18 sliding layers, each 2 x 8 x 64 x 2
        ("Nemotron-3-Nano-30B-A3B", 6_144, 0),  # 6 '*' layers x 2 x 2 x 128 x 2
        ("DeepSeek-V2-Lite", 31_104, 0),  # 27 x (512 + 64) x 2, no factor 2
    ],
)
def test_kv_bytes_per_token_of_real_configs(name, full_bytes, sliding_bytes):
    layout = attention_layout(full_size_configs()[name])
    assert kv_bytes_per_token(layout, "bfloat16") == full_bytes
    assert sliding_window_kv_bytes_per_token(layout, "bfloat16") == sliding_bytes


def test_mamba2_state_of_nemotron_3_nano_per_sequence():
    layout = attention_layout(full_size_configs()["Nemotron-3-Nano-30B-A3B"])
    # conv (64 x 64 + 2 x 8 x 128) x 3 x 2 bytes + SSM 64 x 64 x 128 x 4 bytes
    assert mamba_state_bytes_per_layer(layout, "bfloat16") == 2_134_016
    assert layout.mamba_layers == 23


def test_tensor_parallel_splits_gqa_heads_but_not_the_mla_latent():
    llama = attention_layout(full_size_configs()["Llama-3.1-8B"])
    mla = attention_layout(full_size_configs()["DeepSeek-V2-Lite"])
    assert kv_bytes_per_token(llama, "bfloat16", tp=2) == 65_536
    assert kv_bytes_per_token(llama, "bfloat16", tp=16) == 32 * 2 * 1 * 128 * 2  # fewer heads than ranks: one each
    assert kv_bytes_per_token(mla, "bfloat16", tp=2) == 31_104


def test_a_qwen_sliding_window_in_use_is_refused():
    config = {**full_size_configs()["Qwen3-30B-A3B"], "use_sliding_window": True, "sliding_window": 4096}
    with pytest.raises(FiguresError, match="use_sliding_window"):
        attention_layout(config)


def test_a_missing_head_dim_with_a_class_default_is_not_guessed():
    config = dict(full_size_configs()["Qwen3-30B-A3B"])
    del config["head_dim"]
    with pytest.raises(FiguresError, match=r"config.json:head_dim is missing"):
        attention_layout(config)


def header(entries: dict) -> bytes:
    return json.dumps(entries).encode()


@pytest.mark.parametrize(
    ("entries", "file_size", "words"),
    [
        ({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 3]}}, None, "takes 4 bytes"),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, None, "unknown dtype"),
        (
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
            },
            None,
            "a hole or overlap",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 100, "but the file has 100"),
    ],
)
def test_a_bad_header_is_refused_naming_what_is_wrong(entries, file_size, words):
    with pytest.raises(HeaderError, match=words):
        parse_header(header(entries), "model.safetensors", file_size)


@pytest.mark.parametrize(
    ("rope", "expected"),
    [
        ({"type": "linear", "factor": 4.0}, 16_384),  # vLLM multiplies by the factor of a RoPE type that does not
        ({"rope_type": "dynamic", "factor": 2.0}, 8_192),  # scale max_position_embeddings itself
        ({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 128}, 4_096),  # already scaled
        (None, 4_096),
    ],
)
def test_max_context_applies_the_rope_factor_as_vllm_does(rope, expected):
    config = {"model_type": "llama", "max_position_embeddings": 4096, "rope_scaling": rope}
    assert max_context(config)[0] == expected


def test_max_context_missing_is_named_not_assumed():
    with pytest.raises(FiguresError, match="max_position_embeddings is missing"):
        max_context({"model_type": "llama"})


def test_weight_files_are_the_top_level_ones_the_index_names():
    tree = [
        {"type": "file", "path": "model-00001-of-00002.safetensors", "size": 10},
        {"type": "file", "path": "model-00002-of-00002.safetensors", "size": 20},
        {"type": "file", "path": "consolidated.safetensors", "size": 30},
        {"type": "file", "path": "original/model.safetensors", "size": 40},
        {"type": "directory", "path": "original", "size": 0},
    ]
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    assert [f["path"] for f in weight_files(tree, index)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert len(weight_files(tree, None)) == 3
    with pytest.raises(ValueError, match=r"model-00003-of-00003\.safetensors"):
        weight_files(tree, {"weight_map": {"c": "model-00003-of-00003.safetensors"}})
