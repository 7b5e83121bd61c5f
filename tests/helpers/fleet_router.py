"""The fleet_router role's files run on loopback: its templates rendered by Ansible from the role's defaults,
stand-in vLLM servers as its Sparks, the command lines of its units (vllm-router, the gate) taken from those
renderings. Shared by test_fleet_router.py and test_fleet_gate.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from helpers import READY_TIMEOUT_S, ROOT, ansible_tool, wait_until
from helpers.vllm_standin import VLLM, free_port

ROLE = ROOT / "roles" / "fleet_router"
TOOL = ROLE / "files" / "router_workers.py"
KEY = "fleet-key"  # the Sparks' key, which the gate sends
CLIENT_KEY = "fleet-client-key-0123"  # the key clients send the gate (the named key "fleet")
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


def get(url: str, key: str | None = None, method: str = "GET", body: object | None = None) -> tuple[int, str]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        headers["content-type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def render(tmp: Path, template: str, variables: dict) -> tuple[subprocess.CompletedProcess, Path]:
    """Ansible's run of one of the role's templates (path under templates/) with the role's defaults and internal
    variables and VARIABLES over them, and where it writes the file."""
    dest = tmp / Path(template).name.removesuffix(".j2")
    variables = {**variables, "ansible_python_interpreter": sys.executable}
    argv = [ansible_tool("ansible"), "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.template"]
    argv += ["-a", f"src={ROLE}/templates/{template} dest={dest}"]
    argv += ["-e", f"@{ROLE}/defaults/main.yml", "-e", f"@{ROLE}/vars/main.yml", "-e", json.dumps(variables)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120), dest


def rendered(tmp: Path, template: str, variables: dict) -> str:
    """The text of one of the role's templates, rendered as render() does."""
    done, dest = render(tmp, template, variables)
    assert done.returncode == 0, done.stdout + done.stderr
    return dest.read_text()


UNIT = "etc/systemd/system/sparkfleet-router.service.j2"
GATE_UNIT = "etc/systemd/system/sparkfleet-gate.service.j2"
FRONT = "etc/haproxy/haproxy.cfg.j2"


def command_of(unit: str, key: str) -> list[str]:
    """The argv of one Exec line of a unit, continuation lines joined."""
    joined = unit.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.startswith(key + "="))
    return shlex.split(line.split("=", 1)[1])


def start_router(unit: str, log: Path) -> subprocess.Popen:
    """vllm-router with the command line of the role's unit."""
    with log.open("ab") as handle:
        return subprocess.Popen(command_of(unit, "ExecStart"), stdout=handle, stderr=subprocess.STDOUT)
