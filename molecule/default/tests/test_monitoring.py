"""Monitoring on the simulated Spark (roles/fleet_monitoring through site.yml): Debian's node_exporter and
Prometheus run as systemd services, Prometheus scrapes the exporter and the vLLM endpoint (the real engine), and
sparkfleet's alert rules are loaded, healthy, and silent on a healthy Spark."""

import json
import os
import time

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

PROMETHEUS = "http://127.0.0.1:9090"


def api(host, path: str) -> dict:
    answer = json.loads(host.check_output(f"curl -fsS --get '{PROMETHEUS}{path}'"))
    assert answer["status"] == "success", answer
    return answer["data"]


def wait_for(host, check, timeout_s: float = 300):
    """Prometheus scrapes every 10 s: give it a few rounds after a fresh start, on a machine that may be busy."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(3)


def test_node_exporter_and_prometheus_run(host):
    for unit in ("prometheus-node-exporter", "prometheus"):
        service = host.service(unit)
        assert service.is_running and service.is_enabled, unit
    # Closed by default: both on loopback only (Prometheus runs on this Spark), so no login and no web
    # configuration either.
    for port in (9100, 9090):
        assert host.socket(f"tcp://127.0.0.1:{port}").is_listening
        assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening
        assert not host.socket(f"tcp://:::{port}").is_listening
    for default_file in ("/etc/default/prometheus-node-exporter", "/etc/default/prometheus"):
        assert "--web.config.file" not in host.file(default_file).content_string


def test_every_target_is_scraped_and_up(host):
    def all_up():
        targets = api(host, "/api/v1/targets")["activeTargets"]
        return targets if targets and all(target["health"] == "up" for target in targets) else None

    targets = wait_for(host, all_up)
    assert targets, api(host, "/api/v1/targets")["activeTargets"]
    by_job = {target["labels"]["job"]: target for target in targets}
    assert set(by_job) == {"prometheus", "spark", "vllm"}
    # The vLLM unit listens on loopback only: Prometheus on the same Spark reaches it there.
    assert by_job["vllm"]["scrapeUrl"] == "http://127.0.0.1:8000/metrics"
    assert by_job["vllm"]["labels"]["spark"] == "simspark-1"
    assert by_job["vllm"]["labels"]["model"] == "smollm2-135m"


def test_the_spark_memory_and_the_vllm_metrics_are_queryable(host):
    def series(query: str) -> list:
        return wait_for(host, lambda: api(host, f"/api/v1/query?query={query}")["result"])

    memory = series("node_memory_MemAvailable_bytes")
    assert memory and memory[0]["metric"]["spark"] == "simspark-1"
    assert float(memory[0]["value"][1]) > 0
    # The gate's smoke and warm-up requests went through the endpoint: the counters are above zero.
    tokens = series("vllm:generation_tokens_total")
    assert tokens and float(tokens[0]["value"][1]) > 0, tokens


def test_the_gpus_health_reaches_prometheus_through_node_exporter(host):
    """The GPU metrics collector (fleet_monitoring_gpu_metrics) reads the stand-in nvidia-smi's GB10 recording and
    node_exporter publishes its file: temperature and power as recorded, the memory each process holds."""
    service = host.service("sparkfleet-gpu-metrics")
    assert service.is_running and service.is_enabled
    assert host.file("/var/lib/prometheus/node-exporter/sparkfleet-gpu.prom").mode == 0o644

    def value(query: str) -> list:
        return wait_for(host, lambda: api(host, f"/api/v1/query?query={query}")["result"])

    temperature = value("sparkfleet_gpu_temperature_celsius")
    assert temperature and temperature[0]["metric"]["name"] == "NVIDIA GB10"
    assert float(temperature[0]["value"][1]) == 35
    assert float(value("sparkfleet_gpu_power_draw_watts")[0]["value"][1]) == 11.17
    assert value("sparkfleet_gpu_process_memory_bytes")
    # Fresh: the collector rewrites the file every interval.
    stamp = float(value("sparkfleet_gpu_metrics_timestamp_seconds")[0]["value"][1])
    assert time.time() - stamp < 600


def test_the_alert_rules_are_loaded_healthy_and_silent(host):
    groups = api(host, "/api/v1/rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    names = {rule["name"] for rule in rules}
    assert {"SparkMemoryAvailableCritical", "SparkMemoryFallingFast", "VllmKvCacheHigh", "SparkDown"} <= names
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    firing = [alert for alert in api(host, "/api/v1/alerts")["alerts"] if alert["state"] == "firing"]
    assert firing == []
