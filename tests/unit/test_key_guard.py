"""sparkfleet's key guard (roles/vllm_server/files/vllm_key_guard.py), the middleware a keyed vLLM unit loads:
the key on every path but /health, /ping, /version and /metrics, checked as vLLM checks its own, with vLLM's 401.
module_utils/key_guard.py says how a unit loads it; the real engine runs it in test_pooling_real_engine.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest
import yaml
from helpers import ROOT
from key_guard import CONTAINER_FOLDER, FILE, MIDDLEWARE, container_parts, host_folder, version_problem
from vllm_flags import load_flag_list

GUARD_FILE = ROOT / "roles" / "vllm_server" / "files" / FILE
KEY = "sk-guard-test"


def load_guard():
    spec = importlib.util.spec_from_file_location("vllm_key_guard", GUARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GUARD = load_guard()


def call(guard, path: str, headers: list[tuple[bytes, bytes]], method: str = "POST") -> tuple[list[dict], bool]:
    """One HTTP request through the middleware: what it sent, and whether it passed the request on to the app."""
    sent: list[dict] = []
    passed: list[bool] = []

    async def app(scope, receive, send):
        passed.append(True)

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers, "root_path": ""}
    asyncio.run(GUARD.KeyOnEveryPath(app, guard)(scope, receive, send))
    return sent, bool(passed)


@pytest.mark.parametrize("path", ["/pooling", "/score", "/rerank", "/classify", "/tokenize", "/v1/chat/completions"])
def test_a_request_without_the_key_gets_vllms_own_401_on_every_guarded_path(path):
    sent, passed = call({"VLLM_API_KEY": KEY}, path, [])
    assert not passed
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"]) == {"error": "Unauthorized"}


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics"])
def test_the_state_paths_answer_without_the_key(path):
    assert call({"VLLM_API_KEY": KEY}, path, [], method="GET") == ([], True)


@pytest.mark.parametrize(
    ("header", "passes"),
    [
        (f"Bearer {KEY}", True),
        (f"bearer {KEY}", True),  # the scheme's case does not matter, as in vLLM's middleware
        ("Bearer sk-other", False),
        (KEY, False),
        (f"Basic {KEY}", False),
        ("Bearer ", False),
    ],
)
def test_the_key_is_a_bearer_token(header, passes):
    _, passed = call({"VLLM_API_KEY": KEY}, "/rerank", [(b"authorization", header.encode())])
    assert passed is passes


def test_with_no_key_set_it_fails_closed():
    """A unit that loads the guard has a key; should the environment lack it, nothing guarded is answered."""
    guard = GUARD.KeyOnEveryPath(None, {})
    assert not guard.authorized("POST", "/rerank", "Bearer ")
    assert not guard.authorized("POST", "/rerank", "Bearer anything")
    assert guard.authorized("GET", "/health", None)
    assert guard.authorized("OPTIONS", "/rerank", None)


def test_a_root_path_is_taken_off_before_the_check():
    sent: list[dict] = []

    async def app(scope, receive, send):
        sent.append({"passed": scope["path"]})

    guard = GUARD.KeyOnEveryPath(app, {"VLLM_API_KEY": KEY})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/api/health", "root_path": "/api", "headers": []}
    asyncio.run(guard(scope, None, send))
    assert sent == [{"passed": "/api/health"}]


def test_a_keyed_unit_loads_its_versions_guard_with_flags_vllm_has():
    parts = container_parts("/etc/sparkfleet/vllm/", keyed=True, version="0123456789ab")
    assert parts["serve_args"] == ["--middleware", MIDDLEWARE]
    assert "middleware" in load_flag_list(ROOT / "recipes" / "vllm-serve-flags.txt")
    assert parts["volumes"] == [f"/etc/sparkfleet/vllm/python/0123456789ab:{CONTAINER_FOLDER}:ro"]
    assert host_folder("/etc/sparkfleet/vllm/", "0123456789ab") == "/etc/sparkfleet/vllm/python/0123456789ab"
    assert version_problem("0123456789ab") is None
    for bad in ("", "0123456789AB", "0123456789a", "../../etc/x1"):
        assert "expected the first 12 lowercase hex digits" in version_problem(bad)
    # The image's own PYTHONPATH stays behind the guard's folder.
    assert parts["shell_setup"] == f'export PYTHONPATH="{CONTAINER_FOLDER}${{PYTHONPATH:+:$PYTHONPATH}}" && '
    assert MIDDLEWARE.rpartition(".")[0] == GUARD_FILE.stem
    assert hasattr(GUARD, MIDDLEWARE.rpartition(".")[2])


def test_an_unkeyed_unit_loads_nothing():
    assert container_parts("/etc/sparkfleet/vllm", keyed=False) == {"serve_args": [], "volumes": [], "shell_setup": ""}


def test_the_role_names_the_same_guard_file():
    variables = yaml.safe_load((ROOT / "roles" / "vllm_server" / "vars" / "main.yml").read_text())
    assert variables["__vllm_server_key_guard_file"] == FILE
