"""The fleet's router on loopback: the real vllm-router, started with the command line of the fleet_router role's
unit (rendered by Ansible from the role's template and defaults), in front of stand-in vLLM servers, with the
role's helper (router_workers.py) registering, draining and readmitting them, the fleet's gate (fleet_gate.py, its
unit's command line) in front of the router, and the real HAProxy (Debian's package: apt-get install haproxy) with
the role's configuration in front of the gate, as on a router whose endpoint is on the network. The gate's own
behaviour (keys, limits, aliases, usage) is tested in test_fleet_gate.py. Nothing here leaves 127.0.0.1: the
role's files are rendered for a network address (192.0.2.10, a documentation address no test binds or reaches)
and HAProxy's listener is moved to 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import READY_TIMEOUT_S, ROOT, ansible_tool, log_tails, wait_until
from helpers.fleet_gate import start_gate, write_keys
from helpers.fleet_router import (
    CLIENT_KEY,
    FRONT,
    GATE_UNIT,
    KEY,
    TOOL,
    TOOL_TIMEOUT_S,
    UNIT,
    Backend,
    command_of,
    get,
    render,
    rendered,
    start_router,
)
from helpers.vllm_standin import free_port

sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from fleet_load import Load  # the same client the molecule fleet scenario uses

NETWORK_ADDRESS = "192.0.2.10"  # what the role's files are rendered for; never bound here (see the docstring)
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def router_variables(port: int, internal_port: int, metrics_port: int, gate_port: int = 18081) -> dict:
    """A router whose endpoint is on the network (NETWORK_ADDRESS:port), quick health checks, this venv's router."""
    return {
        "fleet_router_listen_address": NETWORK_ADDRESS,
        "fleet_router_port": port,
        "fleet_router_internal_port": internal_port,
        "fleet_router_gate_port": gate_port,
        "fleet_router_gate_metrics_port": free_port(),
        "fleet_router_metrics_port": metrics_port,
        "fleet_router_venv": str(Path(sys.executable).parent.parent),
        "fleet_router_health_interval_s": 1,
    }


def front_on_loopback(config: str, port: int) -> str:
    """The role's HAProxy configuration with its listener moved from NETWORK_ADDRESS to 127.0.0.1, and, when this
    test does not run as root, without the switch to Debian's haproxy user and its chroot (which need root)."""
    bind = f"    bind {NETWORK_ADDRESS}:{port}\n"
    assert bind in config, config
    config = config.replace(bind, f"    bind 127.0.0.1:{port}\n")
    if os.geteuid() != 0:
        config = re.sub(r"(?m)^    (chroot|user|group) .*\n", "", config)
    return config


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Three stand-in Sparks, vllm-router on 127.0.0.1:internal port as the unit runs it, HAProxy on 127.0.0.1:port
    with the role's configuration. "base" is the endpoint clients use (HAProxy), "admin" vllm-router itself."""
    assert Path(HAPROXY).exists(), "HAProxy is not installed: apt-get install haproxy (tests/run-all.sh does)"
    tmp = tmp_path_factory.mktemp("router")
    backends = [Backend(tmp, "qwen3-0.6b"), Backend(tmp, "qwen3-0.6b"), Backend(tmp, "model-b")]
    port, internal_port, gate_port = free_port(), free_port(), free_port()
    variables = router_variables(port, internal_port, free_port(), gate_port)
    unit = rendered(tmp, UNIT, variables)
    gate_unit = rendered(tmp, GATE_UNIT, variables)
    front = rendered(tmp, FRONT, variables)
    (tmp / "haproxy.cfg").write_text(front_on_loopback(front, port))
    checked = subprocess.run([HAPROXY, "-c", "-f", str(tmp / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # as the role's template task validates it
    router = start_router(unit, tmp / "router.log")
    write_keys(tmp / "keys.json", [{"name": "fleet", "key": CLIENT_KEY}])
    gate = start_gate(command_of(gate_unit, "ExecStart"), tmp / "keys.json", KEY, tmp / "gate.log")
    with (tmp / "haproxy.log").open("wb") as log:
        haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(tmp / "haproxy.cfg")], stdout=log, stderr=log)
    workers = tmp / "workers.json"
    workers.write_text(json.dumps([{"host": f"h{i}", "url": b.url, "model": b.model} for i, b in enumerate(backends)]))
    post = command_of(unit, "ExecStartPost")
    assert post[1] == "/usr/local/lib/sparkfleet/router_workers.py"  # where install.yml puts the role's file
    post[1], post[post.index("--workers") + 1] = str(TOOL), str(workers)
    post[post.index("--wait") + 1] = str(READY_TIMEOUT_S)  # the unit's 60 s, sized for a loaded 2-core machine
    admin, base = f"http://127.0.0.1:{internal_port}", f"http://127.0.0.1:{port}"
    logs = [tmp / "router.log", tmp / "gate.log", tmp / "haproxy.log", *(backend.log for backend in backends)]
    try:
        started = subprocess.run([sys.executable, *post[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        assert started.returncode == 0, started.stderr + log_tails([tmp / "router.log"])
        assert sorted(json.loads(started.stdout)["added"]) == sorted(b.url for b in backends)
        wait_until(lambda: get(base + "/health")[0] == 200, "HAProxy forwards /health", logs)
        yield {
            "base": base,
            "admin": admin,
            "backends": backends,
            "workers": workers,
            "unit": unit,
            "gate_unit": gate_unit,
            "gate_port": gate_port,
            "front": front,
            "post": post,
            "started": started,
            "logs": logs,
        }
    finally:
        for process in (haproxy, gate, router):
            process.terminate()
            process.wait(timeout=10)
        for backend in backends:
            if backend.process.poll() is None:
                backend.process.terminate()
                backend.process.wait(timeout=10)


def tool(base: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(TOOL), args[0], "--router", base, *args[1:]],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def health_of(base: str) -> dict[str, bool]:
    return {w["url"]: w["is_healthy"] for w in tool(base, "list")["workers"]}


def chat(base: str, model: str, key: str | None = CLIENT_KEY) -> tuple[int, str]:
    request = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
        headers={"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())["model"]
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_unit_runs_the_router_in_multi_model_mode_with_health_checks_and_retries(fleet):
    argv = command_of(fleet["unit"], "ExecStart")
    assert argv[0].endswith("/bin/vllm-router") and "--enable-igw" in argv
    assert KEY not in fleet["unit"] and "--api-key" not in argv  # the gate holds the Sparks' key, not the router
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--health-failure-threshold") + 1] == "2"
    assert argv[argv.index("--retry-max-retries") + 1] == "5"
    assert argv[argv.index("--cb-timeout-duration-secs") + 1] == "2"  # health interval 1 s x 2 successes


def test_behind_haproxy_the_router_and_its_helper_keep_to_loopback(fleet):
    argv, post = command_of(fleet["unit"], "ExecStart"), command_of(fleet["unit"], "ExecStartPost")
    internal = fleet["admin"].rsplit(":", 1)[1]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == internal
    assert post[post.index("--router") + 1] == fleet["admin"]
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"  # metrics: on their own loopback address


def test_the_default_endpoint_is_the_gate_on_loopback_in_front_of_vllm_router(tmp_path):
    """No listen address in the inventory: the endpoint is the gate itself on 127.0.0.1:8080 (no HAProxy), in front
    of vllm-router on 127.0.0.1:18080; the usage metrics on 127.0.0.1:29001."""
    unit, gate_unit = rendered(tmp_path, UNIT, {}), rendered(tmp_path, GATE_UNIT, {})
    argv, post = command_of(unit, "ExecStart"), command_of(unit, "ExecStartPost")
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "18080"
    assert post[post.index("--router") + 1] == "http://127.0.0.1:18080"
    gate = command_of(gate_unit, "ExecStart")
    assert gate[gate.index("--listen") + 1] == "127.0.0.1:8080"
    assert gate[gate.index("--upstream") + 1] == "http://127.0.0.1:18080"
    assert gate[gate.index("--metrics") + 1] == "127.0.0.1:29001"
    assert "EnvironmentFile=/etc/sparkfleet/router/spark-key.env" in gate_unit and "User=sparkfleet-gate" in gate_unit


# vllm-router's admin and internal paths (its server.rs: /workers and /workers/{url}, the legacy /add_worker,
# /remove_worker, /list_workers, /flush_cache, /get_loads, and /get_server_info, /get_model_info, /health_generate),
# what it would pass on to a Spark unchecked (vLLM's key guards /v1 only: /metrics, /tokenize, /sleep ...), and the
# spellings that could reach them from an allowed prefix.
REFUSED = [
    ("GET", "/workers"),
    ("POST", "/workers"),
    ("DELETE", "/workers/" + urllib.parse.quote("http://127.0.0.1:9", safe="")),
    ("GET", "/workers/" + urllib.parse.quote("http://127.0.0.1:9", safe="")),
    ("POST", "/add_worker?url=http://127.0.0.1:9"),
    ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/list_workers"),
    ("POST", "/flush_cache"),
    ("GET", "/get_loads"),
    ("GET", "/get_server_info"),
    ("GET", "/get_model_info"),
    ("GET", "/health_generate"),
    ("GET", "/metrics"),
    ("POST", "/tokenize"),
    ("POST", "/sleep"),
    ("GET", "/"),
    ("GET", "/v1/../workers"),
    ("GET", "/v1/%2e%2e/workers"),
    ("GET", "//workers"),
    ("GET", "/v1//workers"),
    ("GET", "/health/../workers"),
    ("GET", "/WORKERS"),
]


def raw_status(port: int, method: str, path: str, body: bytes = b"") -> int:
    """The status of one request sent byte for byte (urllib would tidy "/v1/../workers" into "/workers")."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        connection.putheader("authorization", f"Bearer {CLIENT_KEY}")
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_the_endpoint_refuses_the_admin_api_and_every_other_path(fleet, method, path):
    port = int(fleet["base"].rsplit(":", 1)[1])
    body = json.dumps({"url": "http://127.0.0.1:9", "model_id": "qwen3-0.6b"}).encode() if method == "POST" else b""
    assert raw_status(port, method, path, body) == 403


def test_a_refused_worker_is_not_added_and_the_admin_api_still_answers_on_loopback(fleet):
    base, admin = fleet["base"], fleet["admin"]
    intruder = {"url": "http://127.0.0.1:9", "model_id": "qwen3-0.6b"}
    assert get(base + "/workers", key=CLIENT_KEY, method="POST", body=intruder)[0] == 403
    assert get(base + "/workers", key=CLIENT_KEY)[0] == 403
    status, text = get(admin + "/workers")  # what router_workers.py uses, on vllm-router's own loopback port
    assert status == 200
    held = {worker["url"] for worker in json.loads(text)["workers"]}
    assert intruder["url"] not in held and {backend.url for backend in fleet["backends"]} <= held


def test_the_endpoint_forwards_the_openai_api_and_health(fleet):
    base = fleet["base"]
    assert get(base + "/health")[0] == 200
    assert get(base + "/v1/models", key=CLIENT_KEY)[0] == 200
    assert chat(base, "qwen3-0.6b") == (200, "qwen3-0.6b")
    assert chat(base, "qwen3-0.6b", key=None)[0] == 401  # through HAProxy too, the gate checks the key


def test_a_streamed_answer_comes_through_haproxy_whole(fleet):
    body = {"model": "qwen3-0.6b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True}
    request = urllib.request.Request(
        fleet["base"] + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    assert text.rstrip().endswith("data: [DONE]") and text.count("data: ") > 2


def test_haproxys_timeouts_suit_long_answers(fleet):
    front = fleet["front"]
    assert "timeout server 1800s" in front and "timeout client 1800s" in front
    assert f"server fleet_gate 127.0.0.1:{fleet['gate_port']}" in front


def test_each_model_is_reached_by_its_name_and_only_with_the_key(fleet):
    base = fleet["base"]
    assert chat(base, "qwen3-0.6b") == (200, "qwen3-0.6b")
    assert chat(base, "model-b") == (200, "model-b")
    status, _ = chat(base, "qwen3-0.6b", key=None)
    assert status == 401  # the gate refuses a request without a key of its list
    status, _ = chat(base, "qwen3-0.6b", key="wrong")
    assert status == 401
    status, _ = chat(base, "qwen3-0.6b", key=KEY)
    assert status == 401  # the Sparks' own key is no client key
    assert chat(base, "qwen3-0.6b") == (200, "qwen3-0.6b")  # refusals eject no backend


def test_a_second_sync_changes_nothing_and_a_stale_worker_is_removed(fleet):
    admin = fleet["admin"]
    assert tool(admin, "sync", "--workers", str(fleet["workers"])) == {"added": [], "removed": []}
    stale = "http://127.0.0.1:9"  # registered by hand, in no worker list: sync takes it out
    tool(admin, "add", "--url", stale, "--model", "qwen3-0.6b", "--wait", "0.5")
    assert stale in health_of(admin)
    assert tool(admin, "sync", "--workers", str(fleet["workers"])) == {"added": [], "removed": [stale]}
    assert stale not in health_of(admin)


def test_a_killed_backend_is_ejected_and_no_request_sent_after_the_kill_fails(fleet):
    base, admin, victim, logs = fleet["base"], fleet["admin"], fleet["backends"][0], fleet["logs"]
    with Load(base, CLIENT_KEY, "qwen3-0.6b") as load:
        wait_until(lambda: load.ok > 0, "the load's first answers", logs)
        killed_at = time.monotonic()
        victim.kill()
        wait_until(lambda: health_of(admin)[victim.url] is False, "the router ejects the killed backend", logs)
        time.sleep(2)
        victim.start()
        wait_until(lambda: health_of(admin)[victim.url] is True, "the router readmits the backend", logs)
        served = victim.requests_served()
        wait_until(lambda: victim.requests_served() > served, "the readmitted backend serves requests again", logs)
        # A count of answers, not a rate: the load runs until it has had them, however slow the machine.
        wait_until(lambda: load.ok > 20, "more than 20 answers through the router", logs)
    # Only an answer the killed server was in the middle of can be lost (a stream cannot be retried half sent).
    assert all(began < killed_at for began in load.failed_started), load.failures
    assert len(load.failures) <= load.workers and load.ok > 20, (load.ok, load.failures[:5])


def test_a_drained_backend_gets_no_request_until_it_is_admitted_again(fleet):
    base, admin, drained = fleet["base"], fleet["admin"], fleet["backends"][1]
    assert tool(admin, "remove", "--url", drained.url) == {"added": [], "removed": [drained.url]}
    before = drained.requests_served()
    with Load(base, CLIENT_KEY, "qwen3-0.6b") as load:
        wait_until(lambda: load.ok > 10 or load.failures, "more than 10 answers through the router", fleet["logs"])
    assert load.failures == [] and load.ok > 10
    assert drained.requests_served() == before
    admitted = tool(admin, "add", "--url", drained.url, "--model", "qwen3-0.6b", "--wait", str(READY_TIMEOUT_S))
    assert admitted == {"added": [drained.url], "removed": [], "healthy": True}
    assert tool(admin, "remove", "--url", "http://127.0.0.1:9") == {"added": [], "removed": []}  # absent: no-op


def test_haproxy_serves_tls_with_the_certificate_it_is_given(tmp_path):
    """fleet_router_tls_certificate: the rendered listener ends TLS with that file, and HAProxy's own check of the
    configuration (the role's template task runs it) refuses a certificate that is not there."""
    variables = router_variables(8080, 18080, 29000) | {"fleet_router_tls_certificate": str(tmp_path / "fleet.pem")}
    front = rendered(tmp_path, FRONT, variables)
    assert f"bind {NETWORK_ADDRESS}:8080 ssl crt {tmp_path / 'fleet.pem'} alpn h2,http/1.1" in front
    checked = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode != 0 and "fleet.pem" in checked.stdout + checked.stderr


def test_the_unit_template_refuses_a_line_break_even_without_preflight(tmp_path):
    """The second line behind preflight: systemd_word will not write a value that would start a new directive."""
    # (A listen address with a line break is no loopback address, so the unit would bind 127.0.0.1 behind HAProxy:
    # the metrics address reaches the unit whatever the layout.)
    done, dest = render(tmp_path, UNIT, {"fleet_router_metrics_address": "127.0.0.1\nExecStartPre=/bin/sh -c id"})
    assert done.returncode != 0 and "control character" in done.stdout + done.stderr
    assert not dest.exists()


def run_validate(tmp: Path, overrides: dict, *options: str) -> subprocess.CompletedProcess:
    """The role's `validate` entry point (what the preflight play runs) on this machine as the router."""
    inventory = tmp / "hosts.yml"
    hosts = {"sparks": {"hosts": {"spark-1": {}}}, "router": {"hosts": {"localhost": {}}}}
    connection = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"vars": connection, "children": hosts}}))
    playbook = tmp / "validate.yml"
    task = {"ansible.builtin.include_role": {"name": "fleet_router", "tasks_from": "validate"}}
    playbook.write_text(json.dumps([{"hosts": "router", "gather_facts": False, "tasks": [task]}]))
    overrides = {"sparkfleet_api_key": CLIENT_KEY, **overrides}
    argv = [ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook), "-e", json.dumps(overrides)]
    argv += options
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(
    "address",
    ["10.0.0.5\nExecStartPre=/bin/sh -c id", "10.0.0.5 --api-key stolen", "0.0.0.0\n", "router.example"],
)
def test_preflight_refuses_a_listen_address_that_is_no_ip_address(tmp_path, address):
    done = run_validate(tmp_path, {"fleet_router_listen_address": address})
    out = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert "Bad input, nothing was changed" in out and "fleet_router_listen_address=" in out, done.stdout[-2000:]


# Open WebUI on, with settings preflight passes (test_preflight_passes_a_network_address_and_the_defaults).
WEBUI = {
    "fleet_router_webui": True,
    "fleet_router_webui_key": "open-webui-key-0123456789",
    "fleet_router_webui_secret_key": "webui-session-secret-0123456789abcdef",
    "fleet_router_webui_admin_email": "admin@fleet.example",
    "fleet_router_webui_admin_password": "admin-password-0123",
}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fleet_router_internal_port": 8080}, "must be different TCP ports"),
        ({"fleet_router_gate_port": 29000}, "must be different TCP ports"),
        (WEBUI | {"fleet_router_webui_port": 29001}, "fleet_router_webui_port (29001) must be different TCP ports"),
        (WEBUI | {"fleet_router_webui_secret_key": ""}, "fleet_router_webui_secret_key is empty"),
        (WEBUI | {"fleet_router_listen_address": NETWORK_ADDRESS}, "set fleet_router_tls_certificate"),
        ({"fleet_router_keys": []}, "fleet_router_keys is empty, so no one could use the endpoint"),
        ({"fleet_router_spark_key": ""}, "fleet_router_spark_key is empty"),
        ({"fleet_router_tls_certificate": "/etc/fleet.pem"}, "is on loopback"),
        ({"fleet_router_tls_certificate": "/etc/fleet .pem"}, "fleet_router_tls_certificate='/etc/fleet .pem'"),
        ({"fleet_router_backend_addresses": {"spark-1": "spark 1"}}, "fleet_router_backend_addresses.spark-1="),
        ({"fleet_router_health_interval_s": 0}, "fleet_router_health_interval_s=0 is less than 1"),
    ],
)
def test_preflight_names_the_variable_at_fault(tmp_path, overrides, message):
    done = run_validate(tmp_path, overrides)
    assert done.returncode != 0
    assert message in " ".join(done.stdout.split()), done.stdout[-2000:]
    for secret in ("open-webui-key-0123456789", "webui-session-secret", "admin-password-0123"):
        assert secret not in done.stdout + done.stderr


def test_preflight_passes_a_network_address_and_the_defaults(tmp_path):
    for overrides in (
        {},
        {"fleet_router_listen_address": NETWORK_ADDRESS},
        {"fleet_router_listen_address": "::"},
        WEBUI,
    ):
        done = run_validate(tmp_path, overrides)
        assert done.returncode == 0, done.stdout[-2000:]


def test_preflight_shows_no_key_even_verbose_and_warns_about_a_shared_one(tmp_path):
    """fleet_router_keys and the Sparks' key through the validate entry point at -vvv: a bad entry is named, the
    shared key is warned about, and no key appears in the output."""
    keys = [
        {"name": "fleet", "key": CLIENT_KEY},  # the default's shape: a client key that is the Sparks' key
        {"name": "alice", "key": "alice-key-0123456789"},
        {"name": "bob", "key": "bob-short"},
    ]
    done = run_validate(tmp_path, {"fleet_router_keys": keys, "fleet_router_spark_key": CLIENT_KEY}, "-vvv")
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "fleet_router_keys[2] (bob).key is shorter than 16 characters" in " ".join(
        out.split()
    )
    for key in (CLIENT_KEY, "alice-key-0123456789", "bob-short"):
        assert key not in out
    good = run_validate(tmp_path, {"fleet_router_keys": keys[:2], "fleet_router_spark_key": CLIENT_KEY}, "-vvv")
    out = good.stdout + good.stderr
    assert good.returncode == 0, out[-2000:]
    said = " ".join(out.split()).replace("''", "'")  # the YAML callback doubles a quote in a quoted string
    assert "fleet_router_keys[0] (fleet) is the Sparks' own key" in said
    assert CLIENT_KEY not in out and "alice-key-0123456789" not in out
