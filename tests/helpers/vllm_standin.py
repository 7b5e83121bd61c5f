"""Start, stop and ask the stand-in vLLM server (tests/standins/vllm) as a process on 127.0.0.1: used by its own
tests (tests/standins/) and by the tests of what talks to a vLLM endpoint (the benchmark, the router, the
monitoring)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from helpers import ROOT

STANDIN_DIR = ROOT / "tests" / "standins" / "vllm"
VLLM = STANDIN_DIR / "vllm"
# A readiness wait sized for a loaded 2-core machine: a slow start only waits longer; a dead process fails at once.
START_TIMEOUT_S = 300.0
API_KEY = "test-key-123"
FAST = {"VLLM_STANDIN_PREFILL_TOK_S": "1000000", "VLLM_STANDIN_DECODE_TOK_S": "100000"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    started: float
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_server(tmp: Path, args: list[str], env: dict[str, str], wait: bool = True) -> Server:
    port = free_port()
    log = tmp / f"vllm-{port}.log"
    # The caller's VLLM_API_KEY only (the stand-in reads one when no --api-key is given, as vLLM does).
    environment = {**{key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}, **env}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(VLLM), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    server = Server(process=process, port=port, started=time.monotonic(), log=log)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: Server, timeout: float = START_TIMEOUT_S) -> None:
    """Until /health answers 200; a process that exits fails at once, a slow one after TIMEOUT, with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process.poll() is None, f"the stand-in exited:\n{server.log.read_text()}"
        try:
            with urllib.request.urlopen(server.base + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # refused, reset or timed out: not up yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"stand-in not healthy after {timeout} s:\n{server.log.read_text()}")


def stop_server(server: Server) -> None:
    """Stop only the process this test started."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def request(
    server: Server, method: str, path: str, body: object | None = None, key: str | None = API_KEY
) -> tuple[int, bytes, dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server.base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]
