"""The guard's runtime watch (module_utils/vllm_guard.py, `sparkfleet-vllm-guard watch`) asking real servers on
loopback: the real vLLM engine (SmolLM2) answers the canary recorded from its own greedy answer, and a wrong record
is caught; the stand-in vLLM wedged by its fault (SIGUSR1: /health stays 200, no token comes) is found wedged, while
a stand-in that is only busy (its one slot held by a long request, its token counters moving) is not. Only systemd's
and Docker's view of the unit is the test's (the container "runs"); every request is real."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.vllm_engine import SHARED_ENGINE_KEY
from helpers.vllm_standin import start_server, stop_server
from quality_checks import CanaryRecord, answer_text
from vllm_guard import Guard, Host, host_config, watch_outcome

CAPITAL = "What is the capital of France? Answer in one word."
SMOLLM2 = {"hf_repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "hf_revision": "12fd25f77366fa6b3b4b768ec3050bf629380bac"}
SETTINGS = {"margin_gib": 3.0, "drop_caches": False, "memory_wait_s": 0, "queue_wait_s": 600, "watch_period_s": 60,
            "watch_failures": 2}  # fmt: skip
# The real engine's deadline is a busy machine's; the stand-in's is short, its timing being the test's own.
ENGINE_DEADLINE_S, STANDIN_DEADLINE_S = 120, 2


class RunningUnit(Host):
    """This machine's HTTP and files; systemd and Docker report the unit's container running for an hour."""

    def __init__(self, config_dir: Path) -> None:
        super().__init__(str(config_dir))
        self.killed: list[str] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(time.time() - 3600))

    def show(self, units: list[str]) -> dict:
        return {unit: {"Id": unit, "ActiveState": "active", "SubState": "running", "NRestarts": "0"} for unit in units}

    def container_state(self, container: str) -> dict:
        return {"Running": True, "StartedAt": self.started}

    def kill(self, container: str) -> bool:
        self.killed.append(container)
        return True


def configure(
    tmp_path: Path, url: str, served: str, key: str, model: dict, deadline_s: int
) -> tuple[RunningUnit, dict]:
    (tmp_path / "m.secrets.env").write_text(f"VLLM_API_KEY='{key}'\n")
    entry = {
        "unit": f"vllm-{served}.service", "served": served, "gpu_memory_utilization": 0.2,
        "container": f"vllm-{served}", "exits": str(tmp_path / "m.exits.json"), "url": url, "api": True,
        "kind": "chat", **model,
        "secrets_file": str(tmp_path / "m.secrets.env"), "last_good": str(tmp_path / "m.last-good"),
    }  # fmt: skip
    config = host_config([entry], {**SETTINGS, "watch_deadline_s": deadline_s}, "vllm_server_models")
    (tmp_path / "guard.json").write_text(json.dumps(config))
    return RunningUnit(tmp_path), config


def record(tmp_path: Path, model: dict, answers: dict[str, str], max_tokens: int = 64) -> None:
    text = CanaryRecord({**model, "max_tokens": max_tokens}, answers).to_json()
    (tmp_path / "m.last-good.canaries.json").write_text(text)


def chat(url: str, key: str, served: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": served, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def test_the_real_engine_passes_the_watch_with_its_own_recorded_canary_and_a_wrong_record_fails(
    smollm2_engine, tmp_path
):
    host, config = configure(tmp_path, smollm2_engine, "smollm2", SHARED_ENGINE_KEY, SMOLLM2, ENGINE_DEADLINE_S)
    entry = config["units"][0]
    running = host.show([entry["unit"]])[entry["unit"]]
    # No record yet: a one-token greedy generation, asked with the key read from the unit's secrets file.
    tiny = watch_outcome(host, config, entry, running, host.container_state(entry["container"]))
    assert tiny["outcome"] == "passed" and tiny["canary"] is False, tiny
    # The gate's record of the engine's own greedy answer (as vllm_quality_gate writes it): held word for word.
    record(tmp_path, SMOLLM2, {CAPITAL: answer_text(chat(smollm2_engine, SHARED_ENGINE_KEY, "smollm2", CAPITAL, 64))})
    held = watch_outcome(host, config, entry, running, host.container_state(entry["container"]))
    assert held["outcome"] == "passed" and held["canary"] is True, held
    # A record for another revision is not this model's: the tiny generation again.
    record(tmp_path, {**SMOLLM2, "hf_revision": "0" * 40}, {CAPITAL: "Lyon"})
    assert watch_outcome(host, config, entry, running, host.container_state(entry["container"]))["canary"] is False
    # A thinking model's record (its reasoning budget) is too dear to ask every period.
    record(tmp_path, SMOLLM2, {CAPITAL: "Lyon"}, max_tokens=1024)
    assert watch_outcome(host, config, entry, running, host.container_state(entry["container"]))["canary"] is False
    record(tmp_path, SMOLLM2, {CAPITAL: "Lyon"})
    wrong = watch_outcome(host, config, entry, running, host.container_state(entry["container"]))
    assert wrong["outcome"] == "failed" and "expected 'Lyon'" in wrong["reason"], wrong


@pytest.fixture
def standin(tmp_path):
    env = {"VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_DECODE_TOK_S": "40", "VLLM_STANDIN_OUTPUT_TOKENS": "400"}
    server = start_server(tmp_path, ["org/model", "--served-model-name", "standin", "--api-key", "k",
                                     "--max-num-seqs", "1"], env)  # fmt: skip
    try:
        yield server
    finally:
        stop_server(server)


def running_line(url: str) -> str:
    """/metrics' line of vllm:num_requests_running when one request runs."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return next((line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")
                 and line.endswith(" 1.0")), "")  # fmt: skip


def test_a_wedged_engine_is_found_and_killed_at_the_threshold_and_a_busy_one_is_not(standin, tmp_path):
    host, config = configure(tmp_path, standin.base, "standin", "k", SMOLLM2, STANDIN_DEADLINE_S)
    guard = Guard(host, metrics_file=str(tmp_path / "guard.prom"), state_dir=str(tmp_path / "run"))
    unit = config["units"][0]["unit"]
    assert guard.watch()[1] == [] and guard.watch_state(unit)["failures"] == 0

    # Busy: the one slot (--max-num-seqs 1) holds a 200-token answer at 40 tokens/s (5 s); the probe waits in line
    # past its deadline, but the engine's token counters move meanwhile.
    long = threading.Thread(target=chat, args=(standin.base, "k", "standin", "Count slowly", 200))
    long.start()
    try:
        deadline = time.monotonic() + 60
        while "vllm:num_requests_running{" not in running_line(standin.base) and time.monotonic() < deadline:
            time.sleep(0.1)
        _, lines = guard.watch()
        assert guard.watch_state(unit)["last"]["outcome"] == "busy", lines
        assert guard.watch_state(unit)["failures"] == 0 and host.killed == []
    finally:
        long.join()

    # Wedged: /health stays 200, no token comes, the counters stand still.
    standin.process.send_signal(signal.SIGUSR1)
    _, lines = guard.watch()
    state = guard.watch_state(unit)
    assert state["last"]["outcome"] == "failed" and "wedged" in state["last"]["reason"], lines
    assert state["failures"] == 1 and host.killed == [] and "(1 of 2 in a row)" in lines[0]
    metrics = (tmp_path / "guard.prom").read_text()
    assert f'sparkfleet_vllm_unit_watch_failures{{unit="{unit}",served="standin"}} 1' in metrics
    # The second failure in a row kills the container (systemd restarts the unit); the exit record will say why.
    _, lines = guard.watch()
    assert host.killed == ["vllm-standin"] and any("restarts: its container was killed" in line for line in lines)
    assert "wedged" in (tmp_path / "run" / f"{unit}.watch-kill").read_text()
    exited = guard.exited(unit, {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "137"})
    assert "killed by the runtime watch" in exited[1]
    document = json.loads((tmp_path / "m.exits.json").read_text())
    assert document["watch_restarts_total"] == 1 and "wedged" in document["records"][-1]["watch"]
    assert not (tmp_path / "run" / f"{unit}.watch-kill").exists()
    metrics = (tmp_path / "guard.prom").read_text()
    assert f'sparkfleet_vllm_unit_watch_restarts_total{{unit="{unit}",served="standin"}} 1' in metrics
