"""Open WebUI on the router host (fleet_router_webui): its unit, its settings file and HAProxy's TLS front for it,
rendered from the role's templates and checked as the role's tasks check them (haproxy -c).

Opt-in (`bash tests/run-all.sh open-webui`, which puts open-webui 0.12.4 in .cache/open-webui and sets
SPARKFLEET_OPEN_WEBUI_VENV): the real Open WebUI started with that unit's command line and settings file, in front of
the fleet's gate and the real vllm-router with a stand-in Spark behind them. Its first admin logs in, sign-up is
closed, the model list is the gate's, a chat is answered by the stand-in, the gate counts it under the UI's own key,
and Open WebUI listens on 127.0.0.1 only. Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import gate_keys
import pytest
from helpers import wait_until
from helpers.fleet_gate import gated_router
from helpers.fleet_router import FRONT, KEY, Backend, command_of, rendered
from helpers.vllm_standin import free_port
from test_monitoring_rules import self_signed

WEBUI_UNIT = "etc/systemd/system/sparkfleet-webui.service.j2"
WEBUI_ENV = "etc/sparkfleet/open-webui.env.j2"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
VENV = os.environ.get("SPARKFLEET_OPEN_WEBUI_VENV", "")

UI_KEY = "open-webui-test-key-5b2e"
ADMIN = ("admin@fleet.example", "admin-password-77c1")
WEBUI = {
    "fleet_router_webui": True,
    "fleet_router_webui_key": UI_KEY,
    "fleet_router_webui_secret_key": "session-secret-of-the-test-0123456789abcdef",
    "fleet_router_webui_admin_email": ADMIN[0],
    "fleet_router_webui_admin_password": ADMIN[1],
}


def environment_of(env_file: str) -> dict[str, str]:
    """The variables of a rendered environment file, as its KEY=value lines read (the values are shell words)."""
    found = {}
    for line in env_file.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("=", 1)
            (found[name],) = shlex.split(value)
    return found


def test_the_unit_runs_open_webui_on_loopback_as_its_own_user(tmp_path):
    unit = rendered(tmp_path, WEBUI_UNIT, WEBUI)
    serve = ["/opt/sparkfleet/open-webui/bin/open-webui", "serve", "--host", "127.0.0.1", "--port", "18082"]
    assert command_of(unit, "ExecStart") == serve
    lines = unit.splitlines()
    for line in (
        "User=sparkfleet-webui",
        "EnvironmentFile=/etc/sparkfleet/open-webui/open-webui.env",
        "WorkingDirectory=/var/lib/sparkfleet/open-webui",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/sparkfleet/open-webui",
        "UMask=0077",
    ):
        assert line in lines, line
    # No secret on the unit (world-readable): they are in the root-only settings file.
    assert not any(secret in unit for secret in (UI_KEY, ADMIN[1], WEBUI["fleet_router_webui_secret_key"]))


@pytest.mark.parametrize(
    ("endpoint", "gate_url"),
    [
        ({}, "http://127.0.0.1:8080/v1"),  # on loopback the gate serves the endpoint itself
        ({"fleet_router_listen_address": "0.0.0.0"}, "http://127.0.0.1:18081/v1"),  # behind HAProxy: its own port
    ],
)
def test_the_settings_point_open_webui_at_the_gate_with_its_key_and_keep_the_inventory_in_charge(
    tmp_path, endpoint, gate_url
):
    settings = environment_of(rendered(tmp_path, WEBUI_ENV, WEBUI | endpoint))
    assert settings == {
        "DATA_DIR": "/var/lib/sparkfleet/open-webui",
        "STATIC_DIR": "/var/lib/sparkfleet/open-webui/static",
        "ENABLE_OPENAI_API": "True",
        "OPENAI_API_BASE_URLS": gate_url,
        "OPENAI_API_KEYS": UI_KEY,
        "ENABLE_OLLAMA_API": "False",
        "ENABLE_PERSISTENT_CONFIG": "False",
        "ENABLE_SIGNUP": "False",
        "WEBUI_ADMIN_EMAIL": ADMIN[0],
        "WEBUI_ADMIN_PASSWORD": ADMIN[1],
        "WEBUI_SECRET_KEY": WEBUI["fleet_router_webui_secret_key"],
        "ENABLE_VERSION_UPDATE_CHECK": "False",
        "OFFLINE_MODE": "False",
    }


def test_haproxy_serves_the_ui_over_tls_only_on_the_network(tmp_path):
    cert, key = self_signed(tmp_path)
    pem = tmp_path / "front.pem"
    pem.write_text(cert.read_text() + key.read_text())
    variables = WEBUI | {"fleet_router_listen_address": "0.0.0.0", "fleet_router_tls_certificate": str(pem)}
    front = rendered(tmp_path, FRONT, variables)
    assert f"    bind 0.0.0.0:8443 ssl crt {pem} alpn h2,http/1.1" in front.splitlines()
    assert "    server open_webui 127.0.0.1:18082" in front.splitlines()
    if not Path(HAPROXY).exists():
        pytest.skip("HAProxy is not installed: apt-get install haproxy (tests/run-all.sh does)")
    config = tmp_path / "haproxy.cfg"
    config.write_text(front)
    checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # as the role's template task validates it
    # Without the UI, no such listener.
    assert "sparkfleet_webui" not in rendered(tmp_path, FRONT, variables | {"fleet_router_webui": False})


# --- Opt-in: the real Open WebUI ----------------------------------------------------------------------------------

MODEL = "qwen3-0.6b"


def call(url: str, token: str | None = None, body: object | None = None) -> tuple[int, object]:
    """(status, JSON body) of a GET, or of a POST with BODY, with TOKEN as the Bearer token."""
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the IPv4 and IPv6 sockets listening on PORT (from /proc/net/tcp*, hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not VENV, reason="opt-in: bash tests/run-all.sh open-webui (installs open-webui 0.12.4)")
def test_a_login_and_a_chat_through_open_webui_and_the_gate(tmp_path):
    backend = Backend(tmp_path, MODEL)
    data = tmp_path / "open-webui"
    data.mkdir(mode=0o700)
    keys = [{"name": "alice", "key": "alice-key-of-the-webui-test"}, gate_keys.webui_entry(UI_KEY)]
    try:
        workers = [{"host": "spark-a", "url": backend.url, "model": MODEL}]
        with gated_router(tmp_path, workers, keys, {}, KEY) as gated:
            port = free_port()
            variables = WEBUI | {
                "fleet_router_port": gated["port"],
                "fleet_router_webui_port": port,
                "fleet_router_webui_venv": VENV,
                "__fleet_router_webui_data_dir": str(data),
            }
            argv = command_of(rendered(tmp_path, WEBUI_UNIT, variables), "ExecStart")
            settings = environment_of(rendered(tmp_path, WEBUI_ENV, variables))
            # Open WebUI downloads nothing here (no Hub): offline, as an air-gapped site runs it.
            settings["OFFLINE_MODE"] = "True"
            log = tmp_path / "open-webui.log"
            with log.open("wb") as out:
                webui = subprocess.Popen(
                    argv, cwd=data, env=os.environ | settings, stdout=out, stderr=subprocess.STDOUT
                )
            logs = [log, *gated["logs"], backend.log]
            base = f"http://127.0.0.1:{port}"
            try:
                wait_until(lambda: call(f"{base}/health")[0] == 200, "Open WebUI healthy", logs, seconds=900)
                assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else
                status, signed_in = call(f"{base}/api/v1/auths/signin", body={"email": ADMIN[0], "password": ADMIN[1]})
                assert status == 200, signed_in
                token = signed_in["token"]
                assert signed_in["role"] == "admin"
                someone = {"name": "someone", "email": "someone@fleet.example", "password": "a-password-of-theirs"}
                assert call(f"{base}/api/v1/auths/signup", body=someone)[0] == 403
                status, models = call(f"{base}/api/models", token)
                assert status == 200, models
                assert MODEL in {model["id"] for model in models["data"]}
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "stream": False}
                status, answer = call(f"{base}/api/chat/completions", token, chat)
                assert status == 200, answer
                assert answer["choices"][0]["message"]["content"]
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{gated['metrics_port']}/metrics", timeout=60)
                text = metrics.read().decode()
                assert 'sparkfleet_gate_requests_total{key="open-webui",api="chat",status="200"} 1' in text, text
                # Its secret came from the settings: `serve` wrote no .webui_secret_key of its own.
                assert not (data / ".webui_secret_key").exists()
            finally:
                webui.terminate()
                webui.wait(timeout=60)
    finally:
        backend.process.terminate()
        backend.process.wait(timeout=10)
