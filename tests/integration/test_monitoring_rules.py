"""The fleet_monitoring role's Prometheus files, rendered by Ansible from the role's templates and defaults for a
small inventory, checked by the real promtool: the rules load and pass their unit tests
(tests/monitoring/sparkfleet.rules.test.yml), the configuration loads, and its scrape targets are the Spark
endpoints that answer the API. Also: bad inputs stop in validate.yml with a message naming the variable."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import bcrypt
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
    """A monitoring host that is also the router host, and three Sparks on 127.0.0.1, with the facts the preflight play
    would publish (vllm_server_resolved, fleet_router_metrics): spark-a serves one model and reported it (fact
    vllm_server_endpoints wins over what preflight resolved); spark-b and spark-c are a pair that has not reported, so
    what preflight resolved counts, for the head (spark-b, whose unit answers the API) only."""

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
    # The watcher is the fleet's router host too, with the fact fleet_router's preflight publishes.
    router_metrics = {"address": "127.0.0.1", "router_port": ports["router"], "gate_port": ports["gate"]}
    return {
        "all": {
            "children": {
                "monitoring": {"hosts": {"watcher": local | {"fleet_router_metrics": router_metrics}}},
                "router": {"hosts": {"watcher": {}}},
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


def role_task(tasks_file: str, name: str) -> dict:
    """The task NAME of the role's tasks/TASKS_FILE (also inside a block), as the role writes it."""
    pending = list(yaml.safe_load((ROLE / "tasks" / tasks_file).read_text()))
    while pending:
        task = pending.pop(0)
        if task.get("name") == name:
            return task
        pending[:0] = task.get("block", [])
    raise AssertionError(f"{tasks_file} has no task {name!r}")


def web_tasks() -> list[dict]:
    """The role's own tasks that write both web configurations and the passwords Prometheus sends, as the render
    play runs them: the role's template, variables and expressions (a hash kept from the file there is, none on a
    first run), without what only a real host has (the owner root:prometheus, handlers, promtool as validator)."""

    def bare(task: dict, **extra: object) -> dict:
        module = next(key for key in task if key.startswith("ansible.builtin."))
        args = {key: value for key, value in task[module].items() if key not in ("owner", "group", "validate")}
        if "src" in args:
            args["src"] = str(ROLE / "templates" / args["src"])
        kept = {key: value for key, value in task.items() if key in ("loop", "vars", "no_log")}
        return {"name": task["name"], module: args} | kept | extra

    write = role_task("web.yml", "Web | Write the web configuration of {{ __web.service }}")
    services = [
        role_task("exporter.yml", "Exporter | Write node_exporter's login and TLS"),
        role_task("server.yml", "Server | Write Prometheus's login and TLS"),
    ]
    tasks = []
    for service in services:
        web = {key: value for key, value in service["vars"]["__web"].items() if key not in ("skip", "notify")}
        tasks.append(bare(write, when="__web.enabled") | {"vars": write["vars"] | {"__web": web}})
    tasks.append(bare(role_task("server.yml", "Server | Write the passwords Prometheus sends")))
    return tasks


def render(
    tmp: Path, ports: dict[str, int], extra: dict | None = None, inventory: dict | None = None
) -> dict[str, Path]:
    """Render the role's Prometheus files on the monitoring host `watcher` with one ansible-playbook run:
    prometheus.yml (rules under tmp), the rules, both /etc/default files (node_exporter's as for a Spark
    listening on 127.0.0.1:ports['node_a']), and, where EXTRA gives them a login or TLS, both web configurations
    and the passwords Prometheus sends (all under tmp)."""
    out = {
        "config": tmp / "prometheus.yml",
        "rules": tmp / "rules" / "sparkfleet.rules.yml",
        "prometheus_args": tmp / "default-prometheus",
        "exporter_args": tmp / "default-prometheus-node-exporter",
        "exporter_web": tmp / "node-exporter" / "web.yml",
        "prometheus_web": tmp / "prometheus" / "web.yml",
        "exporter_password": tmp / "prometheus" / "node-exporter.password",
        "prometheus_password": tmp / "prometheus" / "prometheus.password",
    }
    for folder in ("rules", "node-exporter", "prometheus"):
        (tmp / folder).mkdir(exist_ok=True)
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
    play = {"hosts": "monitoring", "gather_facts": False, "tasks": tasks + web_tasks()}
    play["vars_files"] = [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")]
    (tmp / "render.yml").write_text(yaml.safe_dump([play]))
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory or fleet_inventory(ports)))
    variables = {
        "__fleet_monitoring_rules_dir": str(out["rules"].parent),
        "__fleet_monitoring_node_exporter_web_config": str(out["exporter_web"]),
        "__fleet_monitoring_prometheus_web_config": str(out["prometheus_web"]),
        "__fleet_monitoring_exporter_password_file": str(out["exporter_password"]),
        "__fleet_monitoring_prometheus_password_file": str(out["prometheus_password"]),
    } | (extra or {})
    argv = [ansible_tool("ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "render.yml")]
    argv += ["-e", json.dumps(variables)]
    done = subprocess.run(argv, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def ansible_env() -> dict[str, str]:
    """The project's ansible.cfg, and the role's own filters (bcrypt_login) beside the project's: the render play
    uses the role's templates without running the role, which would load them."""
    filters = os.pathsep.join([str(ROLE / "filter_plugins"), str(ROOT / "filter_plugins")])
    return os.environ | {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FILTER_PLUGINS": filters}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# Free loopback ports, chosen once: tests/integration/test_monitoring_live.py runs Prometheus on this same rendering.
PORTS = {
    name: free_port()
    for name in ("node_a", "node_b", "node_c", "vllm_a", "vllm_b", "prometheus", "alertmanager", "router", "gate")
}
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


def args_of(default_file: Path) -> list[str]:
    """The ARGS line of a rendered /etc/default file as the package's unit passes it: systemd reads the file's
    (shell-like) quoting, then splits the unquoted $ARGS at whitespace, and does not unquote the words again."""
    line = next(line for line in default_file.read_text().splitlines() if line.startswith("ARGS="))
    (value,) = shlex.split(line.split("=", 1)[1])
    return value.split()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key (EC P-256, valid two days), as a site's PKI would issue."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    argv += ["-days", "2", "-subj", "/CN=sparkfleet-test", "-addext", "subjectAltName=IP:127.0.0.1"]
    argv += ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return cert, key


# The same fleet with both listeners behind their logins and TLS (still on loopback: a login applies wherever a
# password is set), on ports of their own so the live test can run both Prometheus servers at once.
SECURED_PORTS = {name: free_port() for name in PORTS}
EXPORTER_LOGIN = ("prometheus", "exporter-test-password-7f3a")
PROMETHEUS_LOGIN = ("sparkfleet", "prometheus-test-password-$9c1")
_secured: dict[str, Path] = {}


def secured_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One rendering with logins and TLS per pytest session, shared with the live test; also yields "cert" (the
    certificate both serve, which is its own CA) and "key"."""
    if not _secured:
        tmp = tmp_path_factory.mktemp("monitoring-secured")
        cert, key = self_signed(tmp)
        settings = TEST_SETTINGS | {
            "fleet_monitoring_prometheus_port": SECURED_PORTS["prometheus"],
            "fleet_monitoring_alertmanagers": [],
            "fleet_monitoring_prometheus_password": PROMETHEUS_LOGIN[1],
            "fleet_monitoring_prometheus_tls_cert_file": str(cert),
            "fleet_monitoring_prometheus_tls_key_file": str(key),
            "fleet_monitoring_node_exporter_password": EXPORTER_LOGIN[1],
            "fleet_monitoring_node_exporter_tls_cert_file": str(cert),
            "fleet_monitoring_node_exporter_tls_key_file": str(key),
            "fleet_monitoring_node_exporter_tls_ca_file": str(cert),
        }
        _secured.update(render(tmp, SECURED_PORTS, settings) | {"cert": cert, "key": key})
    return _secured


@pytest.fixture
def secured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing: apt-get install openssl")
    return secured_once(tmp_path_factory)


@needs_promtool
def test_rules_pass_promtool_check(rendered):
    done = promtool("check", "rules", str(rendered["rules"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 24 rules found" in done.stdout


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


def test_the_router_hosts_metrics_are_scraped_on_loopback_where_prometheus_runs_beside_them(rendered, tmp_path):
    config = yaml.safe_load(rendered["config"].read_text())
    assert targets_of(config, "fleet_router") == [(f"127.0.0.1:{PORTS['router']}", {"router": "watcher"})]
    assert targets_of(config, "fleet_gate") == [(f"127.0.0.1:{PORTS['gate']}", {"router": "watcher"})]
    # A router host that is not the monitoring host: its loopback metrics are out of reach, so no job.
    inventory = fleet_inventory(PORTS)
    inventory["all"]["children"]["router"] = {"hosts": {"spark-a": {}}}
    elsewhere = yaml.safe_load(render(tmp_path, PORTS, TEST_SETTINGS, inventory)["config"].read_text())
    assert {"spark", "vllm", "prometheus"} == {job["job_name"] for job in elsewhere["scrape_configs"]}


def test_listen_addresses_go_into_the_packages_default_files(rendered):
    """Without a password or a certificate neither service gets a web configuration: no login on loopback."""
    assert args_of(rendered["prometheus_args"]) == [
        f"--web.listen-address=127.0.0.1:{PORTS['prometheus']}",
        "--storage.tsdb.retention.time=30d",
    ]
    assert args_of(rendered["exporter_args"]) == [f"--web.listen-address=127.0.0.1:{PORTS['node_a']}"]
    for name in ("exporter_web", "prometheus_web", "exporter_password", "prometheus_password"):
        assert not rendered[name].exists(), name
    config = yaml.safe_load(rendered["config"].read_text())
    assert not any("basic_auth" in job or "scheme" in job for job in config["scrape_configs"])


@needs_promtool
def test_logins_and_tls_go_into_the_web_configurations(secured):
    assert args_of(secured["exporter_args"]) == [
        f"--web.listen-address=127.0.0.1:{SECURED_PORTS['node_a']}",
        f"--web.config.file={secured['exporter_web']}",
    ]
    assert args_of(secured["prometheus_args"])[-1] == f"--web.config.file={secured['prometheus_web']}"
    for web, (user, password) in (
        (secured["exporter_web"], EXPORTER_LOGIN),
        (secured["prometheus_web"], PROMETHEUS_LOGIN),
    ):
        config = yaml.safe_load(web.read_text())
        assert list(config["basic_auth_users"]) == [user]
        assert bcrypt.checkpw(password.encode(), config["basic_auth_users"][user].encode())
        assert config["tls_server_config"] == {"cert_file": str(secured["cert"]), "key_file": str(secured["key"])}
        assert password not in web.read_text()
        done = promtool("check", "web-config", str(web))
        assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_scrape_jobs_send_the_logins_from_files_only_prometheus_reads(secured):
    text = secured["config"].read_text()
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # Prometheus scrapes itself on its own address, over TLS: the connection never leaves the host.
    assert jobs["prometheus"]["basic_auth"] == {
        "username": PROMETHEUS_LOGIN[0],
        "password_file": str(secured["prometheus_password"]),
    }
    assert jobs["prometheus"]["scheme"] == "https"
    assert jobs["prometheus"]["tls_config"] == {"insecure_skip_verify": True}
    assert jobs["spark"]["basic_auth"] == {
        "username": EXPORTER_LOGIN[0],
        "password_file": str(secured["exporter_password"]),
    }
    assert jobs["spark"]["scheme"] == "https"
    assert jobs["spark"]["tls_config"] == {"ca_file": str(secured["cert"])}
    # vLLM's /metrics needs no login.
    assert "basic_auth" not in jobs["vllm"] and "scheme" not in jobs["vllm"]
    assert secured["exporter_password"].read_text() == EXPORTER_LOGIN[1]
    assert secured["prometheus_password"].read_text() == PROMETHEUS_LOGIN[1]
    assert EXPORTER_LOGIN[1] not in text and PROMETHEUS_LOGIN[1] not in text
    done = promtool("check", "config", str(secured["config"]))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_a_name_with_quotes_and_a_newline_stays_one_yaml_string(tmp_path):
    """A served name or recipe that preflight would refuse (vllm_server's rules) still cannot break out of its
    label in prometheus.yml: every templated string is written as JSON."""
    served = 'odd"model\nmodel: injected # and a comment'
    recipe = "it's\n  - targets: ['10.6.6.6:22']"
    endpoints = [{"served": served, "port": PORTS["vllm_a"], "unit": "vllm-odd.service", "recipe": recipe}]
    files = render(tmp_path, PORTS, TEST_SETTINGS | {"vllm_server_endpoints": endpoints})
    config = yaml.safe_load(files["config"].read_text())
    labels = [labels for _, labels in targets_of(config, "vllm")]
    assert labels == [
        {"spark": spark, "model": served, "recipe": recipe} for spark in ("spark-a", "spark-b", "spark-c")
    ]
    assert all(target.startswith("127.0.0.1:") for target, _ in targets_of(config, "vllm"))
    done = promtool("check", "config", str(files["config"]))
    assert done.returncode == 0, done.stdout + done.stderr


# The validate test's fleet: Prometheus on `watcher`, every Spark's node_exporter and vLLM opened to it, with a login.
SPARK_PASSWORD = "spark-exporter-password-51b0"
# A secret no message and no line of the run's output may show (preflight refuses it: a newline).
LEAKED = "exporter-secret-with-a\nnewline-e3c7"


def validate_inventory() -> dict:
    inventory = fleet_inventory(PORTS)
    sparks = inventory["all"]["children"]["sparks"]
    for host in [*sparks["hosts"].values(), *sparks["children"]["pair_x"]["hosts"].values()]:
        host["fleet_monitoring_node_exporter_listen_address"] = "0.0.0.0"
        host["fleet_monitoring_node_exporter_password"] = SPARK_PASSWORD
        host["vllm_server_resolved"] |= {"listen_address": "0.0.0.0", "loopback": False}
    sparks["hosts"]["spark-a"] |= {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # A group of Sparks whose logins differ, for the case that watches it.
    odd = {"ansible_host": "127.0.0.1", "fleet_monitoring_node_exporter_listen_address": "0.0.0.0"}
    odd["fleet_monitoring_node_exporter_password"] = "another-exporter-password"
    inventory["all"]["children"]["odd_sparks"] = {"hosts": {"spark-a": {}, "spark-odd": odd}}
    return inventory


# name: (variables, the variable the message must name, the host that runs validate.yml: spark-a, else watcher).
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
    "exporter opened without a password": (
        {"fleet_monitoring_node_exporter_password": ""},
        "fleet_monitoring_node_exporter_password",
    ),
    "exporter password too short": (
        {"fleet_monitoring_node_exporter_password": "short"},
        "fleet_monitoring_node_exporter_password",
    ),
    "password with a newline": (
        {"fleet_monitoring_node_exporter_password": LEAKED},
        "fleet_monitoring_node_exporter_password",
    ),
    "Prometheus opened without a password": (
        {"fleet_monitoring_prometheus_listen_address": "0.0.0.0"},
        "fleet_monitoring_prometheus_password",
        "watcher",
    ),
    "TLS key without its certificate": (
        {"fleet_monitoring_node_exporter_tls_key_file": "/etc/ssl/private/exporter.key"},
        "fleet_monitoring_node_exporter_tls_cert_file",
    ),
    "TLS path with a space": (
        {
            "fleet_monitoring_prometheus_tls_cert_file": "/etc/ssl/my cert.pem",
            "fleet_monitoring_prometheus_tls_key_file": "/etc/ssl/my.key",
        },
        "fleet_monitoring_prometheus_tls_cert_file",
        "watcher",
    ),
    "exporter on a vLLM port": (
        {"fleet_monitoring_node_exporter_port": PORTS["vllm_a"]},
        "fleet_monitoring_node_exporter_port",
    ),
    "Prometheus on a vLLM port": (
        {
            "fleet_monitoring_prometheus_port": 8123,
            "vllm_server_resolved": {"listen_address": "127.0.0.1", "loopback": True, "models": [{"port": 8123}]},
        },
        "fleet_monitoring_prometheus_port",
        "watcher",
    ),
    "Sparks with different logins": (
        {"fleet_monitoring_sparks_group": "odd_sparks"},
        "fleet_monitoring_node_exporter_password",
        "watcher",
    ),
    "duration without a unit": ({"fleet_monitoring_kv_cache_for": "5"}, "fleet_monitoring_kv_cache_for"),
    "retention with another flag": (
        {"fleet_monitoring_prometheus_retention": "30d --web.enable-admin-api"},
        "fleet_monitoring_prometheus_retention",
        "watcher",
    ),
    "Spark address with a newline": (
        {"fleet_monitoring_spark_addresses": {"spark-b": "10.0.0.2\n      - targets: [evil]"}},
        "fleet_monitoring_spark_addresses",
        "watcher",
    ),
    "Alertmanager without a port": (
        {"fleet_monitoring_alertmanagers": ["am.lan"]},
        "fleet_monitoring_alertmanagers[0]",
    ),
    "Alertmanager with a space": (
        {"fleet_monitoring_alertmanagers": ["am lan:9093"]},
        "fleet_monitoring_alertmanagers[0]",
    ),
    "unbracketed IPv6 Alertmanager": (
        {"fleet_monitoring_alertmanagers": ["fd00::1:9093"]},
        "fleet_monitoring_alertmanagers[0]",
    ),
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
    """One ansible-playbook run: validate.yml on a Spark (spark-a) and on the monitoring host (watcher), once each
    with the inventory as it is (passes) and once per bad input, each in a block whose rescue records the
    message. No message, and no line of the run's output, shows a password."""
    cases = {"defaults": ({}, "", "spark-a"), "defaults on the monitoring host": ({}, "", "watcher")}
    # Passes with a warning: the pair's hosts as the router group, whose loopback metrics the watcher cannot reach.
    cases["defaults with router hosts out of reach"] = ({"fleet_monitoring_router_group": "pair_x"}, "", "watcher")
    cases |= {name: (case[0], case[1], case[2] if len(case) > 2 else "spark-a") for name, case in BAD_INPUTS.items()}
    tasks = []
    for name, (variables, _, host) in cases.items():
        include = {"name": f"Validate {name}", "ansible.builtin.include_role": {"name": "fleet_monitoring"}}
        include["ansible.builtin.include_role"]["tasks_from"] = "validate"
        include["vars"] = variables
        record = {"ansible.builtin.set_fact": {"messages": "{{ messages | combine({" + repr(name) + ": __message}) }}"}}
        record["vars"] = {"__message": "{{ ansible_failed_result.msg }}"}
        passed = {"ansible.builtin.set_fact": {"messages": "{{ messages | combine({" + repr(name) + ": 'passed'}) }}"}}
        block = {"name": f"Case {name}", "block": [include, passed], "rescue": [record]}
        tasks.append(block | {"when": f"inventory_hostname == {host!r}"})
    out = {
        "ansible.builtin.copy": {
            "content": "{{ messages | to_json }}",
            "dest": f"{tmp_path}/out-{{{{ inventory_hostname }}}}.json",
        }
    }
    tasks.append(out | {"delegate_to": "localhost"})
    play = {"hosts": "spark-a:watcher", "gather_facts": False, "vars": {"messages": {}}, "tasks": tasks}
    (tmp_path / "validate.yml").write_text(yaml.safe_dump([play]))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(validate_inventory()))
    argv = [ansible_tool("ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "validate.yml")]
    env = ansible_env() | {"ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    messages = {}
    for host in ("spark-a", "watcher"):
        messages |= json.loads((tmp_path / f"out-{host}.json").read_text())
    assert messages["defaults"] == "passed"
    assert messages["defaults on the monitoring host"] == "passed"
    assert messages["defaults with router hosts out of reach"] == "passed"
    # Only that case warns (the inventory's own router host is the watcher).
    warning = "WARNING (the run goes on): the router host(s) spark-b, spark-c of group pair_x keep their metrics"
    assert done.stdout.count("WARNING (the run goes on): the router host(s)") == 1
    assert warning in " ".join(done.stdout.split()), done.stdout
    for name, (_, variable, _) in cases.items():
        if name.startswith("defaults"):
            continue
        assert messages[name] != "passed", f"{name}: validate.yml accepted it"
        assert variable in messages[name], f"{name}: the message does not name {variable}: {messages[name]}"
    for secret in (SPARK_PASSWORD, LEAKED, *LEAKED.splitlines()):
        assert secret not in done.stdout + done.stderr
        assert not any(secret in message for message in messages.values())
