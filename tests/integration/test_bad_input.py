"""Bad input, table-driven: each row is one hostile or careless inventory value, given to the real preflight play
(playbooks/preflight.yml, against this machine with the stand-in nvidia-smi, no converge). The run must stop,
and its message must name the variable and say what is wrong with the value (a secret's value never shown).

Rows caught by the same check share one ansible-playbook run (column `run`): a check lists every bad value it
finds at once, so each row of a run is still asserted on its own, and the table costs one run per check instead
of one per row. Rows of one run must set different variables and be caught by one task; a row caught earlier or
later than its run's other rows fails the test, which then names it.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import pytest
from helpers import ROOT, STANDIN_NVIDIA_SMI, ansible_tool
from test_preflight_role import FITS, said

DIGEST = "sha256:" + "1" * 64
QWEN = {"recipe": "qwen3-0.6b"}
LOCKS = {
    "not-yaml": "images: [\n",
    "entry-of-the-wrong-shape": "images:\n  vllm/vllm-openai:cu130-nightly: sha256:abc\n",
}

# (run, variables, what the message must say). Each run's variables are merged; every row's text must appear.
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
    ("recipes", {3: {"tensor_parallel_size": 3}}, "vllm_server_models[3] (recipe qwen3-0.6b).tensor_parallel_size=3"),
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
    # fleet_router (this machine is also the router: see INVENTORIES)
    (
        "router-values",
        {"fleet_router_listen_address": "0.0.0.0\nExecStartPre=/bin/touch /pwned"},
        "fleet_router_listen_address='0.0.0.0\\nExecStartPre=/bin/touch /pwned' contains the control character",
    ),
    ("router-values", {"fleet_router_venv": "/opt/router venv"}, "fleet_router_venv='/opt/router venv' contains a"),
    ("router-values", {"fleet_router_internal_port": 70000}, "fleet_router_internal_port=70000 is not a port"),
    # fleet_monitoring (this machine is also the monitoring host)
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

# This machine in the groups a run needs besides `sparks`, by the run's name: the router's and the monitoring's
# preflight plays run only on hosts of their group.
INVENTORIES = {"router-": ["router"], "monitoring-": ["monitoring"]}


def overrides_of(run: str, tmp_path: Path) -> dict:
    """The extra variables of one run: FITS, every row's variables, each model entry of the `recipes` runs laid
    over a qwen3-0.6b entry of its own port, and lock files written from LOCKS."""
    merged: dict = dict(FITS)
    entries: dict[int, dict] = {}
    for row_run, variables, _ in TABLE:
        if row_run != run:
            continue
        for key, value in variables.items():
            if isinstance(key, int):
                entries[key] = value
            elif key == "vllm_image_lock_file":
                lock = tmp_path / f"{value}.lock.yml"
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


def inventory_with(tmp_path: Path, groups: list[str]) -> Path:
    """The default inventory's one host (this machine, over the local connection), also in GROUPS."""
    host = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}
    inventory = {"all": {"children": {name: {"hosts": host} for name in ["sparks", *groups]}}}
    path = tmp_path / f"inventory-{'-'.join(groups)}.yml"
    path.write_text(json.dumps(inventory))
    return path


@cache
def run_once(run: str, tmp: str) -> subprocess.CompletedProcess:
    tmp_path = Path(tmp)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "nvidia-smi").exists():
        (bin_dir / "nvidia-smi").symlink_to(STANDIN_NVIDIA_SMI)
    env = dict(os.environ, NVIDIA_SMI_STANDIN_PROFILE="gb10", ANSIBLE_FORCE_COLOR="0")
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(ansible_tool("ansible")).parent), "/usr/bin", "/bin"])
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    argv = [ansible_tool("ansible-playbook"), "playbooks/preflight.yml", "-e", json.dumps(overrides_of(run, tmp_path))]
    groups = next((groups for prefix, groups in INVENTORIES.items() if run.startswith(prefix)), [])
    if groups:
        argv += ["-i", str(inventory_with(tmp_path, groups))]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("bad-input"))


def test_the_table_is_large_and_each_run_is_named_once():
    assert len(TABLE) >= 40
    runs = {run for run, _, _ in TABLE}
    for run in runs:
        keys = [key for row_run, variables, _ in TABLE if row_run == run for key in variables]
        assert len(keys) == len(set(keys)), f"run {run} sets one variable twice: split it"


@pytest.mark.parametrize(
    ("run", "variables", "said_text"),
    TABLE,
    ids=[f"{run}:{next(iter(variables))}" for run, variables, _ in TABLE],
)
def test_bad_input_stops_preflight_naming_the_variable(module_tmp, run, variables, said_text):
    done = run_once(run, module_tmp)
    out = said(done)
    assert done.returncode != 0, f"preflight passed with {variables}:\n{done.stdout[-3000:]}"
    # said() joins the folded lines: compare without the line breaks and indentation of the YAML callback.
    assert " ".join(said_text.split()) in out, f"{said_text!r} not in the output of run {run}:\n{done.stdout[-4000:]}"
    for secret in ("sk-sparkfleet-hidden", "hf_hidden"):
        assert secret not in done.stdout + done.stderr


def test_bad_input_in_site_yml_changes_nothing_on_the_host(nvidia_smi_env):
    # The whole site.yml with one bad value of a late role: the preflight play stops it before any play that
    # changes a host starts, and no task reports a change.
    argv = [ansible_tool("ansible-playbook"), "site.yml", "-e", json.dumps({**FITS, "vllm_server_image": "a b"})]
    done = subprocess.run(argv, cwd=ROOT, env=nvidia_smi_env("gb10"), capture_output=True, text=True, timeout=300)
    out = said(done)
    assert done.returncode != 0
    assert "vllm_server_image='a b' contains a space" in out
    assert "changed=0" in out and "changed=1" not in out
    assert "Container runtime |" not in out
    assert "Model serving |" not in out
