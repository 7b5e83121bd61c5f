"""One model on a group of Sparks (module_utils/parallel_layout.py, served_models, memory_plan): vLLM's split of the
heads and layers, each member's share in the plan, and the command line of every rank of groups of 2, 3 and 4,
parsed the way the pinned vLLM's parser reads it (its flag list, through the stand-in's FlexibleArgumentParser)."""

from __future__ import annotations

import sys

import pytest
from helpers import ROOT
from parallel_layout import problems, stage_layers

sys.path.insert(0, str(ROOT / "tests" / "standins" / "vllm"))
from vllm_standin.flags import load_flag_table, parse_serve_args

FLAG_TABLE = load_flag_table(ROOT / "recipes" / "vllm-serve-flags.txt")
LLAMA_70B = "llama-3.3-70b-instruct-bf16-tp2"  # 141.1 GB of BF16, 64 attention heads, 8 KV heads, 80 layers
SPARK_MEM_TOTAL = 127_601_400 * 1024


def test_the_layers_split_over_the_stages_as_vllm_splits_them():
    # get_pp_indices: an even share, then one more each for the stages before the last, from the last but one back.
    assert stage_layers(80, 2) == [40, 40]
    assert stage_layers(80, 3) == [27, 27, 26]
    assert stage_layers(30, 4) == [7, 8, 8, 7]
    assert stage_layers(61, 4) == [15, 15, 16, 15]


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_in_vllms_words():
    (heads, kv) = problems("m", 3, 1, attention_heads=64, kv_heads=8, layers=80)
    assert 'vLLM: "Total number of attention heads (64) must be divisible by tensor parallel size (3)."' in heads
    assert "sizes that do: 1, 2, 4, 8" in heads
    assert "tensor_parallel_size 3 and the model's 8 KV heads: one must divide the other" in kv
    # More ranks than KV heads is fine when each KV head is copied evenly (vLLM's num_kv_head_replicas).
    assert problems("m", 8, 1, attention_heads=64, kv_heads=4, layers=80) == []
    # Three Sparks: the heads do not split three ways, the layers do.
    assert problems("m", 1, 3, attention_heads=64, kv_heads=8, layers=80) == []
    assert "more than a group of 8" in problems("m", 4, 4, attention_heads=64, kv_heads=8, layers=80)[0]
    assert "more stages than the model's 2 layers" in problems("m", 1, 3, attention_heads=4, kv_heads=4, layers=2)[0]


def fabric(size: int, rank: int) -> dict:
    """spark_fabric_node of rank RANK in a group of SIZE (roles/spark_fabric publishes it in preflight)."""
    return {
        "pair": "group_a",
        "rank": rank,
        "size": size,
        "head": "spark-1",
        "peers": [f"spark-{member + 1}" for member in range(size) if member != rank],
        "head_address": "192.168.100.11",
        "master_port": 29501,
        "rdma": False,
        "docker_args": [],
        "env": {"VLLM_HOST_IP": f"192.168.100.{11 + rank}"},
    }


def resolved(run_module, layout: dict, size: int, rank: int) -> dict:
    result = run_module(
        "vllm_models",
        {
            "models": [{"recipe": LLAMA_70B, "port": 8000, **layout}],
            "recipes_dir": str(ROOT / "recipes"),
            "listen_address": "127.0.0.1",
            "data_dir": "/var/lib/sparkfleet",
            "config_dir": "/etc/sparkfleet/vllm",
            "fabric": fabric(size, rank),
            "host": f"spark-{rank + 1}",
            "memory_total_bytes": SPARK_MEM_TOTAL,
        },
        check_mode=True,
    )
    assert not result.get("failed"), result.get("msg")
    return result["models"][0]


GROUPS = {
    "2: tp2": ({"tensor_parallel_size": 2}, 2),
    "3: pp3": ({"tensor_parallel_size": 1, "pipeline_parallel_size": 3}, 3),
    "4: tp4": ({"tensor_parallel_size": 4}, 4),
    "4: tp2 x pp2": ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_rank_of_a_group_runs_one_command_line_that_vllms_parser_reads(run_module, group):
    layout, size = GROUPS[group]
    lines = []
    for rank in range(size):
        model = resolved(run_module, layout, size, rank)
        assert (model["multinode"], model["nodes"], model["rank"], model["api"]) == (True, size, rank, rank == 0)
        parsed = parse_serve_args([*model["serve_args"], "--host", "127.0.0.1", "--port", "8000"], FLAG_TABLE)
        values = parsed.values
        assert (values["nnodes"], values["node_rank"]) == (str(size), str(rank))
        assert values.get("tensor_parallel_size", "1") == str(layout["tensor_parallel_size"])
        assert values.get("pipeline_parallel_size", "1") == str(layout.get("pipeline_parallel_size", 1))
        assert values["master_addr"] == "192.168.100.11" and values["master_port"] == "29501"
        assert bool(values.get("headless")) == (rank > 0)
        line = [arg for arg in model["serve_args"] if arg != "--headless"]
        at = line.index("--node-rank")
        lines.append(line[:at] + line[at + 2 :])
    # One command line for the whole group, but for each rank's own number and the workers' --headless.
    assert all(line == lines[0] for line in lines)


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_member_plans_its_share_of_the_weights_and_of_the_cache(run_module, group):
    layout, size = GROUPS[group]
    plan = resolved(run_module, layout, size, 0)["plan"]
    tp, pp = layout["tensor_parallel_size"], layout.get("pipeline_parallel_size", 1)
    # Tensor parallelism splits the weights evenly; a pipeline stage holds its largest share of the 80 layers and
    # one layer's worth more for the embedding or the output head.
    share = (max(stage_layers(80, pp)) + (1 if pp > 1 else 0)) / 80 / tp
    assert plan["weights_gib"] == pytest.approx(141_107_412_992 * share / 2**30, abs=0.01)
    # BF16 K and V of 128 elements per KV head: the rank's KV heads (8 / TP) on the stage's layers (80 / PP, vLLM's
    # largest stage).
    assert plan["kv_bytes_per_token"] == 2 * 128 * 2 * (8 // tp) * max(stage_layers(80, pp))
    assert (plan["tensor_parallel_size"], plan["pipeline_parallel_size"]) == (tp, pp)
    assert f"per node of {size}" in plan["summary"]


def test_a_group_size_the_heads_do_not_allow_is_refused_before_anything_starts(run_module):
    result = run_module(
        "vllm_models",
        {
            "models": [{"recipe": LLAMA_70B, "port": 8000, "tensor_parallel_size": 3}],
            "recipes_dir": str(ROOT / "recipes"),
            "listen_address": "127.0.0.1",
            "data_dir": "/var/lib/sparkfleet",
            "config_dir": "/etc/sparkfleet/vllm",
            "fabric": fabric(3, 0),
            "host": "spark-1",
            "memory_total_bytes": SPARK_MEM_TOTAL,
        },
        check_mode=True,
    )
    assert result["failed"]
    assert "Total number of attention heads (64) must be divisible by tensor parallel size (3)" in result["msg"]


def notes_for(run_module, entry: dict) -> list[str]:
    result = run_module(
        "vllm_models",
        {
            "models": [{"port": 8000, **entry}],
            "recipes_dir": str(ROOT / "recipes"),
            "listen_address": "127.0.0.1",
            "data_dir": "/var/lib/sparkfleet",
            "config_dir": "/etc/sparkfleet/vllm",
            "fabric": fabric(2, 0),
            "host": "spark-1",
            "memory_total_bytes": SPARK_MEM_TOTAL,
        },
        check_mode=True,
    )
    assert not result.get("failed"), result.get("msg")
    return [note for note in result["notes"] if "one Spark holds it alone" in note]


def test_a_model_one_spark_holds_on_a_group_shows_the_other_choice_with_its_published_figures(run_module):
    (note,) = notes_for(run_module, {"recipe": "gpt-oss-120b", "tensor_parallel_size": 2})
    assert "gpt-oss-120b runs on a group of 2 Sparks" in note
    assert "1 streams: group 69, solo Sparks 57.7 tok/s" in note
    assert "64 streams: group 471.8, solo Sparks 567.9 tok/s" in note
    assert "kubis.ai" in note
    # No published comparison: the note says to measure both.
    (note,) = notes_for(run_module, {"recipe": "qwen3-0.6b", "tensor_parallel_size": 2})
    assert "no published comparison for this model: measure both with bench.yml" in note
    # A model that needs its group (141 GB of BF16) gets no such note.
    assert notes_for(run_module, {"recipe": LLAMA_70B}) == []
