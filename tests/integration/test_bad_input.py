"""Bad input, table-driven: each row is one hostile or careless inventory value, given to the real preflight checks
(against this machine with the stand-in nvidia-smi, no converge). The host must stop, and its own failure message
must name the variable and say what is wrong with the value (a secret's value never shown).

How the table runs: each `host` of the table is a synthetic inventory host (this machine over the local
connection) whose host variables are FITS with the values of its rows laid over, and nearly all of them go in one
ansible-playbook run, where Ansible's forks run them side by side. That run plays playbooks/preflight.yml with
`any_errors_fatal` dropped and nothing else changed (written afresh from the real file by each test session), so
that one host's failure stops no other: each host runs the real checks up to the one that catches its values. The
ansible.posix.json callback reports each host's results apart, and each row is asserted on its own host's failure
messages alone. The few hosts that cannot share that run (RUNS says why) have runs of their own, going beside
it; a run of one host plays preflight.yml itself.

Rows of one host are caught by the same check (a check lists every bad value it finds), so the table costs one
host per check instead of one per row: they must set different variables and be caught by one task; a row caught
earlier or later than its host's other rows fails the test, which then names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from helpers.playbook_runs import failures_by_host, json_report
from test_preflight_role import FITS, said

DIGEST = "sha256:" + "1" * 64
QWEN = {"recipe": "qwen3-0.6b"}
LOCKS = {
    "not-yaml": "images: [\n",
    "entry-of-the-wrong-shape": "images:\n  vllm/vllm-openai:cu130-nightly: sha256:abc\n",
}

# (host, variables, what its failure message must say). A host's variables are its rows' merged; the failure
# message of that host must hold the text of each of its rows.
TABLE = [
    # spark_preflight, before any probe
    ("gpu", {"spark_preflight_required_compute_capability": "sm_121"}, 'must look like "12.1" (got "sm_121")'),
    ("memory", {"spark_preflight_min_memory_gib": -1}, "spark_preflight_min_memory_gib must be a positive number"),
    ("disk", {"spark_preflight_disk_checks": [{"path": "data", "min_free_gib": 1}]}, "needs an absolute path"),
    ("types", {"spark_preflight_test_host": "maybe"}, "spark_preflight_test_host"),
    # nvidia_container_toolkit
    ("toolkit-repo", {"nvidia_container_toolkit_key_url": ""}, "apt refuses a repository without its signing key"),
    ("toolkit-version", {"nvidia_container_toolkit_version": "latest"}, "must be a Debian package version such as"),
    (
        "toolkit-values",
        {"nvidia_container_toolkit_key_url": "http://keys.example/gpgkey"},
        "nvidia_container_toolkit_key_url='http://keys.example/gpgkey' uses plain http to another machine",
    ),
    ("toolkit-values", {"nvidia_container_toolkit_smoke_image": "ubuntu --privileged"}, "_smoke_image='ubuntu --p"),
    # vllm_image
    ("image-ref", {"vllm_image_ref": "vllm/vllm-openai"}, "vllm_image_ref must be repository:tag or repository@"),
    (
        "image-archive",
        {"vllm_image_archive_src": "/a.tar", "vllm_image_archive_path": "/b.tar"},
        "Set at most one of vllm_image_archive_src",
    ),
    ("image-types", {"vllm_image_pull_timeout_s": "soon"}, "vllm_image_pull_timeout_s"),
    ("image-values", {"vllm_image_archive_path": "/srv/vllm image.tar"}, "vllm_image_archive_path='/srv/vllm image"),
    ("lock-not-yaml", {"vllm_image_lock_file": "not-yaml"}, "is not YAML"),
    ("lock-shape", {"vllm_image_lock_file": "entry-of-the-wrong-shape"}, "is str, expected a mapping"),
    # vllm_server: its own variables
    ("server-entries", {"vllm_server_models": [{**QWEN, "port": 0}]}, "each with a recipe name and its own integer"),
    (
        "server-values",
        {"vllm_server_image": "--privileged --volume /:/host vllm/vllm-openai:latest"},
        "vllm_server_image='--privileged --volume /:/host vllm/vllm-openai:latest' contains a space",
    ),
    (
        "server-values",
        {"vllm_server_listen_address": "0.0.0.0\nExecStartPre=/bin/touch /pwned"},
        "vllm_server_listen_address='0.0.0.0\\nExecStartPre=/bin/touch /pwned' contains the control character",
    ),
    ("server-values", {"vllm_server_data_dir": "/var/lib/spark:fleet"}, "vllm_server_data_dir='/var/lib/spark:fleet"),
    ("server-values", {"vllm_server_config_dir": "etc/sparkfleet"}, "vllm_server_config_dir='etc/sparkfleet' is not"),
    ("server-values", {"vllm_server_stop_timeout_s": -5}, "vllm_server_stop_timeout_s=-5 is less than 1"),
    ("server-values", {"vllm_server_earlyoom_mem_percent": 150}, "vllm_server_earlyoom_mem_percent=150 is more"),
    ("server-values", {"vllm_server_earlyoom_swap_percent": -1}, "vllm_server_earlyoom_swap_percent=-1 is less"),
    ("server-values", {"vllm_server_health_interval_s": 0}, "vllm_server_health_interval_s=0 is less than 1"),
    ("server-values", {"vllm_server_smoke_prompt": "Hi\nExecStartPre=/bin/id"}, "vllm_server_smoke_prompt='Hi\\n"),
    ("server-values", {"vllm_server_quality_soak_concurrency": 0}, "vllm_server_quality_soak_concurrency=0 is less"),
    ("server-values", {"vllm_server_quality_budget_s": 0}, "vllm_server_quality_budget_s=0 is less than 1"),
    # A probe that may wait longer than the watch's period: the next probe would start before it ends.
    ("server-values", {"vllm_server_watch_deadline_s": 60}, "vllm_server_watch_deadline_s=60 is more than 59"),
    (
        "quality-canaries",
        {"vllm_server_quality_canaries": ["Fine?", "Hi\nExecStartPre=/bin/id"]},
        "vllm_server_quality_canaries='Hi\\nExecStartPre=/bin/id' contains the control character",
    ),
    (
        "quality-expected",
        {"vllm_server_quality_expected": {"qwen3-0.6b": "Paris"}},
        "vllm_server_quality_expected maps",
    ),
    (
        "server-values",
        {"vllm_server_api_key": "sk-sparkfleet-hidden\nExecStartPre=/bin/id"},
        "vllm_server_api_key (value hidden) contains a control character",
    ),
    ("server-values", {"vllm_server_hf_token": "hf_hidden token"}, "vllm_server_hf_token (value hidden) contains a"),
    (
        "server-values-2",
        {"vllm_server_image": "vllm/vllm-openai:latest\nExecStartPre=/bin/sh -c id"},
        "vllm_server_image='vllm/vllm-openai:latest\\nExecStartPre=/bin/sh -c id' contains the control character",
    ),
    ("server-values-2", {"vllm_server_listen_address": "localhost"}, "vllm_server_listen_address='localhost' is"),
    ("server-values-2", {"vllm_server_data_dir": "/var/lib/../etc"}, "vllm_server_data_dir='/var/lib/../etc' contains"),
    # vllm_server: the served models' recipes and overrides (one entry each, all in one list)
    ("recipes", {0: {"served_model_name": "../../../../tmp/x"}}, "served_model_name='../../../../tmp/x': expected a"),
    ("recipes", {1: {"served_model_name": 'qwen"; rm -rf /'}}, "served_model_name='qwen\"; rm -rf /': expected"),
    ("recipes", {2: {"served_model_name": "qwen\nx"}}, "served_model_name='qwen\\nx': expected a served name"),
    ("recipes", {3: {"tensor_parallel_size": 16}}, "vllm_server_models[3] (recipe qwen3-0.6b).tensor_parallel_size=16"),
    (
        "recipes",
        {4: {"serve_flags": {"reasoning-parser": "qwen3\n--trust-remote-code"}}},
        "vllm_server_models[4] (recipe qwen3-0.6b).serve_flags.reasoning-parser='qwen3\\n--trust-remote-code'",
    ),
    ("recipes", {5: {"env": {"VLLM_LOGGING_LEVEL": "INFO\nX=1"}}}, "env.VLLM_LOGGING_LEVEL='INFO\\nX=1': contains"),
    ("recipes", {6: {"image": "vllm/vllm-openai:latest --privileged"}}, "[6] (recipe qwen3-0.6b).image='vllm/vllm-op"),
    ("recipes", {7: {"env": {"HF_TOKEN": "hf_x"}}}, "env.HF_TOKEN: secrets never go in a recipe"),
    ("recipes", {8: {"serve_flags": {"max-num-batched-token": 8192}}}, "--max-num-batched-token is not a flag of"),
    (
        "recipes",
        {9: {"serve_flags": {"allowed-media-domains": ["example.org", "x\nExecStartPre=/bin/id"]}}},
        "serve_flags.allowed-media-domains=['example.org', 'x\\nExecStartPre=/bin/id']: contains the control",
    ),
    (
        "units",
        {0: {"served_model_name": "qwen-a", "gpu_memory_utilization": 0.05}, 1: {"served_model_name": "qwen/a"}},
        "vllm_server_models[1] (qwen/a) and vllm_server_models[0] (qwen-a) would both run as vllm-qwen-a.service",
    ),
    ("open", {"vllm_server_listen_address": "10.0.0.1"}, "vllm_server_listen_address is 10.0.0.1, which other"),
    # model_weights
    ("weights-fan-out", {"model_weights_origin": "no-such-host"}, "model_weights_origin must be '' (every Spark"),
    (
        "weights-values",
        {"model_weights_share_hosts_allow": "10.0.0.0/8\n[root]\n path = /"},
        "model_weights_share_hosts_allow='10.0.0.0/8\\n[root]\\n path = /' contains the control character",
    ),
    (
        "weights-values",
        {"model_weights_hf_endpoint": "http://mirror.lab.example"},
        "model_weights_hf_endpoint='http://mirror.lab.example' uses plain http to another machine",
    ),
    ("weights-values", {"model_weights_venv": "/opt/hf venv"}, "model_weights_venv='/opt/hf venv' contains a"),
    ("weights-values-2", {"model_weights_share_hosts_allow": "*"}, "model_weights_share_hosts_allow='*' allows every"),
    # fleet_router (these hosts are also routers: see GROUPS)
    (
        "router-values",
        {"fleet_router_listen_address": "0.0.0.0\nExecStartPre=/bin/touch /pwned"},
        "fleet_router_listen_address='0.0.0.0\\nExecStartPre=/bin/touch /pwned' contains the control character",
    ),
    ("router-values", {"fleet_router_venv": "/opt/router venv"}, "fleet_router_venv='/opt/router venv' contains a"),
    ("router-values", {"fleet_router_internal_port": 70000}, "fleet_router_internal_port=70000 is not a port"),
    # the models lock: no commit, no lock entry and no Hub (nothing listens on loopback's port 9)
    (
        "model-lock",
        {
            "vllm_server_models": [{**QWEN, "port": 8000, "hf_revision": None}],
            "vllm_server_hf_endpoint": "http://127.0.0.1:9",
            "vllm_server_models_lock_file": "/nonexistent/models.lock.yml",
        },
        "Qwen/Qwen3-0.6B has no pinned commit and the models lock /nonexistent/models.lock.yml has none for branch",
    ),
    # fleet_monitoring (these hosts are also monitoring hosts: see GROUPS)
    (
        "monitoring-values",
        {"fleet_monitoring_prometheus_retention": "30d --web.enable-admin-api"},
        "fleet_monitoring_prometheus_retention='30d --web.enable-admin-api' is not a Prometheus duration",
    ),
    (
        "monitoring-values",
        {"fleet_monitoring_spark_addresses": {"localhost": "10.0.0.5\nx"}},
        "fleet_monitoring_spark_addresses[\"localhost\"]='10.0.0.5\\nx' contains the control character",
    ),
    (
        "monitoring-ports",
        {"fleet_monitoring_node_exporter_port": 8000},
        "fleet_monitoring_node_exporter_port (8000) is the port of one of this",
    ),
    (
        "monitoring-login",
        {"fleet_monitoring_prometheus_listen_address": "0.0.0.0"},
        "fleet_monitoring_prometheus_password must be set",
    ),
]


# The groups a host is in besides `sparks`, by the start of its name: the router's and the monitoring's preflight
# plays run only on hosts of their group.
GROUPS = {"router-": ["router"], "monitoring-": ["monitoring"]}

# The run a host is in, by the start of its name; every other host is in run "table". Ansible ends a playbook
# after a play whose hosts all failed: the router's play, where each of its hosts is meant to fail, would end the
# run before the monitoring play, whose hosts therefore run apart. The fan-out check compares model_weights_origin
# across the hosts of the play: this host's would fail all others, so it runs alone. The models lock is taken once
# for the run, for every host's entries: one host's unlockable entry fails them all, so it runs alone too.
RUNS = {"monitoring-": "monitoring", "weights-fan-out": "weights-fan-out", "model-lock": "model-lock"}

PREFLIGHT = ROOT / "playbooks" / "preflight.yml"
HIDDEN_SECRETS = ("sk-sparkfleet-hidden", "hf_hidden")


@dataclass(frozen=True)
class Outcome:
    """What the run of one synthetic host said about it."""

    failures: list[str]  # the host's own failure messages (failures_by_host)
    output: str  # everything its run printed, all its hosts', for the secrets and for reports


def hosts_of_the_table() -> list[str]:
    return list(dict.fromkeys(host for host, _, _ in TABLE))


def runs_of_the_table() -> dict[str, list[str]]:
    """The hosts of each run (see RUNS)."""
    runs: dict[str, list[str]] = {}
    for host in hosts_of_the_table():
        run = next((name for start, name in RUNS.items() if host.startswith(start)), "table")
        runs.setdefault(run, []).append(host)
    return runs


def host_vars_of(host: str, folder: Path) -> dict:
    """One synthetic host's variables: this machine over the local connection, FITS, every one of its rows'
    variables, each model entry (the `recipes` and `units` hosts') laid over a qwen3-0.6b entry of its own port,
    and lock files written to FOLDER from LOCKS."""
    merged: dict = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    merged.update(FITS)
    entries: dict[int, dict] = {}
    for row_host, variables, _ in TABLE:
        if row_host != host:
            continue
        for key, value in variables.items():
            if isinstance(key, int):
                entries[key] = value
            elif key == "vllm_image_lock_file":
                lock = folder / f"{host}.{value}.lock.yml"
                lock.write_text(LOCKS[value])
                merged[key] = str(lock)
            else:
                merged[key] = value
    if entries:
        count = max(entries) + 1
        merged["vllm_server_models"] = [
            {**QWEN, "port": 8000 + index, "gpu_memory_utilization": 0.05, **entries.get(index, {})}
            for index in range(count)
        ]
    return merged


def inventory_of(hosts: list[str], path: Path) -> Path:
    """An inventory at PATH of HOSTS, all in `sparks` with their variables, some also in the groups of GROUPS."""
    groups: dict[str, dict] = {"sparks": {"hosts": {}}}
    for host in hosts:
        groups["sparks"]["hosts"][host] = host_vars_of(host, path.parent)
        for group in next((names for start, names in GROUPS.items() if host.startswith(start)), []):
            groups.setdefault(group, {"hosts": {}})["hosts"][host] = None
    path.write_text(json.dumps({"all": {"children": groups}}))
    return path


def preflight_for_every_host(folder: Path) -> Path:
    """playbooks/preflight.yml with `any_errors_fatal` dropped from each play, and nothing else changed, written to
    FOLDER: one host's failure then stops that host alone."""
    plays = yaml.safe_load(PREFLIGHT.read_text(encoding="utf-8"))
    for play in plays:
        play.pop("any_errors_fatal", None)
    path = folder / "preflight-every-host-to-its-own-failure.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False, width=120), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(playbook_runs, nvidia_smi_env, tmp_path_factory):
    """This module's runs, handed over at once, the longest first: the table's (a run of one host plays
    preflight.yml itself) and site.yml's."""
    folder = tmp_path_factory.mktemp("bad-input")
    reported = dict(nvidia_smi_env("gb10"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    every_host_to_its_own_failure = preflight_for_every_host(folder)
    for run, hosts in runs_of_the_table().items():
        inventory = inventory_of(hosts, folder / f"inventory-{run}.yml")
        playbook = PREFLIGHT if len(hosts) == 1 else every_host_to_its_own_failure
        playbook_runs.start(run, [ansible_tool("ansible-playbook"), "-i", str(inventory), str(playbook)], reported)
    site = [ansible_tool("ansible-playbook"), "site.yml", "-e", json.dumps({**FITS, "vllm_server_image": "a b"})]
    playbook_runs.start("site.yml", site, nvidia_smi_env("gb10"))
    return playbook_runs


@pytest.fixture(scope="module")
def outcomes(runs) -> dict[str, Outcome]:
    """Every host of the table's outcome, by its name."""
    outcomes = {}
    for run, hosts in runs_of_the_table().items():
        done = runs.result(run)
        failures = failures_by_host(json_report(done))
        outcomes.update({host: Outcome(failures.get(host, []), done.stdout + done.stderr) for host in hosts})
    return outcomes


def test_the_table_is_large_and_each_host_sets_a_variable_once():
    assert len(TABLE) >= 40
    for host in hosts_of_the_table():
        keys = [key for row_host, variables, _ in TABLE if row_host == host for key in variables]
        assert len(keys) == len(set(keys)), f"host {host} sets one variable twice: split it"


def test_the_table_plays_preflight_yml_with_only_any_errors_fatal_dropped(tmp_path):
    plays = yaml.safe_load(PREFLIGHT.read_text(encoding="utf-8"))
    without = [{key: value for key, value in play.items() if key != "any_errors_fatal"} for play in plays]
    assert yaml.safe_load(preflight_for_every_host(tmp_path).read_text(encoding="utf-8")) == without


@pytest.mark.parametrize(
    ("host", "variables", "said_text"),
    TABLE,
    ids=[f"{host}:{next(iter(variables))}" for host, variables, _ in TABLE],
)
def test_bad_input_stops_preflight_naming_the_variable(outcomes, host, variables, said_text):
    outcome = outcomes[host]
    assert outcome.failures, f"host {host} passed preflight with {variables}:\n{outcome.output[-3000:]}"
    # failures_by_host folds line breaks and indentation: so does the expected text.
    wanted = " ".join(said_text.split())
    assert any(wanted in message for message in outcome.failures), (
        f"{said_text!r} not in the failure messages of host {host}: {outcome.failures}"
    )
    for secret in HIDDEN_SECRETS:
        assert secret not in outcome.output


def test_bad_input_in_site_yml_changes_nothing_on_the_host(runs):
    # The whole site.yml with one bad value of a late role: the preflight play stops it before any play that
    # changes a host starts, and no task reports a change.
    done = runs.result("site.yml")
    out = said(done)
    assert done.returncode != 0
    assert "vllm_server_image='a b' contains a space" in out
    assert "changed=0" in out and "changed=1" not in out
    assert "Container runtime |" not in out
    assert "Model serving |" not in out
