"""What a host serves, resolved once: the rules that turn one vllm_server_models entry and its checked recipe into
the names, paths, URLs and command line every later step uses.

library/vllm_models.py calls these once per host in preflight and publishes the result as the fact
vllm_server_resolved; the roles read that fact and never re-derive any of it. Each rule lives here only.
"""

from __future__ import annotations

import re

from ansible.module_utils import key_guard, model_kinds, parallel_layout, speculative, vllm_guard
from ansible.module_utils.hf_snapshot import snapshot_folder
from ansible.module_utils.input_rules import is_loopback_host, is_wildcard

# Keys of a vllm_server_models entry that are not recipe overrides: where it answers, and the decision profile
# (module_utils/profiles.py) with its context. Every other key of an entry overrides that recipe key.
ENTRY_KEYS = ("recipe", "port", "profile", "profile_context")


def entry_overrides(entry: dict) -> dict:
    """The recipe overrides of one vllm_server_models entry."""
    return {key: value for key, value in entry.items() if key not in ENTRY_KEYS}


# Characters a served model name may keep in unit and container names; the others become "-".
UNIT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


# Where the container expects its caches (the image runs as root), under vllm_server_data_dir on the host.
CONTAINER_MOUNTS = (
    ("huggingface", "/root/.cache/huggingface"),
    ("cache/vllm", "/root/.cache/vllm"),
    ("cache/flashinfer", "/root/.cache/flashinfer"),
    ("cache/triton", "/root/.triton"),
)


def unit_slug(served_model_name: str) -> str:
    """The served name as it appears in unit, container and file names."""
    return UNIT_NAME_UNSAFE.sub("-", served_model_name)


def is_loopback(address: str) -> bool:
    """Whether only this host can reach an endpoint bound to `address` (there it needs no API key)."""
    return is_loopback_host(address)


def url_host(listen_address: str) -> str:
    """The host part of a URL that reaches an endpoint bound to `listen_address`, from the host itself:
    loopback for a wildcard bind, brackets around an IPv6 address."""
    if is_wildcard(listen_address):  # clients on the host itself reach every-address binds through loopback
        return "127.0.0.1"
    return f"[{listen_address}]" if ":" in listen_address else listen_address


def endpoint_url(listen_address: str, port: int) -> str:
    return f"http://{url_host(listen_address)}:{port}"


def hf_cache_dir(data_dir: str) -> str:
    """huggingface_hub's cache on the host, mounted into the container as /root/.cache/huggingface/hub."""
    return f"{data_dir.rstrip('/')}/huggingface/hub"


def cache_dirs(data_dir: str) -> list[str]:
    """The host folders mounted into every vLLM container (created by the role before the first start)."""
    return [f"{data_dir.rstrip('/')}/{host}" for host, _ in CONTAINER_MOUNTS]


def volumes(data_dir: str) -> list[str]:
    """The container's --volume values: every cache folder under the data folder."""
    containers = [container for _, container in CONTAINER_MOUNTS]
    return [f"{folder}:{container}" for folder, container in zip(cache_dirs(data_dir), containers, strict=True)]


def pair_args(node: dict, nodes: int) -> list[str]:
    """The arguments a model on NODES Sparks adds on one rank of its group: every rank runs the same command line,
    all but the head headless, every socket on the link (spark_fabric_node, from roles/spark_fabric)."""
    rank = int(node["rank"])
    args = ["--nnodes", str(nodes), "--node-rank", str(rank)]
    args += ["--master-addr", str(node["head_address"]), "--master-port", str(node["master_port"])]
    return args + (["--headless"] if rank > 0 else [])


def resolve_model(
    *,
    recipe: dict,
    port: int,
    serve_args: list[str],
    env: dict[str, str],
    plan: dict,
    listen_address: str,
    data_dir: str,
    config_dir: str,
    fabric: dict,
    host: str,
    keyed: bool = False,
    key_guard_version: str = "",
) -> dict:
    """One served model, everything the roles need about it. `recipe` is checked and merged with its overrides,
    `serve_args` and `env` come from it (library/vllm_recipe's rules), `plan` is its share of the host's plan."""
    slug = unit_slug(recipe["served_model_name"])
    nodes = parallel_layout.group_size(recipe["tensor_parallel_size"], recipe.get("pipeline_parallel_size") or 1)
    multinode = nodes > 1
    # A two-Spark model on a host in no pair is refused by the role's check right after (it names the fix);
    # until then it resolves as rank 0 without pair arguments.
    paired = multinode and "rank" in fabric
    rank = int(fabric["rank"]) if paired else 0
    config_dir = config_dir.rstrip("/")
    guard = key_guard.container_parts(config_dir, keyed, key_guard_version)
    return {
        "served": recipe["served_model_name"],
        # More names vLLM answers to on this Spark (the router routes the served name).
        "aliases": list(recipe.get("served_aliases") or []),
        # What it answers (module_utils/model_kinds.py): chat, embed or rerank.
        "kind": model_kinds.kind_of(recipe),
        "example": model_kinds.example(model_kinds.kind_of(recipe), recipe["served_model_name"]),
        "recipe": recipe["name"],
        "settings": recipe,
        "hf_repo": recipe["hf_repo"],
        "hf_revision": recipe["hf_revision"],
        "snapshot": snapshot_folder(hf_cache_dir(data_dir), recipe["hf_repo"], recipe["hf_revision"]),
        # Every snapshot the container reads: the model's, and its speculative draft model's (offline needs both).
        "snapshots": [
            snapshot_folder(hf_cache_dir(data_dir), snapshot["hf_repo"], snapshot["hf_revision"])
            for snapshot in _model_snapshots(recipe)
        ],
        "unit": f"vllm-{slug}.service",
        "container": f"vllm-{slug}",
        "secrets_file": f"{config_dir}/{slug}.secrets.env",
        "last_good": f"{config_dir}/{slug}.last-good",
        # Its unplanned exits, refused starts and failures, kept by the guard (module_utils/vllm_guard.py).
        "exits": f"{config_dir}/{slug}{vllm_guard.EXITS_SUFFIX}",
        "port": port,
        "url": endpoint_url(listen_address, port),
        # The recipe's own image; "" runs the host's default (vllm_server_image, else the image vllm_image pinned).
        "recipe_image": recipe.get("image") or "",
        "gpu_memory_utilization": recipe["gpu_memory_utilization"],
        "plan": plan,
        # A group of Sparks: every rank runs the same command, all but rank 0 headless; every socket on the link.
        "multinode": multinode,
        # The Sparks it runs on (tensor_parallel_size x pipeline_parallel_size, module_utils/parallel_layout.py).
        "nodes": nodes,
        "rank": rank,
        # Whether this unit answers the API (a pair's worker does not: it is reached through its head).
        "api": rank == 0,
        "pair": fabric["pair"] if paired else "",
        "head": fabric["head"] if paired else host,
        "serve_args": serve_args + (pair_args(fabric, nodes) if paired else []) + guard["serve_args"],
        # The shell line's setup before `exec vllm serve` (the key guard's PYTHONPATH, when the server has a key).
        "shell_setup": guard["shell_setup"],
        # A group's sockets on its fabric (spark_fabric_node); a single Spark's on loopback (LOOPBACK_ENV).
        "env": {**env, **(fabric.get("env", {}) if paired else LOOPBACK_ENV)},
        # The fabric's container arguments (RDMA devices where the host has them: spark_fabric_node).
        "docker_args": list(fabric.get("docker_args", [])) if paired else [],
        # A pair's own read-only mounts (the host's NCCL, when it loads that: spark_fabric_node).
        # The key guard's folder, when the server has a key (module_utils/key_guard.py).
        "volumes": volumes(data_dir) + (list(fabric.get("mounts", [])) if paired else []) + guard["volumes"],
    }


# A single Spark's engine binds every internal listener to loopback: vLLM pins its torch.distributed groups (one
# TCPStore and gloo pairs for each group, even with one process per group) to VLLM_HOST_IP, which it otherwise
# guesses from the default route (utils/network_utils.py get_ip), and gloo, NCCL and TensorPipe pick their
# interface from these variables. Without them a Spark's VLLM::Worker listens on its LAN address, unauthenticated.
# The API alone follows vllm_server_listen_address. docs/security.md lists every listener.
LOOPBACK_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
    "NCCL_SOCKET_IFNAME": "lo",
    "TP_SOCKET_IFNAME": "lo",
}


def _model_snapshots(recipe: dict) -> list[dict]:
    """The repositories one model's container reads: its own, and the draft model its speculative decoding loads."""
    own = {"hf_repo": recipe["hf_repo"], "hf_revision": recipe["hf_revision"]}
    draft = speculative.draft(recipe.get("speculative"))
    return [own, draft] if draft else [own]


def snapshots(models: list[dict]) -> list[dict]:
    """The snapshots to fetch, each once (two served names of one model share their weights): each model's, and
    the draft model its speculative decoding reads (fetched, verified and fanned out the same way, so that it is
    in the cache before the unit starts offline)."""
    unique: list[dict] = []
    for model in models:
        for snapshot in _model_snapshots({**model, "speculative": model.get("settings", {}).get("speculative")}):
            if snapshot not in unique:
                unique.append(snapshot)
    return unique


def duplicate_unit_problems(models: list[dict], label: str) -> list[str]:
    """Two entries whose served names map to one unit name would overwrite each other's unit."""
    problems, seen = [], {}
    for index, model in enumerate(models):
        first = seen.setdefault(model["unit"], index)
        if first != index:
            problems.append(
                f"{label}[{index}] ({model['served']}) and {label}[{first}] ({models[first]['served']}) would both "
                f"run as {model['unit']}: give each entry a served_model_name of its own"
            )
    return problems
