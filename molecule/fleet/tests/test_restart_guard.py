"""The guard between runs (module_utils/vllm_guard.py) on fleet-3, a single Spark serving two models (qwen3-0.6b on
8000, then qwen3-embedding-0.6b on 8001) through the stand-in vLLM and the real Docker and systemd: the engine killed
in the middle of a stream (recorded, restarted, healthy again), a start that fails every time (the budget stops it
after its tries, the host stays responsive, the router leaves it out), memory that is not there (refused before any
container starts, no loop), a real reboot of the simulated Spark (its two models back one after another, each
checked), and a wedge (the stand-in's fault: /health stays 200, no token comes) found by the runtime watch in two
probes, restarted, out of the router until it answers again. The scenario's restart delays are short (molecule.yml:
vllm_server_restart_delay_s 5, max 20 s), and so is the watch's deadline (5 s).

Runs after test_model_weights.py (file order), which reads the counters of fleet-3's first start, and leaves both
units healthy again for the router's tests after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testinfra

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from playbook_runs import run_site, said

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
SPARK = testinfra.get_host(f"ansible://fleet-3?ansible_inventory={INVENTORY}")
ROUTER = testinfra.get_host(f"ansible://fleet-router?ansible_inventory={INVENTORY}")
CHAT, EMBED = "vllm-qwen3-0.6b.service", "vllm-qwen3-embedding-0.6b.service"
PORTS = {CHAT: 8000, EMBED: 8001}
CONFIG_DIR = "/etc/sparkfleet/vllm"
GUARD_CONFIG = f"{CONFIG_DIR}/guard.json"
EXITS = {CHAT: f"{CONFIG_DIR}/qwen3-0.6b.exits.json", EMBED: f"{CONFIG_DIR}/qwen3-embedding-0.6b.exits.json"}
METRICS = "/var/lib/prometheus/node-exporter/sparkfleet-vllm-guard.prom"
API_KEY = "sparkfleet-fleet-test-key"
# Generous: a busy machine slows a restart, never its outcome.
DEADLINE_S = 420


def shown(unit: str) -> dict[str, str]:
    out = SPARK.check_output(f"systemctl show {unit} --property=ActiveState,SubState,Result,NRestarts")
    return dict(line.split("=", 1) for line in out.splitlines())


def health(unit: str) -> int:
    return int(SPARK.run(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORTS[unit]}/health").stdout or 0)


def wait_for(what: str, check, deadline_s: float = DEADLINE_S, every_s: float = 1):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every_s)
    pytest.fail(f"{what} within {deadline_s} s")


def healthy(unit: str) -> None:
    wait_for(f"{unit} healthy", lambda: shown(unit)["ActiveState"] == "active" and health(unit) == 200)


def exits(unit: str) -> dict:
    text = SPARK.run(f"cat {EXITS[unit]}").stdout
    return json.loads(text) if text.strip() else {"records": [], "unplanned_exits_total": 0}


def metric(name: str, unit: str) -> float:
    for line in SPARK.check_output(f"cat {METRICS}").splitlines():
        if line.startswith(f'sparkfleet_vllm_unit_{name}{{unit="{unit}"'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sparkfleet_vllm_unit_{name} for {unit} in {METRICS}")


def journal_since(unit: str, cursor: str) -> str:
    return SPARK.check_output(f"journalctl -u {unit} --after-cursor '{cursor}' --no-pager -o cat")


def cursor() -> str:
    return SPARK.check_output("journalctl -n 0 --show-cursor --no-pager | tail -1").removeprefix("-- cursor: ")


def router_holds(url: str) -> bool | None:
    answer = json.loads(ROUTER.check_output("curl -fsS http://127.0.0.1:18080/workers"))
    return next((worker["is_healthy"] for worker in answer["workers"] if worker["url"] == url), None)


def test_every_unit_starts_through_the_guard_within_a_bounded_budget():
    unit = SPARK.file(f"/etc/systemd/system/{CHAT}").content_string
    assert 'ExecCondition="/usr/local/lib/sparkfleet/vllm-guard/sparkfleet-vllm-guard" start %n' in unit
    assert "StartLimitBurst=5\n" in unit and "StartLimitIntervalSec=7200\n" in unit and "RestartSec=5\n" in unit
    assert "OnFailure=sparkfleet-vllm-failed@%n.service" in unit
    # The simulated Spark is Debian 12 (systemd 252): no growing delay there; DGX OS 7's 255 gets RestartSteps.
    assert "\nRestartSteps=" not in unit and "has no RestartSteps=" in unit
    # The second model starts after the first at boot.
    assert (
        f"After=docker.service network-online.target {CHAT}\n"
        in SPARK.file(f"/etc/systemd/system/{EMBED}").content_string
    )
    config = json.loads(SPARK.check_output(f"cat {GUARD_CONFIG}"))
    assert [entry["unit"] for entry in config["units"]] == [CHAT, EMBED]
    assert SPARK.file(GUARD_CONFIG).mode == 0o600
    # The guard's logic is the project's own files, as the Ansible modules run them.
    guard_dir = "/usr/local/lib/sparkfleet/vllm-guard/ansible/module_utils"
    root = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    for name in ("vllm_guard.py", "vllm_start_check.py"):
        assert SPARK.file(f"{guard_dir}/{name}").content_string == (root / "module_utils" / name).read_text()


def test_the_engine_killed_in_the_middle_of_a_stream_is_recorded_and_restarted():
    before = exits(CHAT)["unplanned_exits_total"]
    body = {"model": "qwen3-0.6b", "prompt": "Count slowly", "max_tokens": 400, "stream": True}
    # The stream runs on the Spark itself, and is cut once its first token came.
    stream = SPARK.run(
        "timeout 120 curl -sN -H 'content-type: application/json' -H 'authorization: Bearer "
        + API_KEY
        + "' -d '"
        + json.dumps(body)
        + "' http://127.0.0.1:8000/v1/completions > /tmp/guard-stream.txt 2>&1 & "
        "for i in $(seq 100); do grep -q '^data: {' /tmp/guard-stream.txt 2>/dev/null && break; sleep 0.2; done; "
        "docker kill vllm-qwen3-0.6b >/dev/null; wait; grep -c '^data: {' /tmp/guard-stream.txt; "
        "grep -c 'data: \\[DONE\\]' /tmp/guard-stream.txt || true"
    )
    chunks, done = stream.stdout.split()
    assert int(chunks) >= 1 and done == "0", stream.stdout
    healthy(CHAT)
    document = exits(CHAT)
    record = document["records"][-1]
    assert document["unplanned_exits_total"] == before + 1
    assert record["kind"] == "exit" and record["container_exit_code"] == 137 and record["exit"] == "status 137"
    assert record["oom_kill"] is False and record["mem_available_gib"] > 0
    assert record["last_lines"], record  # the container's own last log lines
    assert int(shown(CHAT)["NRestarts"]) >= 1
    assert metric("unplanned_exits_total", CHAT) == before + 1
    # The restarted engine answers again, as the health gate's smoke request would ask it.
    answer = SPARK.check_output(
        f"curl -fsS -H 'content-type: application/json' -H 'authorization: Bearer {API_KEY}' "
        """-d '{"model": "qwen3-0.6b", "prompt": "Hello", "max_tokens": 4}' http://127.0.0.1:8000/v1/completions"""
    )
    assert json.loads(answer)["choices"][0]["text"]


def watch_state(unit: str) -> dict:
    text = SPARK.run(f"cat /run/sparkfleet/vllm-guard/{unit}.watch.json").stdout
    return json.loads(text) if text.strip() else {}


def test_a_wedged_engine_is_found_by_the_watch_restarted_and_out_of_the_router_until_it_answers():
    timer = SPARK.check_output(
        "systemctl show sparkfleet-vllm-watch.timer --property=ActiveState,UnitFileState,TimersMonotonic"
    )
    assert "ActiveState=active" in timer and "UnitFileState=enabled" in timer
    assert "OnUnitActiveUSec=1min" in timer, timer  # the role's default period, 60 s
    # The watch passes on the healthy engine. Qwen3 thinks (a reasoning parser): its canaries were recorded with the
    # reasoning budget, 1024 tokens, too dear for every period, so the probe is the one-token greedy generation.
    SPARK.check_output("systemctl start sparkfleet-vllm-watch.service")
    assert watch_state(CHAT)["last"]["outcome"] == "passed" and watch_state(CHAT)["last"]["canary"] is False
    restarts = exits(CHAT).get("watch_restarts_total", 0)
    container = SPARK.check_output("docker inspect --format '{{.Id}}' vllm-qwen3-0.6b")
    SPARK.check_output("docker kill --signal USR1 vllm-qwen3-0.6b")
    assert health(CHAT) == 200  # /health does not tell
    probes = 0
    killed = False
    while not killed and probes < 3:
        # What the timer runs every period; a run of the timer's own that is under way is waited for instead.
        SPARK.check_output("systemctl start sparkfleet-vllm-watch.service")
        probes += 1
        state = watch_state(CHAT)
        # The probe that kills the container starts the count again.
        killed = state["last"]["outcome"] == "failed" and state["failures"] == 0
    assert killed and probes <= 2, watch_state(CHAT)  # found within two watch periods
    wait_for("the exit record", lambda: exits(CHAT).get("watch_restarts_total", 0) == restarts + 1)
    record = exits(CHAT)["records"][-1]
    assert record["kind"] == "exit" and record["exit"] == "status 137", record
    assert record["watch"].startswith("2 failed probes in a row, the last: wedged"), record
    # Out of the router while it restarts, back once it answers; the restarted engine passes the watch.
    wait_for(
        "the router marking fleet-3:8000 unhealthy", lambda: router_holds("http://fleet-3:8000") is False, every_s=0.2
    )
    healthy(CHAT)
    assert SPARK.check_output("docker inspect --format '{{.Id}}' vllm-qwen3-0.6b") != container
    wait_for("the router taking fleet-3:8000 back", lambda: router_holds("http://fleet-3:8000") is True)
    SPARK.check_output("systemctl start sparkfleet-vllm-watch.service")
    assert watch_state(CHAT)["last"]["outcome"] == "passed" and watch_state(CHAT)["failures"] == 0
    assert metric("watch_restarts_total", CHAT) == restarts + 1
    assert metric("watch_failures", CHAT) == 0
    assert "killed by the runtime watch" in SPARK.check_output(f"journalctl -u {CHAT} -n 200 --no-pager -o cat")


def test_a_start_that_fails_every_time_is_stopped_by_the_budget_and_leaves_the_router():
    dropin = f"/etc/systemd/system/{EMBED}.d"
    before = exits(EMBED)["unplanned_exits_total"]
    failures = exits(EMBED).get("failures_total", 0)
    # The fault: every start of the model's container fails at once (its command replaced by one that exits 1).
    SPARK.check_output(
        f"mkdir -p {dropin} && printf '[Service]\\nExecStart=\\nExecStart=/bin/sh -c \"echo fault; exit 1\"\\n' "
        f"> {dropin}/fault.conf && systemctl daemon-reload && systemctl reset-failed {EMBED}"
    )
    try:
        SPARK.run(f"systemctl restart {EMBED}")
        wait_for(f"{EMBED} failed for good", lambda: exits(EMBED).get("failures_total", 0) > failures)
        state = shown(EMBED)
        # Five starts allowed (the first and four restarts); systemd counts the fifth restart it refused too.
        assert state["NRestarts"] == "5", state
        time.sleep(12)  # two restart delays (5 s on this systemd): nothing tries again
        assert shown(EMBED)["NRestarts"] == "5" and shown(EMBED)["ActiveState"] == "failed"
        document = exits(EMBED)
        assert document["unplanned_exits_total"] - before == 5
        assert document["failures_total"] == failures + 1
        assert document["records"][-1]["kind"] == "failed" and "after 5 restarts" in document["records"][-1]["reason"]
        assert metric("failed", EMBED) == 1 and metric("failed", CHAT) == 0
        # The host stays responsive, the other model serves on, and the router has left the failed one out.
        assert health(CHAT) == 200
        wait_for("the router marking fleet-3:8001 unhealthy", lambda: router_holds("http://fleet-3:8001") is False)
        out = said(run_site("--limit", "fleet-3", playbook="status.yml", timeout=300))
        assert "qwen3-embedding-0.6b on port 8001: failed/failed" in out
        assert "restarts since its last start by hand" in out and "failed for good after 5 restarts" in out
    finally:
        SPARK.check_output(f"rm -rf {dropin} && systemctl daemon-reload")
    # An owner starts it again: a new budget (what the serving stage does, library/vllm_units' reset).
    SPARK.check_output(f"systemctl reset-failed {EMBED} && systemctl start {EMBED}")
    healthy(EMBED)
    assert metric("failed", EMBED) == 0
    wait_for("the router taking fleet-3:8001 back", lambda: router_holds("http://fleet-3:8001") is True)


def test_memory_that_is_not_there_is_refused_before_the_container_starts_and_not_retried():
    original = SPARK.check_output(f"cat {GUARD_CONFIG}")
    config = json.loads(original)
    # The plan's need not there: a margin no machine has (the guard reads the margin the role wrote).
    config["margin_gib"] = 100000
    config["memory_wait_s"] = 10
    refused_before = exits(EMBED).get("refused_starts_total", 0)
    mark = cursor()
    SPARK.check_output(f"cat > {GUARD_CONFIG} <<'EOF'\n{json.dumps(config)}\nEOF")
    try:
        started = time.monotonic()
        SPARK.run(f"systemctl restart {EMBED}")
        assert time.monotonic() - started >= 10  # it waited for the memory to come back
        state = shown(EMBED)
        assert state["ActiveState"] == "inactive", state
        time.sleep(12)  # two restart delays: no restart, no loop
        assert shown(EMBED)["ActiveState"] == "inactive" and shown(EMBED)["NRestarts"] == "0"
        # Refused before the container: none was created after the stop.
        assert SPARK.run("docker ps -aq --filter name=vllm-qwen3-embedding-0.6b").stdout.strip() == ""
        log = journal_since(EMBED, mark)
        assert log.count("sparkfleet-vllm-guard: refused to start vllm-qwen3-embedding-0.6b.service") == 1, log
        assert "not enough free memory to (re)start vllm-qwen3-embedding-0.6b.service" in log
        assert exits(EMBED)["refused_starts_total"] == refused_before + 1
        assert metric("refused_starts_total", EMBED) == refused_before + 1
    finally:
        SPARK.check_output(f"cat > {GUARD_CONFIG} <<'EOF'\n{original}\nEOF")
    SPARK.check_output(f"systemctl start {EMBED}")
    healthy(EMBED)


def container_state(name: str) -> str:
    done = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Status}}", name], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip()


def test_a_reboot_brings_the_models_back_one_at_a_time_each_checked():
    """A real reboot of fleet-3: systemd shuts the Spark down (the units stopped as asked, the engines' containers with
    them), the container exits as a machine powers off, and starts again with its disk (Docker's storage included,
    molecule.yml) and an empty /run. At boot both units start in one transaction; the second waits until the first
    answers /health, and each start passes the guard's memory check."""
    planned_before = {unit: exits(unit)["unplanned_exits_total"] for unit in (CHAT, EMBED)}
    SPARK.check_output("touch /run/sparkfleet-test-before-reboot")
    before = SPARK.check_output("date +%s")
    subprocess.run(["docker", "exec", "fleet-3", "systemctl", "--no-block", "reboot"], timeout=60, check=False)
    wait_for("fleet-3 to shut down", lambda: container_state("fleet-3") == "exited")
    subprocess.run(["docker", "start", "fleet-3"], check=True, timeout=120)
    booted = ["docker", "exec", "fleet-3", "systemctl", "is-system-running", "--wait"]
    wait_for(
        "fleet-3 to boot",
        lambda: (
            subprocess.run(booted, capture_output=True, text=True, timeout=DEADLINE_S).stdout.strip()
            in ("running", "degraded")
        ),
    )
    healthy(CHAT)
    healthy(EMBED)
    assert not SPARK.file("/run/sparkfleet-test-before-reboot").exists, "the container did not boot again"
    boot = {unit: SPARK.check_output(f"journalctl -u {unit} --since @{before} --no-pager -o cat") for unit in PORTS}
    assert f"sparkfleet-vllm-guard: {CHAT} may start:" in boot[CHAT], boot[CHAT]
    assert f"sparkfleet-vllm-guard: {EMBED} may start after {CHAT} loaded" in boot[EMBED], boot[EMBED]
    # The second container started after the first model was healthy.
    started = {
        unit: SPARK.check_output(f"docker inspect --format '{{{{.State.StartedAt}}}}' {unit.removesuffix('.service')}")
        for unit in (CHAT, EMBED)
    }
    assert started[EMBED] > started[CHAT]
    # The shutdown stopped them as asked: no unplanned exit, and no restart counted in this boot.
    assert {unit: exits(unit)["unplanned_exits_total"] for unit in (CHAT, EMBED)} == planned_before
    assert shown(CHAT)["NRestarts"] == shown(EMBED)["NRestarts"] == "0"
    both = ("http://fleet-3:8000", "http://fleet-3:8001")
    wait_for("the router holding both of fleet-3's models", lambda: all(router_holds(url) for url in both))
