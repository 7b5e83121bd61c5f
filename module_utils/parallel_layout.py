"""How one model splits across a group of Sparks: vLLM's tensor and pipeline parallelism with one GPU per Spark.

A Spark has one GPU, so a model with tensor_parallel_size T and pipeline_parallel_size P runs on T x P Sparks, one
rank each (vLLM's native multi-node mode: --nnodes T*P, one --node-rank per Spark, every rank but the head
--headless). The rules here are vLLM's own, as the pinned release's code (0.33.0) states them:

- the attention heads split across the tensor-parallel ranks: "Total number of attention heads (H) must be
  divisible by tensor parallel size (T)." (vllm/config/model.py, verify_with_parallel_config);
- the KV heads split too, or, with more ranks than KV heads, each is replicated: one of the two counts must divide
  the other (QKVParallelLinear: divide(kv_heads, T) or divide(T, kv_heads), vllm/model_executor/layers/linear.py);
- the layers split across the pipeline stages evenly, the remainder one each to the stages before the last
  (get_pp_indices, vllm/distributed/utils.py): every stage needs at least one layer.

Each Spark then holds 1/(T x P) of the weights, the KV heads of its tensor-parallel rank and the layers of its
stage: what the memory planner (module_utils/memory_plan.py) plans per member.
"""

from __future__ import annotations

from ansible.module_utils.spark_pair import MAX_GROUP


def group_size(tensor_parallel_size: int, pipeline_parallel_size: int = 1) -> int:
    """The Sparks one model runs on (one GPU each)."""
    return int(tensor_parallel_size) * int(pipeline_parallel_size)


def stage_layers(layers: int, pipeline_parallel_size: int) -> list[int]:
    """The layers of each pipeline stage, as vLLM's get_pp_indices splits them: an even share each, then one more
    for each of the stages before the last, from the last but one backwards, until the remainder is spent."""
    share, rest = divmod(int(layers), int(pipeline_parallel_size))
    stages = [share] * int(pipeline_parallel_size)
    for index in range(2, rest + 2):
        stages[-index] += 1
    return stages


def largest_stage_share(count: int, pipeline_parallel_size: int) -> int:
    """The most of COUNT layers of one kind a stage holds (the largest stage's share of them: a kind that alternates
    with another is spread over the stages as the layers are)."""
    if pipeline_parallel_size <= 1 or count <= 0:
        return int(count)
    return max(stage_layers(int(count), int(pipeline_parallel_size)))


def problems(
    label: str,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    *,
    attention_heads: int | None,
    kv_heads: int | None,
    layers: int | None,
) -> list[str]:
    """What stops vLLM from splitting the model so, one message each, naming the sizes that would work."""
    found = []
    tp, pp = int(tensor_parallel_size), int(pipeline_parallel_size)
    if group_size(tp, pp) > MAX_GROUP:
        found.append(
            f"{label}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {tp * pp} Sparks, more than a group "
            f"of {MAX_GROUP} holds"
        )
    if attention_heads and attention_heads % tp:
        found.append(
            f"{label}: tensor_parallel_size {tp} does not divide the model's {attention_heads} attention heads "
            f'(vLLM: "Total number of attention heads ({attention_heads}) must be divisible by tensor parallel '
            f'size ({tp})."); sizes that do: {_divisors(attention_heads)}, or split the rest by '
            f"pipeline_parallel_size"
        )
    if kv_heads and kv_heads % tp and tp % kv_heads:
        found.append(
            f"{label}: tensor_parallel_size {tp} and the model's {kv_heads} KV heads: one must divide the other "
            f"(vLLM splits the KV heads or copies each to several ranks); sizes that fit: {_divisors(kv_heads)} or "
            "a multiple of the KV heads"
        )
    if layers and pp > layers:
        found.append(f"{label}: pipeline_parallel_size {pp} is more stages than the model's {layers} layers")
    return found


def _divisors(number: int) -> str:
    return ", ".join(str(size) for size in range(1, MAX_GROUP + 1) if number % size == 0)
