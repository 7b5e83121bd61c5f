"""The fleet's router on loopback: the real vllm-router, started with the command line of the fleet_router role's
unit (rendered by Ansible from the role's template and defaults), in front of stand-in vLLM servers, with the
role's helper (router_workers.py) registering, draining and readmitting them. Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import READY_TIMEOUT_S, ROOT, ansible_tool, log_tails, wait_until
from helpers.vllm_standin import VLLM, free_port

sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from fleet_load import Load  # the same client the molecule fleet scenario uses

ROLE = ROOT / "roles" / "fleet_router"
TOOL = ROLE / "files" / "router_workers.py"
KEY = "fleet-key"
TOOL_TIMEOUT_S = READY_TIMEOUT_S + 60  # router_workers.py waits up to --wait itself
STANDIN_ENV = {"VLLM_STANDIN_LOAD_SECONDS": "0.3", "VLLM_STANDIN_DECODE_TOK_S": "200"}


class Backend:
    """One stand-in vLLM on loopback that can be killed and started again on the same port."""

    def __init__(self, tmp: Path, model: str) -> None:
        self.model, self.port, self.tmp = model, free_port(), tmp
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"backend-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        argv = [str(VLLM), "serve", "org/" + self.model, "--served-model-name", self.model, "--api-key", KEY]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        with self.log.open("ab") as log:
            env = {**os.environ, **STANDIN_ENV}
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: get(self.url + "/health")[0] == 200, f"backend {self.url} healthy", [self.log])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def requests_served(self) -> float:
        text = get(self.url + "/metrics")[1]
        return sum(float(value) for value in re.findall(r"(?m)^vllm:request_success_total\{[^}]*\} (\S+)$", text))


def get(url: str, key: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def rendered_unit(tmp: Path, port: int) -> str:
    """The role's unit file for a router on 127.0.0.1:port, rendered by Ansible with the role's defaults."""
    dest = tmp / "sparkfleet-router.service"
    variables = {"fleet_router_listen_address": "127.0.0.1", "fleet_router_port": port}
    variables |= {
        "fleet_router_metrics_port": free_port(),
        "fleet_router_venv": str(Path(sys.executable).parent.parent),
    }
    variables |= {"fleet_router_health_interval_s": 1, "ansible_python_interpreter": sys.executable}
    argv = [ansible_tool("ansible"), "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.template"]
    argv += ["-a", f"src={ROLE}/templates/etc/systemd/system/sparkfleet-router.service.j2 dest={dest}"]
    argv += ["-e", f"@{ROLE}/defaults/main.yml", "-e", f"@{ROLE}/vars/main.yml", "-e", json.dumps(variables)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return dest.read_text()


def command_of(unit: str, key: str) -> list[str]:
    """The argv of one Exec line of a unit, continuation lines joined."""
    joined = unit.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.startswith(key + "="))
    return shlex.split(line.split("=", 1)[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("router")
    backends = [Backend(tmp, "qwen3-0.6b"), Backend(tmp, "qwen3-0.6b"), Backend(tmp, "model-b")]
    port = free_port()
    unit = rendered_unit(tmp, port)
    with (tmp / "router.log").open("wb") as log:
        router = subprocess.Popen(command_of(unit, "ExecStart"), stdout=log, stderr=subprocess.STDOUT)
    workers = tmp / "workers.json"
    workers.write_text(json.dumps([{"host": f"h{i}", "url": b.url, "model": b.model} for i, b in enumerate(backends)]))
    post = command_of(unit, "ExecStartPost")
    assert post[1] == "/usr/local/lib/sparkfleet/router_workers.py"  # where install.yml puts the role's file
    post[1], post[post.index("--workers") + 1] = str(TOOL), str(workers)
    post[post.index("--wait") + 1] = str(READY_TIMEOUT_S)  # the unit's 60 s, sized for a loaded 2-core machine
    base = f"http://127.0.0.1:{port}"
    try:
        started = subprocess.run([sys.executable, *post[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        assert started.returncode == 0, started.stderr + log_tails([tmp / "router.log"])
        assert sorted(json.loads(started.stdout)["added"]) == sorted(b.url for b in backends)
        logs = [tmp / "router.log", *(backend.log for backend in backends)]
        yield {"base": base, "backends": backends, "workers": workers, "unit": unit, "started": started, "logs": logs}
    finally:
        router.terminate()
        router.wait(timeout=10)
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


def chat(base: str, model: str, key: str | None = KEY) -> tuple[int, str]:
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
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--health-failure-threshold") + 1] == "2"
    assert argv[argv.index("--retry-max-retries") + 1] == "5"
    assert argv[argv.index("--cb-timeout-duration-secs") + 1] == "2"  # health interval 1 s x 2 successes


def test_each_model_is_reached_by_its_name_and_only_with_the_key(fleet):
    base = fleet["base"]
    assert chat(base, "qwen3-0.6b") == (200, "qwen3-0.6b")
    assert chat(base, "model-b") == (200, "model-b")
    status, _ = chat(base, "qwen3-0.6b", key=None)
    assert status == 401  # the router forwards the key; the Spark refuses a request without it
    status, _ = chat(base, "qwen3-0.6b", key="wrong")
    assert status == 401
    assert chat(base, "qwen3-0.6b") == (200, "qwen3-0.6b")  # refusals eject no backend


def test_a_second_sync_changes_nothing_and_a_stale_worker_is_removed(fleet):
    base = fleet["base"]
    assert tool(base, "sync", "--workers", str(fleet["workers"])) == {"added": [], "removed": []}
    stale = "http://127.0.0.1:9"  # registered by hand, in no worker list: sync takes it out
    tool(base, "add", "--url", stale, "--model", "qwen3-0.6b", "--wait", "0.5")
    assert stale in health_of(base)
    assert tool(base, "sync", "--workers", str(fleet["workers"])) == {"added": [], "removed": [stale]}
    assert stale not in health_of(base)


def test_a_killed_backend_is_ejected_and_no_request_sent_after_the_kill_fails(fleet):
    base, victim, logs = fleet["base"], fleet["backends"][0], fleet["logs"]
    with Load(base, KEY, "qwen3-0.6b") as load:
        wait_until(lambda: load.ok > 0, "the load's first answers", logs)
        killed_at = time.monotonic()
        victim.kill()
        wait_until(lambda: health_of(base)[victim.url] is False, "the router ejects the killed backend", logs)
        time.sleep(2)
        victim.start()
        wait_until(lambda: health_of(base)[victim.url] is True, "the router readmits the backend", logs)
        served = victim.requests_served()
        wait_until(lambda: victim.requests_served() > served, "the readmitted backend serves requests again", logs)
        # A count of answers, not a rate: the load runs until it has had them, however slow the machine.
        wait_until(lambda: load.ok > 20, "more than 20 answers through the router", logs)
    # Only an answer the killed server was in the middle of can be lost (a stream cannot be retried half sent).
    assert all(began < killed_at for began in load.failed_started), load.failures
    assert len(load.failures) <= load.workers and load.ok > 20, (load.ok, load.failures[:5])


def test_a_drained_backend_gets_no_request_until_it_is_admitted_again(fleet):
    base, drained = fleet["base"], fleet["backends"][1]
    assert tool(base, "remove", "--url", drained.url) == {"added": [], "removed": [drained.url]}
    before = drained.requests_served()
    with Load(base, KEY, "qwen3-0.6b") as load:
        wait_until(lambda: load.ok > 10 or load.failures, "more than 10 answers through the router", fleet["logs"])
    assert load.failures == [] and load.ok > 10
    assert drained.requests_served() == before
    admitted = tool(base, "add", "--url", drained.url, "--model", "qwen3-0.6b", "--wait", str(READY_TIMEOUT_S))
    assert admitted == {"added": [drained.url], "removed": [], "healthy": True}
    assert tool(base, "remove", "--url", "http://127.0.0.1:9") == {"added": [], "removed": []}  # absent: no-op
