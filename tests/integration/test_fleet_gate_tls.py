"""The official openai and anthropic SDKs over TLS, as clients on the network reach the fleet: through the role's
HAProxy front (its configuration rendered for a network endpoint with a certificate, its listener moved to
127.0.0.1), the fleet's gate and the real vllm-router, to a stand-in Spark. Chat, Responses and Anthropic Messages,
streamed and not, and count_tokens, with Bearer and with x-api-key (tests/helpers/agent_clients.py, run by the vLLM
engine venv's Python, which has both SDKs). The SDKs trust the test's self-signed certificate through SSL_CERT_FILE
(which httpx, under both, reads) and refuse the endpoint without it. The same calls against the real engine:
test_fleet_gate_real_engine.py. Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from helpers import READY_TIMEOUT_S, ROOT, log_tails, wait_until
from helpers.fleet_gate import gated_router
from helpers.fleet_router import FRONT, KEY, Backend, rendered
from helpers.vllm_engine import engine_python
from helpers.vllm_standin import free_port
from test_monitoring_rules import self_signed

CLIENTS = ROOT / "tests" / "helpers" / "agent_clients.py"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
NETWORK_ADDRESS = "192.0.2.10"  # what the front is rendered for; never bound here
MODEL = "qwen3-0.6b"
AGENTS_KEY = "agents-tls-key-0123456789"


def tls_front(tmp: Path, port: int, gate_port: int, pem: Path) -> Path:
    """The role's HAProxy configuration for a network endpoint with TLS, forwarding to the gate on GATE_PORT, its
    listener moved to 127.0.0.1 (and, when not root, without the switch to Debian's haproxy user and chroot)."""
    variables = {
        "fleet_router_listen_address": NETWORK_ADDRESS,
        "fleet_router_port": port,
        "fleet_router_gate_port": gate_port,
        "fleet_router_tls_certificate": str(pem),
    }
    front = rendered(tmp, FRONT, variables)
    bind = f"    bind {NETWORK_ADDRESS}:{port} ssl crt {pem} alpn h2,http/1.1\n"
    assert bind in front, front
    front = front.replace(bind, bind.replace(NETWORK_ADDRESS, "127.0.0.1"))
    if os.geteuid() != 0:
        front = re.sub(r"(?m)^    (chroot|user|group) .*\n", "", front)
    config = tmp / "haproxy-tls.cfg"
    config.write_text(front)
    return config


def gate_tokens(metrics_port: int) -> dict[tuple[str, str], float]:
    """The gate's token counters for key "agents": {(api, prompt|completion): count}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60) as response:
        text = response.read().decode()
    found = re.findall(
        r'^sparkfleet_gate_(prompt|completion)_tokens_total\{key="agents",api="(\w+)"\} (\S+)$', text, re.M
    )
    return {(api, kind): float(value) for kind, api, value in found}


def test_the_sdks_work_over_tls_through_haproxy_the_gate_and_the_router(tmp_path):
    python = engine_python()
    assert Path(HAPROXY).exists(), "HAProxy is not installed: apt-get install haproxy (tests/run-all.sh does)"
    cert, key = self_signed(tmp_path)
    pem = tmp_path / "front.pem"  # HAProxy's one PEM file: the certificate, its chain and its key
    pem.write_text(cert.read_text() + key.read_text())
    backend = Backend(tmp_path, MODEL)  # a stand-in Spark checking the Sparks' key
    try:
        workers = [{"host": "spark-a", "url": backend.url, "model": MODEL}]
        with gated_router(tmp_path, workers, [{"name": "agents", "key": AGENTS_KEY}], {}, KEY) as gated:
            port = free_port()
            config = tls_front(tmp_path, port, gated["port"], pem)
            checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            logs = [tmp_path / "haproxy.log", *gated["logs"], backend.log]
            with logs[0].open("wb") as log:
                haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=log)
            base = f"https://127.0.0.1:{port}"
            trusted = ssl.create_default_context(cafile=str(cert))
            try:
                health = lambda: urllib.request.urlopen(base + "/health", timeout=5, context=trusted).status == 200  # noqa: E731
                wait_until(health, "the endpoint answers over TLS", logs)
                argv = [str(python), str(CLIENTS), base, AGENTS_KEY, MODEL]
                env = {**os.environ, "SSL_CERT_FILE": str(cert)}
                done = subprocess.run(argv, capture_output=True, text=True, timeout=READY_TIMEOUT_S * 2, env=env)
                assert done.returncode == 0, done.stderr[-3000:] + log_tails(logs)
                calls = json.loads(done.stdout)
                failed = {name: call["error"] for name, call in calls.items() if "error" in call}
                assert not failed, json.dumps(failed, indent=1) + log_tails(logs)
                assert all(call["text"] for name, call in calls.items() if name != "count_tokens"), calls
                # The gate counted each API's tokens as the SDKs read them from the answers (count_tokens: none),
                # once the Spark's side of each answer ended, which can be a moment after the client's last read.
                expected: dict[tuple[str, str], float] = {}
                for name, call in calls.items():
                    if name != "count_tokens":
                        for kind in ("prompt", "completion"):
                            expected[(call["api"], kind)] = expected.get((call["api"], kind), 0) + call[kind]
                counted = lambda: gate_tokens(gated["metrics_port"]) == expected  # noqa: E731
                wait_until(counted, f"the gate's token counters {expected}", logs)
                # Without the certificate's CA the SDKs refuse the endpoint.
                untrusted = {key: value for key, value in os.environ.items() if key != "SSL_CERT_FILE"}
                refused = subprocess.run(argv, capture_output=True, text=True, timeout=READY_TIMEOUT_S, env=untrusted)
                errors = [call.get("error", "") for call in json.loads(refused.stdout).values()]
                assert errors and all("APIConnectionError" in error for error in errors), errors
            finally:
                haproxy.terminate()
                haproxy.wait(timeout=10)
    finally:
        backend.process.terminate()
        backend.process.wait(timeout=10)
