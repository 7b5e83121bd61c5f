"""library/hf_model_figures.py against the stand-in Hub (tests/standins/hf_hub) on loopback, in process.

The fixture repos (tests/fixtures/build_figure_models.py) have config.json files shaped like the real models' and
safetensors files with real headers over zeros. Every figure the module returns is checked against a value this
file computes from the fixture's config and tensor list with the rule written out here, not by calling the
module's own functions. The last tests check module_utils' KV rules on full-size configs against the per-token
figures worked out by hand from vLLM 0.33's source (see module_utils/model_config_figures.py for the lines).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, hf_standin
from model_config_figures import (
    FiguresError,
    attention_layout,
    full_attention_tokens_per_sequence,
    kv_bytes_per_token,
    mamba_state_bytes_per_layer,
    max_context,
    sliding_window_kv_bytes_per_token,
    sliding_window_tokens_per_sequence,
)
from safetensors_header import HeaderError, parse_header, weight_files

MODULE = "hf_model_figures"
WRONG_TOKEN = "hf_wrong_token_should_never_show_7c1d"


def _builder():
    path = ROOT / "tests" / "fixtures" / "build_figure_models.py"
    spec = importlib.util.spec_from_file_location("build_figure_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_figure_models"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


BUILD = _builder()


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


def parameters(model, packed: str | None) -> tuple[int, int]:
    """(total, in routed experts) of the top-level weight files: one per element; 2 per byte of a packed FP4 U8
    tensor (`_blocks` for MXFP4, `.weight` for NVFP4); scales not at all."""
    scales = {
        None: (),
        "mxfp4": ("_scales",),
        "nvfp4": (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale"),
    }[packed]
    total = routed = 0
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
            total += count
            routed += count if ".experts." in name else 0
    return total, routed


DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


def tensor_bytes(model) -> tuple[int, int]:
    """(bytes of every tensor of the top-level weight files, bytes of the routed experts' tensors), scales included."""
    total = routed = 0
    for tensors in model.shards.values():
        for name, dtype, shape in tensors:
            size = DTYPE_BYTES[dtype]
            for dim in shape:
                size *= dim
            total += size
            routed += size if ".experts." in name else 0
    return total, routed


def weight_bytes(root: Path, model) -> int:
    folder = root.joinpath(*model.repo_id.split("/"), model.commit)
    return sum((folder / name).stat().st_size for name in model.shards)


def no_extras() -> dict:
    return {
        "sliding_window": None,
        "sliding_window_layers": 0,
        "kv_lora_rank": None,
        "qk_rope_head_dim": None,
        "mamba_kind": None,
        "mamba_layers": 0,
        "mamba_state_bytes_per_sequence": 0,
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
        "mamba_state_bytes_per_sequence": mamba * (conv_state + ssm_state),
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
        "mamba_state_bytes_per_sequence": linear * (conv_state + recurrent),
        "kv_cache_dtype_auto": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "kv_bytes_per_token": 2 * attention * t["num_key_value_heads"] * t["head_dim"] * 2,
        "experts": (t["num_experts"], t["num_experts_per_tok"]),
    }


CASES = {
    "sparkfleet-test/llama-dense": (expected_llama, None),
    "sparkfleet-test/qwen3-moe": (expected_qwen3_moe, None),
    "sparkfleet-test/nemotron-h-nvfp4": (expected_nemotron_h, "nvfp4"),
    "sparkfleet-test/gpt-oss-mxfp4": (expected_gpt_oss, "mxfp4"),
    "sparkfleet-test/deepseek-v2-lite-mla": (expected_deepseek_mla, None),
    "sparkfleet-test/qwen3.5-moe-vl": (expected_qwen3_5, None),
}


@pytest.mark.parametrize("repo_id", list(CASES))
def test_every_figure_matches_the_config_and_the_headers(run_module, hub, repo_id):
    _, root, models = hub
    model = models[repo_id]
    expect, packed = CASES[repo_id]
    expected = expect(model.config)
    experts, top = expected.pop("experts")
    total, routed = parameters(model, packed)
    active = total - routed * (experts - top) // experts if experts else total
    all_bytes, expert_bytes = tensor_bytes(model)
    active_bytes = all_bytes - expert_bytes * (experts - top) // experts if experts else all_bytes
    size = weight_bytes(root, model)

    result = figures(run_module, hub, repo_id)

    assert not result.get("failed"), result.get("msg")
    assert result["commit"] == model.commit
    assert result["changed"] is False
    architecture = result["architecture"]
    assert result["parameters"]["total"] == total
    assert result["parameters"]["active"] == active
    assert result["parameters"]["routed_expert"] == routed
    assert architecture["total_params_b"] == pytest.approx(total / 1e9)
    assert architecture["active_params_b"] == pytest.approx(active / 1e9)
    assert architecture["weight_bytes"] == size
    assert architecture["active_weight_bytes"] == active_bytes
    assert result["parameters"]["tensor_bytes"] == all_bytes
    assert architecture["bytes_per_param"] == pytest.approx(size / total, abs=1e-4)
    for key, value in expected.items():
        assert architecture[key] == value, key
    assert set(architecture) == {
        *expected,
        "total_params_b",
        "active_params_b",
        "bytes_per_param",
        "weight_bytes",
        "active_weight_bytes",
    }
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


def test_tokens_held_per_sequence_follow_vllms_block_rules():
    # full attention: whole 16-token blocks up to max_model_len
    assert full_attention_tokens_per_sequence(131_072) == 131_072
    assert full_attention_tokens_per_sequence(1000) == 1008
    # sliding window 128, async scheduling (2 batches) of 2048 tokens: min(127 + 4096, L) -> 264 blocks, + 1
    assert sliding_window_tokens_per_sequence(128, 131_072, 2048, concurrent_batches=2) == 265 * 16
    # never more than max_model_len (plus the extra block)
    assert sliding_window_tokens_per_sequence(128, 1000, 2048) == (63 + 1) * 16


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
