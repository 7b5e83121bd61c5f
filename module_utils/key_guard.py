"""Where sparkfleet's key guard lives and how a vLLM container loads it: the one place for that rule.

vLLM 0.33's `--api-key` guards /v1, /v2, /inference and /cohere only (tests/contracts/vllm/auth.json), so a keyed
server beyond loopback answers /pooling, /score, /rerank, /classify, /tokenize, /detokenize and /invocations without
the key. Every keyed vLLM unit therefore loads roles/vllm_server/files/vllm_key_guard.py, which asks for the key
on every path but /health, /ping, /version and /metrics.

Each version of the guard (the first 12 hex digits of its SHA-256) gets a folder of its own under FOLDER in
vllm_server_config_dir, and is never overwritten: a unit names its version's folder, so a new guard changes the
unit (and restarts it through the gate), and a unit rolled back to its last good file finds the guard it last
started with. The unit mounts that folder read-only at CONTAINER_FOLDER, puts it first on the container's
PYTHONPATH (keeping the image's own), and names the middleware with vLLM's `--middleware` flag (checked in the flag
list).
"""

from __future__ import annotations

# The guard's file (in roles/vllm_server/files; the role's vars name it too) and the class vLLM adds as middleware.
FILE = "vllm_key_guard.py"
MIDDLEWARE = "vllm_key_guard.KeyOnEveryPath"

# The host folder under vllm_server_config_dir that holds one folder per guard version, and where the container
# sees the version its unit names.
FOLDER = "python"
CONTAINER_FOLDER = "/opt/sparkfleet/python"


def host_folder(config_dir: str, version: str) -> str:
    """The folder on the host that holds one version of the guard (root-owned; the file holds no key)."""
    return f"{config_dir.rstrip('/')}/{FOLDER}/{version}"


def version_problem(version: str) -> str | None:
    """What is wrong with a guard version: it must be 12 lowercase hex digits (the start of its SHA-256)."""
    if len(version) == 12 and all(character in "0123456789abcdef" for character in version):
        return None
    return f"key guard version {version!r}: expected the first 12 lowercase hex digits of the guard's SHA-256"


def container_parts(config_dir: str, keyed: bool, version: str = "") -> dict:
    """What a unit adds to load the guard: its serve arguments, its read-only volume and the shell line that puts
    the folder on PYTHONPATH before `exec vllm serve`. Nothing for a server with no key (it listens on loopback)."""
    if not keyed:
        return {"serve_args": [], "volumes": [], "shell_setup": ""}
    return {
        "serve_args": ["--middleware", MIDDLEWARE],
        "volumes": [f"{host_folder(config_dir, version)}:{CONTAINER_FOLDER}:ro"],
        "shell_setup": f'export PYTHONPATH="{CONTAINER_FOLDER}${{PYTHONPATH:+:$PYTHONPATH}}" && ',
    }
