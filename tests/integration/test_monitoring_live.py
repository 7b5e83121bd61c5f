"""The fleet_monitoring role's Prometheus configuration and rules, live on loopback: the real Prometheus and
node_exporter (Debian's packages, started with the ARGS the role writes for them), a stand-in vLLM that has served a few
requests, and the fleet's gate with the real vllm-router in front of a second stand-in (the watcher is the router host),
used by two keys, one of them refused at its limit, and a client without a key. Every panel query of every dashboard the
role installs must be valid and return data, and every alert rule must evaluate. Then both again with their logins and
TLS (the web configurations the role writes): each refuses a request without its login, and Prometheus scrapes
the exporter and itself with theirs. Nothing here leaves 127.0.0.1; each process is stopped by the fixture that
started it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import STANDIN_NVIDIA_SMI, wait_until
from helpers.fleet_gate import gated_router
from helpers.vllm_standin import FAST, VLLM, free_port
from test_monitoring_rules import (
    EXPORTER_LOGIN,
    PORTS,
    PROMETHEUS_LOGIN,
    ROLE,
    SECURED_PORTS,
    args_of,
    rendered_once,
    secured_once,
)

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or NODE_EXPORTER is None,
    reason="prometheus or node_exporter is missing: apt-get install prometheus prometheus-node-exporter",
)

DASHBOARDS = ROLE / "files" / "dashboards"
MODEL = "qwen3-0.6b"  # the served name the rendered inventory gives spark-a's endpoint
PROM = f"http://127.0.0.1:{PORTS['prometheus']}"
STANDIN_ADDRESS = ["--host", "127.0.0.1", "--port", str(PORTS["vllm_a"])]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def answers(url: str) -> bool:
    """True when URL answers 200; an error status (Prometheus' 503 while it starts) raises an OSError."""
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status == 200


def query(expr: str) -> dict:
    """Prometheus's answer to an instant query; an invalid expression is an assertion error with its message."""
    try:
        return get_json(f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except urllib.error.HTTPError as error:
        raise AssertionError(f"Prometheus rejected {expr!r}: {error.read().decode()}") from None


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def storage_of(config: Path, tmp: Path) -> list[str]:
    """Where the test's Prometheus reads its configuration and keeps its samples (Debian's are under /etc, /var)."""
    return [f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}"]


SPECULATIVE = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})]


def completion(port: int, max_tokens: int, key: str | None = None) -> int:
    """The status of one completion request (sent with KEY as its Bearer key where one is given)."""
    body = json.dumps({"model": MODEL, "prompt": "Say hello to the fleet", "max_tokens": max_tokens}).encode()
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


# The fleet's endpoint on the watcher (the rendered inventory's router host): the gate and the real vllm-router as the
# role runs them, on the ports the rendered prometheus.yml scrapes, with spark-a's stand-in as their one worker.
GATE_KEYS = {"alice": "alice-monitoring-key-4f1d", "bob": "bob-monitoring-key-92ce"}
GATE_SETTINGS = {"fleet_router_metrics_port": PORTS["router"], "fleet_router_gate_metrics_port": PORTS["gate"]}


def use_the_gate(port: int) -> None:
    """Usage the keys board shows: alice's answers (her key limited to 4 at once), bob's second request in a minute
    refused (his limit: 1 a minute), and a request with no key."""
    for max_tokens in (4, 8, 6):
        assert completion(port, max_tokens, GATE_KEYS["alice"]) == 200
    assert completion(port, 4, GATE_KEYS["bob"]) == 200
    assert completion(port, 4, GATE_KEYS["bob"]) == 429
    assert completion(port, 4) == 401


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ...]]:
    """Prometheus scraping spark-a's node_exporter and stand-in vLLM (spark-b and spark-c's targets stay down), and
    the watcher's gate and router, after the stand-in and the gate served a few requests between two scrapes. Yields
    the processes' logs."""
    files = rendered_once(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("monitoring-live")
    env = os.environ | {"VLLM_STANDIN_LOAD_SECONDS": "0.2"} | FAST
    # The GPU panels' series: one reading of the GPU metrics collector from the stand-in nvidia-smi's H200
    # recording (every GPU series), in the folder node_exporter's textfile collector reads.
    textfile = tmp / "textfile"
    textfile.mkdir()
    collector = [
        sys.executable,
        str(ROLE / "files" / "gpu_metrics.py"),
        "--once",
        "--nvidia-smi",
        str(STANDIN_NVIDIA_SMI),
    ]
    collector += ["--textfile", str(textfile / "sparkfleet-gpu.prom")]
    subprocess.run(collector, env=os.environ | {"NVIDIA_SMI_STANDIN_PROFILE": "h200"}, check=True, timeout=60)
    exporter = [NODE_EXPORTER, *args_of(files["exporter_args"]), f"--collector.textfile.directory={textfile}"]
    processes = [
        start(exporter, tmp / "node_exporter.log"),
        start(
            # With speculation, so that the speculative-decoding panels have counters (known acceptance 0.7).
            [str(VLLM), "serve", "org/Qwen3-0.6B", "--served-model-name", MODEL, *STANDIN_ADDRESS, *SPECULATIVE],
            tmp / "vllm.log",
            env,
        ),
        start(
            [PROMETHEUS, *args_of(files["prometheus_args"]), *storage_of(files["config"], tmp)],
            tmp / "prometheus.log",
        ),
    ]
    stack = contextlib.ExitStack()
    try:
        logs = tuple(tmp / name for name in ("node_exporter.log", "vllm.log", "prometheus.log"))
        # Prometheus answers queries with 503 until its storage is open: wait for /-/ready on a busy machine.
        wait_until(lambda: answers(f"{PROM}/-/ready"), f"Prometheus ready ({tmp})", logs)
        up = 'up{spark="spark-a"} == 1'
        wait_until(lambda: len(query(up)["data"]["result"]) == 2, f"both spark-a targets up ({tmp})", logs)
        for max_tokens in (4, 8, 16, 8, 4, 12):
            assert completion(PORTS["vllm_a"], max_tokens) == 200
        # The gate's own worker: a second stand-in, so that the vLLM panels and rules count the six answers above.
        worker_port = free_port()
        worker_argv = [str(VLLM), "serve", "org/Qwen3-0.6B", "--served-model-name", MODEL]
        processes.append(
            start([*worker_argv, "--host", "127.0.0.1", "--port", str(worker_port)], tmp / "worker.log", env)
        )
        keys = [
            {"name": "alice", "key": GATE_KEYS["alice"], "concurrent": 4},
            {"name": "bob", "key": GATE_KEYS["bob"], "requests_per_minute": 1},
        ]
        worker = {"host": "spark-a", "url": f"http://127.0.0.1:{worker_port}", "model": MODEL}
        gated = stack.enter_context(gated_router(tmp, [worker], keys, {}, "monitoring-spark-key-77aa", GATE_SETTINGS))
        logs += (tmp / "worker.log", *gated["logs"])
        # Scraped before it is used: its refusals start from a sample of 0, as on a gate that has run a while.
        scraped = 'sparkfleet_gate_limited_total{key="bob", router="watcher"} == 0'
        wait_until(lambda: query(scraped)["data"]["result"], "the gate's counters scraped at 0", logs)
        wait_until(lambda: completion(gated["port"], 4, GATE_KEYS["alice"]) == 200, "the gate answers", logs)
        use_the_gate(gated["port"])
        # Counters and histograms must have grown between scrapes for rates and quantiles to have data.
        counted = f'vllm:request_success_total{{model_name="{MODEL}"}}'
        wait_until(lambda: sum(float(r["value"][1]) for r in query(counted)["data"]["result"]) >= 6, counted, logs)
        # A scrape after that one: a rate has two samples of the grown counters in its window.
        wait_until(lambda: query(f"rate({counted}[1m])")["data"]["result"], f"rate({counted}[1m])", logs)
        # The gate's too: its series of the last request (no key: 401) began with it, so a rate needs two scrapes.
        refused = 'sparkfleet_gate_requests_total{key="-", status="401", router="watcher"}'
        wait_until(lambda: query(f"rate({refused}[1m])")["data"]["result"], f"rate({refused}[1m])", logs)
        yield logs
    finally:
        stack.close()
        for process in reversed(processes):
            stop(process)


def substituted(expr: str, spark: str = "spark-a") -> str:
    """A panel query as Grafana would send it for one Spark and one model."""
    values = {"model_name": MODEL, "model": MODEL, "spark": spark, "router": "watcher", "key": ".*"}
    values |= {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
    return re.sub(r"\$\{?(\w+)\}?", lambda match: values.get(match.group(1), match.group(0)), expr)


def panel_queries(board: str) -> list[tuple[str, str]]:
    dashboard = json.loads((DASHBOARDS / board).read_text())
    return [
        (f"{board} / {panel['title']} / {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def metric_names() -> set[str]:
    return set(get_json(f"{PROM}/api/v1/label/__name__/values")["data"])


@pytest.mark.parametrize("board", ["sparkfleet-spark.json", "sparkfleet-keys.json", "vllm.json"])
def test_every_panel_query_is_valid_and_returns_data(prometheus, board):
    """Every metric a panel queries exists: the stand-in exposes all that vLLM's board and ours use."""
    present = metric_names()
    queries = panel_queries(board)
    assert queries, f"{board} has no panel queries"
    for where, expr in queries:
        answer = query(substituted(expr))
        assert answer["status"] == "success", f"{where}: {answer}"
        missing = set(re.findall(r"[a-z_]+:[a-z_:]+", expr)) - present
        assert answer["data"]["result"], f"{where}: no data for {substituted(expr)!r} (missing {missing})"


def test_template_variables_list_the_spark_and_its_model(prometheus):
    sparks = {r["metric"]["spark"] for r in query("count by (spark) (node_memory_MemTotal_bytes)")["data"]["result"]}
    assert sparks == {"spark-a"}  # spark-b and spark-c do not answer
    by_model = 'count by (model_name) (vllm:num_requests_running{spark=~"spark-a"})'
    assert {r["metric"]["model_name"] for r in query(by_model)["data"]["result"]} == {MODEL}
    # vLLM's board lists label_values(model_name).
    assert MODEL in get_json(f"{PROM}/api/v1/label/model_name/values")["data"]


def test_alert_rules_evaluate_and_match_the_job_names(prometheus):
    def rules() -> list[dict]:
        groups = get_json(f"{PROM}/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def evaluated() -> bool:
        return all(rule.get("lastEvaluation", "").startswith("2") for rule in rules())

    wait_until(evaluated, "every rule evaluated", prometheus)
    assert len(rules()) == 24
    assert {rule["name"]: rule["health"] for rule in rules()} == {rule["name"]: "ok" for rule in rules()}
    # The pair's targets do not answer: their down alerts are pending (for 2m), which proves that the rules'
    # job names and labels are those of the configuration. A rule can evaluate before a target's first failed
    # scrape (up has no sample yet), so the alerts are waited for, not read once.
    # Bob's key was refused at its limit: that alert fires at once, by key name.
    expected = {("SparkDown", "spark-b"), ("SparkDown", "spark-c"), ("VllmEndpointDown", "spark-b")}
    expected |= {("FleetKeyAtLimit", "bob")}

    def pending_alerts() -> set[tuple[str, str]]:
        alerts = get_json(f"{PROM}/api/v1/alerts")["data"]["alerts"]
        return {
            (alert["labels"]["alertname"], alert["labels"].get("spark", alert["labels"].get("key"))) for alert in alerts
        }

    wait_until(lambda: expected <= pending_alerts(), "the pair's down alerts and bob's limit pending", prometheus)
    pending = pending_alerts()
    assert ("VllmEndpointDown", "spark-a") not in pending and ("SparkDown", "spark-a") not in pending
    assert not {name for name, who in pending if name == "FleetEndpointDown" or who in ("alice", "-")}
    limited = get_json(f"{PROM}/api/v1/alerts")["data"]["alerts"]
    assert {
        (a["labels"]["limit"], a["labels"]["router"]) for a in limited if a["labels"]["alertname"] == "FleetKeyAtLimit"
    } == {("requests_per_minute", "watcher")}


def test_the_gate_and_router_are_scraped_and_the_keys_board_lists_them(prometheus):
    up = {r["metric"]["job"]: r["value"][1] for r in query('up{job=~"fleet_router|fleet_gate"}')["data"]["result"]}
    assert up == {"fleet_router": "1", "fleet_gate": "1"}
    assert get_json(f"{PROM}/api/v1/label/router/values")["data"] == ["watcher"]
    keys = 'count by (key) (sparkfleet_gate_requests_total{router=~"watcher"})'
    # alice, bob, and "-" for the request without a key (the keys board's variable lists these).
    assert {r["metric"]["key"] for r in query(keys)["data"]["result"]} == {"alice", "bob", "-"}
    statuses = query('sparkfleet_gate_requests_total{key="bob"}')["data"]["result"]
    assert {r["metric"]["status"]: r["value"][1] for r in statuses} == {"200": "1", "429": "1"}


def test_the_speculation_rules_read_the_standins_known_acceptance(prometheus):
    """The recording rules on vLLM's spec_decode counters, as the stand-in counts them: the fixture's six answers
    (4, 8, 16, 8, 4 and 12 tokens), 3 draft tokens a step and 2 of them accepted (VLLM_STANDIN_SPEC_ACCEPTANCE 0.7
    of 3), fewer where an answer ends: 17 drafts, 51 draft tokens, 29 accepted."""
    acceptance = 'sparkfleet:vllm_spec_decode_acceptance_rate:rate5m{spark="spark-a"}'
    length = 'sparkfleet:vllm_spec_decode_mean_accepted_length:rate5m{spark="spark-a"}'
    for rule in (acceptance, length):
        wait_until(lambda rule=rule: last_number(rule) is not None, rule, prometheus)
    assert last_number(acceptance) == pytest.approx(29 / 51)
    assert last_number(length) == pytest.approx(1 + 29 / 17)


def last_number(rule: str) -> float | None:
    """The last value the recording rule stored that is a number (its window holds a sample from before the requests
    and one from after them all). Once the requests are older than the rule's 5-minute window its rates are 0/0
    (NaN), so a busy machine that reaches this test later must look back."""
    end = time.time()
    found = get_json(
        f"{PROM}/api/v1/query_range?"
        + urllib.parse.urlencode({"query": rule, "start": end - 3600, "end": end, "step": "5s"})
    )["data"]["result"]
    values = [float(value) for series in found for _, value in series["values"] if value not in ("NaN", "+Inf", "-Inf")]
    return values[-1] if values else None


# --- With logins and TLS ------------------------------------------------------------------------------------------

SECURED_PROM = f"https://127.0.0.1:{SECURED_PORTS['prometheus']}"
SECURED_EXPORTER = f"https://127.0.0.1:{SECURED_PORTS['node_a']}"


def fetch(url: str, context: ssl.SSLContext, login: tuple[str, str] | None = None) -> bytes:
    """The body of a GET over TLS (checked against the test's CA), with a basic-auth login if one is given."""
    request = urllib.request.Request(url)
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        return response.read()


def status_without(url: str, context: ssl.SSLContext, login: tuple[str, str] | None = None) -> int:
    """The HTTP status of a GET that is expected to be refused."""
    try:
        fetch(url, context, login)
    except urllib.error.HTTPError as error:
        return error.code
    return 200


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ssl.SSLContext, tuple[Path, ...]]]:
    """node_exporter and Prometheus with the web configurations the role renders for a login and TLS (on loopback:
    a login applies wherever a password is set). Yields the TLS context that trusts their certificate, and the
    logs."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing: apt-get install openssl")
    files = secured_once(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("monitoring-secured-live")
    context = ssl.create_default_context(cafile=str(files["cert"]))
    logs = (tmp / "node_exporter.log", tmp / "prometheus.log")
    processes = [
        start([NODE_EXPORTER, *args_of(files["exporter_args"])], logs[0]),
        start([PROMETHEUS, *args_of(files["prometheus_args"]), *storage_of(files["config"], tmp)], logs[1]),
    ]
    try:
        ready = f"{SECURED_PROM}/-/ready"
        wait_until(lambda: fetch(ready, context, PROMETHEUS_LOGIN), "Prometheus ready behind its login", logs)
        wait_until(lambda: fetch(f"{SECURED_EXPORTER}/metrics", context, EXPORTER_LOGIN), "node_exporter up", logs)
        yield context, logs
    finally:
        for process in reversed(processes):
            stop(process)


def secured_query(expr: str, context: ssl.SSLContext) -> list[dict]:
    url = f"{SECURED_PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.loads(fetch(url, context, PROMETHEUS_LOGIN))["data"]["result"]


def test_node_exporter_answers_only_with_its_login(secured):
    context, _ = secured
    metrics = f"{SECURED_EXPORTER}/metrics"
    assert status_without(metrics, context) == 401
    assert status_without(metrics, context, (EXPORTER_LOGIN[0], "a-wrong-password")) == 401
    assert status_without(metrics, context, PROMETHEUS_LOGIN) == 401
    assert b"node_memory_MemAvailable_bytes" in fetch(metrics, context, EXPORTER_LOGIN)


def test_prometheus_answers_its_api_only_with_its_login(secured):
    context, _ = secured
    for path in ("/api/v1/query?query=up", "/api/v1/targets", "/api/v1/status/config", "/graph"):
        assert status_without(SECURED_PROM + path, context) == 401, path
        assert status_without(SECURED_PROM + path, context, EXPORTER_LOGIN) == 401, path
    assert json.loads(fetch(f"{SECURED_PROM}/api/v1/query?query=up", context, PROMETHEUS_LOGIN))["status"] == "success"


def test_prometheus_scrapes_the_exporter_and_itself_with_their_logins(secured):
    context, logs = secured
    up = 'up{job=~"spark|prometheus", spark=~"spark-a|"} == 1'

    def both_up() -> bool:
        return {r["metric"]["job"] for r in secured_query(up, context)} == {"spark", "prometheus"}

    def targets() -> list[dict]:
        answer = json.loads(fetch(f"{SECURED_PROM}/api/v1/targets", context, PROMETHEUS_LOGIN))
        return answer["data"]["activeTargets"]

    wait_until(both_up, "spark-a's exporter and Prometheus itself scraped over TLS with their logins", logs)
    by_job = {(t["labels"]["job"], t["labels"].get("spark")): t for t in targets()}
    assert by_job[("spark", "spark-a")]["scrapeUrl"] == f"{SECURED_EXPORTER}/metrics"
    assert by_job[("spark", "spark-a")]["lastError"] == ""
    # The configuration Prometheus reports keeps the passwords out (password_file: it never had them).
    config = json.loads(fetch(f"{SECURED_PROM}/api/v1/status/config", context, PROMETHEUS_LOGIN))["data"]["yaml"]
    assert EXPORTER_LOGIN[1] not in config and PROMETHEUS_LOGIN[1] not in config
