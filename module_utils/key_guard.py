"""Where sparkfleet's key guard lives and how a vLLM container loads it: the one place for that rule.

vLLM 0.33's `--api-key` guards /v1, /v2, /inference and /cohere only (tests/contracts/vllm/auth.json), so a keyed
server beyond loopback answers /pooling, /score, /rerank, /classify, /tokenize and /detokenize without the key. Every
keyed vLLM unit therefore loads roles/vllm_server/files/sparkfleet_key_guard.py, which asks for the key on every path
but /health, /ping, /version and /metrics: the vllm_server role copies it to FOLDER under vllm_server_config_dir,
the unit mounts that folder read-only at CONTAINER_FOLDER, puts it first on the container's PYTHONPATH (keeping the
image's own), and names the middleware with vLLM's `--middleware` flag (checked in the flag list).
"""

from __future__ import annotations

# The guard's file (in roles/vllm_server/files) and the class vLLM adds as middleware.
FILE = "sparkfleet_key_guard.py"
MIDDLEWARE = "sparkfleet_key_guard.KeyOnEveryPath"

# The host folder under vllm_server_config_dir, and where the container sees it.
FOLDER = "python"
CONTAINER_FOLDER = "/opt/sparkfleet/python"


def host_folder(config_dir: str) -> str:
    """The folder on the host that holds the guard (root-owned; the file is not secret, it holds no key)."""
    return f"{config_dir.rstrip('/')}/{FOLDER}"


def container_parts(config_dir: str, keyed: bool) -> dict:
    """What a unit adds to load the guard: its serve arguments, its read-only volume and the shell line that puts
    the folder on PYTHONPATH before `exec vllm serve`. Nothing for a server with no key (it listens on loopback)."""
    if not keyed:
        return {"serve_args": [], "volumes": [], "shell_setup": ""}
    return {
        "serve_args": ["--middleware", MIDDLEWARE],
        "volumes": [f"{host_folder(config_dir)}:{CONTAINER_FOLDER}:ro"],
        "shell_setup": f'export PYTHONPATH="{CONTAINER_FOLDER}${{PYTHONPATH:+:$PYTHONPATH}}" && ',
    }
