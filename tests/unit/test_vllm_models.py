"""library/vllm_models.py and module_utils/served_models.py: every model of a host resolved once, in preflight, into
what the roles read (fact vllm_server_resolved): names, paths, URLs, the command line and the host's memory plan."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT
from recipe_rules import container_env, serve_args
from served_models import LOOPBACK_ENV, endpoint_url, is_loopback, unit_slug, url_host
from vllm_flags import load_flag_list

RECIPES_DIR = ROOT / "recipes"
SPARK_MEM_TOTAL = 127_601_400 * 1024
QWEN_REVISION = yaml.safe_load((RECIPES_DIR / "qwen3-0.6b.yml").read_text())["hf_revision"]
# spark_fabric_node of a pair's worker (roles/spark_fabric publishes it in preflight).
WORKER = {
    "pair": "pair_a",
    "rank": 1,
    "head": "spark-1",
    "peers": ["spark-1"],
    "head_address": "192.168.100.10",
    "master_port": 29501,
    "rdma": True,
    "docker_args": ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"],
    "env": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "VLLM_HOST_IP": "192.168.100.11"},
}


def resolve(run_module, models: list[dict], **args: object) -> dict:
    base = {
        "models": models,
        "recipes_dir": str(RECIPES_DIR),
        "listen_address": "127.0.0.1",
        "data_dir": "/var/lib/sparkfleet",
        "config_dir": "/etc/sparkfleet/vllm",
        "host": "spark-1",
        "memory_total_bytes": SPARK_MEM_TOTAL,
    }
    return run_module("vllm_models", base | args, check_mode=True)


@pytest.mark.parametrize(
    ("listen", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1"),
        ("::", "127.0.0.1"),
        ("::1", "[::1]"),
        ("10.0.0.5", "10.0.0.5"),
    ],
)
def test_a_client_on_the_host_reaches_each_kind_of_bind(listen, host):
    assert url_host(listen) == host
    assert endpoint_url(listen, 8000) == f"http://{host}:8000"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("::", False)],
)
def test_only_loopback_binds_count_as_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_unit_names_keep_only_safe_characters():
    assert unit_slug("qwen3-0.6b") == "qwen3-0.6b"
    assert unit_slug("org/Model name:v2") == "org-Model-name-v2"


def test_one_model_is_resolved_into_everything_the_roles_read(run_module):
    result = resolve(run_module, [{"recipe": "qwen3-0.6b", "port": 8000, "max_num_seqs": 2}], listen_address="0.0.0.0")
    assert not result.get("failed"), result
    assert result["changed"] is False
    (model,) = result["models"]
    recipe = model["settings"]
    assert recipe["max_num_seqs"] == 2  # the entry's override, laid over the recipe
    flags = load_flag_list(RECIPES_DIR / "vllm-serve-flags.txt")
    assert model["serve_args"] == serve_args(recipe, flags)
    # A single Spark's internal listeners on loopback (served_models.LOOPBACK_ENV), after the recipe's own.
    assert model["env"] == {**container_env(recipe), **LOOPBACK_ENV}
    assert model["env"]["VLLM_HOST_IP"] == "127.0.0.1" and model["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert model["unit"] == "vllm-qwen3-0.6b.service"
    assert model["container"] == "vllm-qwen3-0.6b"
    assert model["secrets_file"] == "/etc/sparkfleet/vllm/qwen3-0.6b.secrets.env"
    assert model["last_good"] == "/etc/sparkfleet/vllm/qwen3-0.6b.last-good"
    assert model["url"] == "http://127.0.0.1:8000"
    assert model["snapshot"] == (
        f"/var/lib/sparkfleet/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/{QWEN_REVISION}"
    )
    assert (model["multinode"], model["rank"], model["api"], model["head"]) == (False, 0, True, "spark-1")
    assert model["docker_args"] == []
    assert "/var/lib/sparkfleet/huggingface:/root/.cache/huggingface" in model["volumes"]
    assert model["plan"]["fits"] and model["plan"]["summary"]
    assert result["snapshots"] == [{"hf_repo": "Qwen/Qwen3-0.6B", "hf_revision": QWEN_REVISION}]
    assert result["hf_cache_dir"] == "/var/lib/sparkfleet/huggingface/hub"
    assert "/var/lib/sparkfleet/cache/vllm" in result["cache_dirs"]
    assert result["loopback"] is False
    assert result["memory"]["fits"] and result["memory"]["gpu_memory_utilization_total"] == 0.4


def test_two_served_names_of_one_model_share_one_snapshot(run_module):
    models = [
        {"recipe": "qwen3-0.6b", "port": 8000, "gpu_memory_utilization": 0.2},
        {"recipe": "qwen3-0.6b", "port": 8001, "gpu_memory_utilization": 0.2, "served_model_name": "qwen-b"},
    ]
    result = resolve(run_module, models)
    assert not result.get("failed"), result
    assert [model["unit"] for model in result["models"]] == ["vllm-qwen3-0.6b.service", "vllm-qwen-b.service"]
    assert len(result["snapshots"]) == 1


def test_two_served_names_that_make_one_unit_name_are_refused(run_module):
    models = [
        {"recipe": "qwen3-0.6b", "port": 8000, "gpu_memory_utilization": 0.2, "served_model_name": "qwen-a"},
        {"recipe": "qwen3-0.6b", "port": 8001, "gpu_memory_utilization": 0.2, "served_model_name": "qwen/a"},
    ]
    result = resolve(run_module, models)
    assert result["failed"]
    assert (
        "vllm_server_models[1] (qwen/a) and vllm_server_models[0] (qwen-a) would both run as vllm-qwen-a"
        in (result["msg"])
    )


def test_every_recipe_problem_is_named_with_its_entry(run_module):
    models = [{"recipe": "no-such-model", "port": 8000}, {"recipe": "qwen3-0.6b", "port": 8001, "max_model_len": "x"}]
    result = resolve(run_module, models)
    assert result["failed"]
    assert len(result["problems"]) == 2
    assert "vllm_server_models[0] (recipe no-such-model): recipe 'no-such-model' was not found" in result["msg"]
    assert "vllm_server_models[1] (recipe qwen3-0.6b).max_model_len='x'" in result["msg"]


def test_a_value_the_planner_reads_is_checked_with_the_recipe_before_any_plan(run_module):
    # One validator: vllm_recipe refuses what the planner could not plan, naming the entry and its recipe.
    result = resolve(run_module, [{"recipe": "qwen3-0.6b", "port": 8000, "max_model_len": 65536}])
    assert result["failed"]
    (problem,) = result["problems"]
    assert problem.startswith(
        "vllm_server_models[0] (recipe qwen3-0.6b).max_model_len=65536: above the model's max_context 40,960"
    )
    assert "memory" not in result


def test_models_that_together_could_freeze_the_spark_are_refused_with_shares_that_fit(run_module):
    models = [
        {"recipe": "nemotron-3-super-120b-a12b-nvfp4", "port": 8000},
        {"recipe": "qwen3.6-35b-a3b-nvfp4", "port": 8001},
    ]
    result = resolve(run_module, models)
    assert result["failed"]
    assert not result["memory"]["fits"]
    assert "0.85" in result["msg"] and "0.4" in result["msg"]
    accepted = resolve(run_module, models, i_accept_freeze_risk=True)
    assert not accepted.get("failed"), accepted
    assert any("freeze" in warning for warning in accepted["warnings"])


def test_a_pair_worker_runs_headless_with_the_pair_settings(run_module):
    result = resolve(
        run_module, [{"recipe": "llama-3.3-70b-instruct-bf16-tp2", "port": 8000}], fabric=WORKER, host="spark-2"
    )
    assert not result.get("failed"), result
    (model,) = result["models"]
    assert (model["multinode"], model["rank"], model["api"]) == (True, 1, False)
    assert (model["pair"], model["head"]) == ("pair_a", "spark-1")
    assert model["serve_args"][-9:] == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.100.10", "--master-port", "29501", "--headless",
    ]  # fmt: skip
    assert model["env"]["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert model["docker_args"] == ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"]


def test_a_pair_head_answers_the_api_without_headless(run_module):
    head = WORKER | {"rank": 0, "peers": ["spark-2"], "rdma": False, "docker_args": []}
    result = resolve(run_module, [{"recipe": "llama-3.3-70b-instruct-bf16-tp2", "port": 8000}], fabric=head)
    (model,) = result["models"]
    assert (model["rank"], model["api"], model["docker_args"]) == (0, True, [])
    assert "--headless" not in model["serve_args"]
    assert model["serve_args"][-2:] == ["--master-port", "29501"]


def test_a_pair_that_loads_the_hosts_nccl_mounts_it_read_only_and_names_it_for_vllm_and_torch(run_module):
    library = "/opt/sparkfleet/nccl/libnccl.so.2"
    fabric = WORKER | {
        "nccl_library": "host",
        "mounts": [f"/usr/lib/aarch64-linux-gnu/libnccl.so.2:{library}:ro"],
        "env": {**WORKER["env"], "VLLM_NCCL_SO_PATH": library, "LD_PRELOAD": library},
    }
    result = resolve(
        run_module, [{"recipe": "llama-3.3-70b-instruct-bf16-tp2", "port": 8000}], fabric=fabric, host="spark-2"
    )
    assert not result.get("failed"), result
    (model,) = result["models"]
    assert model["volumes"][-1] == f"/usr/lib/aarch64-linux-gnu/libnccl.so.2:{library}:ro"
    assert (model["env"]["VLLM_NCCL_SO_PATH"], model["env"]["LD_PRELOAD"]) == (library, library)
    # A model that serves alone on the same Spark mounts nothing of the pair's.
    (alone,) = resolve(run_module, [{"recipe": "qwen3-0.6b", "port": 8000}], fabric=fabric, host="spark-2")["models"]
    assert not any("nccl" in volume for volume in alone["volumes"]) and "LD_PRELOAD" not in alone["env"]


def test_a_two_spark_model_on_a_host_in_no_pair_resolves_for_the_role_to_refuse(run_module):
    result = resolve(run_module, [{"recipe": "llama-3.3-70b-instruct-bf16-tp2", "port": 8000}])
    assert not result.get("failed"), result
    (model,) = result["models"]
    assert (model["multinode"], model["rank"], model["pair"]) == (True, 0, "")
    assert "--nnodes" not in model["serve_args"]
