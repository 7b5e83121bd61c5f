"""The fleet_monitoring role's Prometheus files, rendered by Ansible from the role's templates and defaults for a
small inventory, checked by the real promtool: the rules load and pass their unit tests
(tests/monitoring/sparkfleet.rules.test.yml), the configuration loads, and its scrape targets are the Spark
endpoints that answer the API. Also: bad inputs stop in validate.yml with a message naming the variable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from helpers.vllm_standin import free_port

ROLE = ROOT / "roles" / "fleet_monitoring"
TEMPLATES = ROLE / "templates" / "etc"
RULES_TESTS = ROOT / "tests" / "monitoring" / "sparkfleet.rules.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing: apt-get install prometheus (Debian's package ships it)"
)


def fleet_inventory(ports: dict[str, int]) -> dict:
    """A monitoring host and three Sparks on 127.0.0.1, with the facts the preflight play would publish
    (vllm_server_resolved): spark-a serves one model and reported it (fact vllm_server_endpoints wins over what
    preflight resolved); spark-b and spark-c are a pair that has not reported, so what preflight resolved counts,
    for the head (spark-b, whose unit answers the API) only."""

    def resolved(*models: dict) -> dict:
        return {"vllm_server_resolved": {"listen_address": "127.0.0.1", "loopback": True, "models": list(models)}}

    qwen = {"served": "qwen3-0.6b", "recipe": "qwen3-0.6b", "port": ports["vllm_a"], "api": True}
    unused = {"served": "unused", "recipe": "unused", "port": 9, "api": True}
    pair_model = {"served": "llama-3.3-70b-bf16", "recipe": "llama-3.3-70b-instruct-bf16-tp2", "port": ports["vllm_b"]}
    spark_a = {
        "ansible_host": "127.0.0.1",
        "fleet_monitoring_node_exporter_port": ports["node_a"],
        **resolved(qwen, unused),
        "vllm_server_endpoints": [
            {"served": "qwen3-0.6b", "port": ports["vllm_a"], "unit": "vllm-qwen3-0-6b.service", "recipe": "qwen3-0.6b"}
        ],
    }
    spark_b = {"ansible_host": "127.0.0.1", "fleet_monitoring_node_exporter_port": ports["node_b"]}
    spark_b |= resolved(pair_model | {"api": True})
    spark_c = {"ansible_host": "127.0.0.1", "fleet_monitoring_node_exporter_port": ports["node_c"]}
    spark_c |= resolved(pair_model | {"api": False})
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return {
        "all": {
            "children": {
                "monitoring": {"hosts": {"watcher": local}},
                "sparks": {
                    "hosts": {"spark-a": spark_a},
                    "children": {
                        "pair_x": {
                            "hosts": {"spark-b": spark_b, "spark-c": spark_c},
                            "vars": {"spark_fabric_pair_group": "pair_x"},
                        }
                    },
                },
            }
        }
    }


def render(tmp: Path, ports: dict[str, int], extra: dict | None = None) -> dict[str, Path]:
    """Render the role's Prometheus files on the monitoring host `watcher` with one ansible-playbook run:
    prometheus.yml (rules under tmp), the rules, and both /etc/default files (node_exporter's as for a Spark
    listening on 127.0.0.1:ports['node_a'])."""
    out = {
        "config": tmp / "prometheus.yml",
        "rules": tmp / "rules" / "sparkfleet.rules.yml",
        "prometheus_args": tmp / "default-prometheus",
        "exporter_args": tmp / "default-prometheus-node-exporter",
    }
    out["rules"].parent.mkdir(exist_ok=True)
    exporter = {"fleet_monitoring_node_exporter_listen_address": "127.0.0.1"}
    exporter["fleet_monitoring_node_exporter_port"] = ports["node_a"]
    files = [
        ("prometheus/prometheus.yml.j2", out["config"], {}),
        ("prometheus/rules/sparkfleet.rules.yml.j2", out["rules"], {}),
        ("default/prometheus.j2", out["prometheus_args"], {}),
        ("default/prometheus-node-exporter.j2", out["exporter_args"], exporter),
    ]
    tasks = [
        {"name": f"Render {dest.name}", "ansible.builtin.template": {"src": str(TEMPLATES / src), "dest": str(dest)}}
        | ({"vars": task_vars} if task_vars else {})
        for src, dest, task_vars in files
    ]
    play = {"hosts": "monitoring", "gather_facts": False, "tasks": tasks}
    play["vars_files"] = [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")]
    (tmp / "render.yml").write_text(yaml.safe_dump([play]))
    (tmp / "hosts.yml").write_text(yaml.safe_dump(fleet_inventory(ports)))
    variables = {"__fleet_monitoring_rules_dir": str(out["rules"].parent)} | (extra or {})
    argv = [ansible_tool("ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "render.yml")]
    argv += ["-e", json.dumps(variables)]
    env = os.environ | {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# Free loopback ports, chosen once: tests/integration/test_monitoring_live.py runs Prometheus on this same rendering.
PORTS = {name: free_port() for name in ("node_a", "node_b", "node_c", "vllm_a", "vllm_b", "prometheus", "alertmanager")}
# What a test run changes from the defaults: a Prometheus on loopback that scrapes every second.
TEST_SETTINGS = {
    "fleet_monitoring_scrape_interval_s": 1,
    "fleet_monitoring_prometheus_listen_address": "127.0.0.1",
    "fleet_monitoring_prometheus_port": PORTS["prometheus"],
    # Nothing listens there: Prometheus only logs that it could not deliver (the live test needs no Alertmanager).
    "fleet_monitoring_alertmanagers": [f"127.0.0.1:{PORTS['alertmanager']}"],
}
_rendered: dict[str, Path] = {}


def rendered_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One rendering per pytest session (an ansible-playbook run takes seconds), shared with the live test."""
    if not _rendered:
        _rendered.update(render(tmp_path_factory.mktemp("monitoring"), PORTS, TEST_SETTINGS))
    return _rendered


@pytest.fixture
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return rendered_once(tmp_path_factory)


@needs_promtool
def test_rules_pass_promtool_check(rendered):
    done = promtool("check", "rules", str(rendered["rules"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


@needs_promtool
def test_rules_pass_their_promtool_unit_tests(rendered):
    """Each alert fires where it must and stays silent where it must not (see the test file's cases)."""
    # In a folder of their own: the configuration loads every *.yml of the rules folder.
    folder = rendered["rules"].parent.parent / "promtool-test"
    folder.mkdir(exist_ok=True)
    shutil.copy(RULES_TESTS, folder)
    shutil.copy(rendered["rules"], folder)
    done = promtool("test", "rules", RULES_TESTS.name, cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_configuration_passes_promtool_check(rendered):
    done = promtool("check", "config", str(rendered["config"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout


def targets_of(config: dict, job: str) -> list[tuple[str, dict]]:
    scrape = next(entry for entry in config["scrape_configs"] if entry["job_name"] == job)
    return [(target, group.get("labels", {})) for group in scrape["static_configs"] for target in group["targets"]]


def test_scrape_targets_are_the_exporters_and_the_endpoints_that_answer_the_api(rendered):
    config = yaml.safe_load(rendered["config"].read_text())
    assert config["global"]["scrape_interval"] == "1s"
    alertmanagers = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanagers == [f"127.0.0.1:{PORTS['alertmanager']}"]
    assert targets_of(config, "spark") == [
        (f"127.0.0.1:{PORTS['node_a']}", {"spark": "spark-a"}),
        (f"127.0.0.1:{PORTS['node_b']}", {"spark": "spark-b"}),
        (f"127.0.0.1:{PORTS['node_c']}", {"spark": "spark-c"}),
    ]
    # spark-a: its reported endpoint only (not the second model preflight resolved); spark-b: the pair's head, from
    # what preflight resolved; spark-c: the pair's worker answers no API, so nothing.
    assert targets_of(config, "vllm") == [
        (f"127.0.0.1:{PORTS['vllm_a']}", {"spark": "spark-a", "model": "qwen3-0.6b", "recipe": "qwen3-0.6b"}),
        (
            f"127.0.0.1:{PORTS['vllm_b']}",
            {"spark": "spark-b", "model": "llama-3.3-70b-bf16", "recipe": "llama-3.3-70b-instruct-bf16-tp2"},
        ),
    ]


def test_listen_addresses_go_into_the_packages_default_files(rendered):
    expected = f'ARGS="--web.listen-address=127.0.0.1:{PORTS["prometheus"]} --storage.tsdb.retention.time=30d"'
    assert expected in rendered["prometheus_args"].read_text()
    assert f'ARGS="--web.listen-address=127.0.0.1:{PORTS["node_a"]}"' in rendered["exporter_args"].read_text()


BAD_INPUTS = {
    "critical below the 2-3 GB band": ({"fleet_monitoring_mem_critical_gib": 1}, "fleet_monitoring_mem_critical_gib"),
    "warning under critical": ({"fleet_monitoring_mem_warning_gib": 2.5}, "fleet_monitoring_mem_warning_gib"),
    "KV cache as a percentage": ({"fleet_monitoring_kv_cache_threshold": 90}, "fleet_monitoring_kv_cache_threshold"),
    "listen address with a port": (
        {"fleet_monitoring_node_exporter_listen_address": "0.0.0.0:9100"},
        "fleet_monitoring_node_exporter_listen_address",
    ),
    "exporter on loopback": (
        {"fleet_monitoring_node_exporter_listen_address": "127.0.0.1"},
        "fleet_monitoring_node_exporter_listen_address",
    ),
    "duration without a unit": ({"fleet_monitoring_kv_cache_for": "5"}, "fleet_monitoring_kv_cache_for"),
    "no monitoring host": ({"fleet_monitoring_group": "nowhere"}, "fleet_monitoring_group"),
    "Grafana mirror without scheme": (
        {
            "fleet_monitoring_grafana_enabled": True,
            "fleet_monitoring_grafana_apt_url": "mirror.local/grafana",
            "fleet_monitoring_grafana_admin_password": "a-long-enough-password",
        },
        "fleet_monitoring_grafana_apt_url",
    ),
    "Grafana without an admin password": (
        {"fleet_monitoring_grafana_enabled": True},
        "fleet_monitoring_grafana_admin_password",
    ),
}


def test_validate_names_the_variable_at_fault(tmp_path):
    """One ansible-playbook run: validate.yml on spark-a, once with the defaults (passes) and once per bad input,
    each in a block whose rescue records the message."""
    cases = {"defaults": {}} | {name: case[0] for name, case in BAD_INPUTS.items()}
    tasks = []
    for name, variables in cases.items():
        include = {"name": f"Validate {name}", "ansible.builtin.include_role": {"name": "fleet_monitoring"}}
        include["ansible.builtin.include_role"]["tasks_from"] = "validate"
        include["vars"] = variables
        record = {"ansible.builtin.set_fact": {"messages": "{{ messages | combine({" + repr(name) + ": __message}) }}"}}
        record["vars"] = {"__message": "{{ ansible_failed_result.msg }}"}
        passed = {"ansible.builtin.set_fact": {"messages": "{{ messages | combine({" + repr(name) + ": 'passed'}) }}"}}
        tasks.append({"name": f"Case {name}", "block": [include, passed], "rescue": [record]})
    tasks.append({"ansible.builtin.copy": {"content": "{{ messages | to_json }}", "dest": str(tmp_path / "out.json")}})
    play = {"hosts": "spark-a", "gather_facts": False, "vars": {"messages": {}}, "tasks": tasks}
    (tmp_path / "validate.yml").write_text(yaml.safe_dump([play]))
    inventory = fleet_inventory(PORTS)
    inventory["all"]["children"]["sparks"]["hosts"]["spark-a"] |= {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    argv = [ansible_tool("ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "validate.yml")]
    env = os.environ | {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    messages = json.loads((tmp_path / "out.json").read_text())
    assert messages["defaults"] == "passed"
    for name, (_, variable) in BAD_INPUTS.items():
        assert messages[name] != "passed", f"{name}: validate.yml accepted it"
        assert variable in messages[name], f"{name}: the message does not name {variable}: {messages[name]}"
