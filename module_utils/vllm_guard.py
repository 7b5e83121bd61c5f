"""The vLLM guard: what systemd does to a Spark's vLLM units between Ansible runs goes through the rules of a run.

An Ansible run checks the memory before it starts a unit (module_utils/vllm_start_check.py) and holds every start to
the health gate. Between runs systemd starts the units alone: at boot, and after a crash (Restart=). The guard is
the part of those starts that sparkfleet owns. The vllm_server role ships this file to the Spark with the files it
imports (GUARD_FILES, under GUARD_DIR, roles/vllm_server/tasks/guard.yml) and a small entry script, and each vLLM
unit calls it (roles/vllm_server/templates/etc/systemd/system/vllm.service.j2):

  ExecCondition=  sparkfleet-vllm-guard start UNIT     the memory check before every start (start_decision)
  ExecStop=       sparkfleet-vllm-guard stopping UNIT  marks a stop that was asked for, so it is not a crash
  ExecStopPost=   sparkfleet-vllm-guard exited UNIT    records an exit nobody asked for (exit_record)
  OnFailure=      sparkfleet-vllm-failed@UNIT.service  runs `sparkfleet-vllm-guard failed UNIT`: the unit failed for
                                                       good (its restart budget spent, StartLimitBurst)
  sparkfleet-vllm-watch.timer                          runs `sparkfleet-vllm-guard watch` every period: the runtime
                                                       watch (watch_outcome), which restarts a wedged model

The start check is the same rule as Ansible's (vllm_start_check.start_check), on the host's configuration file
(CONFIG_FILE, written by the role: the units in their start order with their planned shares, the margin, the waits):
the units of this Spark that are still loading (their container runs, their /health does not answer 200 yet) take
their whole share first, so at boot the models start one after another, each checked; the start waits up to
memory_wait_s for MemAvailable to come back (after a crash a dying container gives its memory back over seconds),
dropping the page cache as the unit does; and a start that does not fit is refused with one journal line. It is an
ExecCondition, so a refusal leaves the unit inactive and is never restarted: no loop (a failed ExecStartPre would be
restarted by Restart=on-failure, whatever RestartPreventExitStatus says, which only reads the main process).

Every unplanned exit is kept (bounded, RECORDS_KEPT by default) in the unit's exits file beside its last good files:
exit code or signal, an OOM kill, the container's own state, the last log lines, MemAvailable at that moment and
the restart count; refused starts and failures for good too. The counters of every unit are written as node_exporter
textfile metrics (METRICS_FILE), which the fleet_monitoring role alerts on, and status.yml shows the records.

The runtime watch probes every model that answers the API (a group at its head) between runs: /health, then a tiny
greedy generation with a deadline, or the canary the quality gate recorded at the model's first good start where it
is cheap (WATCH_CANARY_MAX_TOKENS), or a pooling model's own probe (model_kinds.probe). A wedge is a probe that gets
no answer in time while the engine processed no token at all meanwhile (vLLM's own token counters on /metrics did
not move): a busy engine is not a wedged one. A wedge, a wrong answer or a dead /health is a failed probe; after
`failures` of them in a row on the same container the watch kills the container, so that systemd restarts it inside
the unit's restart budget (the same guard start check first), and the exit record names the watch as its cause. In
a fleet the router's own /health check takes the Spark's model out of its rotation while it restarts, and back once
it answers; one whose budget is spent stays out.

Standard library only (with the other GUARD_FILES): DGX OS's own python3 runs it, without Ansible.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from ansible.module_utils.atomic_file import write_text_atomically
from ansible.module_utils.memory_units import GIB
from ansible.module_utils.model_kinds import CHAT, probe_problems
from ansible.module_utils.model_kinds import probe as pooling_probe
from ansible.module_utils.quality_checks import canary_problem, held_answers
from ansible.module_utils.startup_times import TEXTFILE_DIR
from ansible.module_utils.unit_restarts import parse_show
from ansible.module_utils.vllm_start_check import StartUnit, memory_figures, start_check

# Where the role puts the guard on a Spark, and what it ships there: this file and what it imports, each under
# ansible/module_utils/ so that their imports work unchanged (the entry script puts GUARD_DIR first on sys.path).
GUARD_DIR = "/usr/local/lib/sparkfleet/vllm-guard"
GUARD_FILES = (
    "vllm_guard.py",
    "vllm_start_check.py",
    "memory_units.py",
    "spark_gpu.py",
    "unit_restarts.py",
    "atomic_file.py",
    "startup_times.py",
    "quality_checks.py",
    "model_kinds.py",
)
GUARD_COMMAND = f"{GUARD_DIR}/sparkfleet-vllm-guard"
# The OnFailure= template unit that reports a unit failed for good.
FAILED_UNIT = "sparkfleet-vllm-failed@.service"
# The host's configuration of the guard (the role writes it, root only, in vllm_server_config_dir).
CONFIG_NAME = "guard.json"
# The unit's exits file: <config_dir>/<slug> + EXITS_SUFFIX, beside <slug>.last-good.json.
EXITS_SUFFIX = ".exits.json"
RECORDS_KEPT = 20
LOG_LINES = 20
# Runtime markers (a stop that was asked for), gone at reboot.
STATE_DIR = "/run/sparkfleet/vllm-guard"
METRICS_FILE = f"{TEXTFILE_DIR}/sparkfleet-vllm-guard.prom"
METRIC_PREFIX = "sparkfleet_vllm_unit"
# The runtime watch's timer and service (sparkfleet-vllm-watch.timer, .service).
WATCH_UNIT = "sparkfleet-vllm-watch"
# A recorded canary is asked by the watch only when it was recorded with at most this many tokens (the quality
# gate's canary_max_tokens): a thinking model's canaries (its reasoning budget, 1024 tokens) are too dear to ask
# every period, so it gets the tiny generation alone.
WATCH_CANARY_MAX_TOKENS = 64
# vLLM's token counters (vllm/v1/metrics/loggers.py, tests/contracts/vllm/metrics.json): any move means the engine
# is working, so a probe that timed out meanwhile met a busy engine, not a wedged one.
PROGRESS_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
# ExecCondition: 1-254 skips the start without a failure (and without a restart); 255 would fail it.
REFUSED = 1

CONFIG_KEYS = {
    "margin_gib", "drop_caches", "memory_wait_s", "queue_wait_s", "poll_s", "records_kept", "watch", "units"
}  # fmt: skip
WATCH_KEYS = {"period_s", "deadline_s", "failures"}
UNIT_KEYS = {
    "unit", "name", "served", "share", "container", "exits", "health_url", "kind", "model", "secrets_file", "canaries"
}  # fmt: skip
SHOWN = ("Id", "ActiveState", "SubState", "Result", "NRestarts")


def paths() -> dict[str, Any]:
    """Where the guard lives on a Spark, for the role (vllm_models returns it as vllm_server_resolved.guard)."""
    return {
        "dir": GUARD_DIR,
        "command": GUARD_COMMAND,
        "files": list(GUARD_FILES),
        "failed_unit": FAILED_UNIT,
        "config_name": CONFIG_NAME,
        "metrics_file": METRICS_FILE,
        "watch_unit": WATCH_UNIT,
    }


def host_config(models: list[Mapping[str, Any]], settings: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The host's guard configuration (CONFIG_NAME): `settings` (margin_gib, drop_caches, memory_wait_s,
    queue_wait_s, watch_period_s, watch_deadline_s, watch_failures) and the served models in their start order
    (`name`, the inventory list: vllm_server_models), each with its planned share."""
    config = {key: settings[key] for key in ("margin_gib", "drop_caches", "memory_wait_s", "queue_wait_s")}
    config["poll_s"] = 5
    config["records_kept"] = RECORDS_KEPT
    config["watch"] = {key: int(settings[f"watch_{key}"]) for key in sorted(WATCH_KEYS)}
    config["units"] = [
        {
            "unit": model["unit"],
            "name": f"{name}[{index}]",
            "served": model["served"],
            "share": float(model["gpu_memory_utilization"]),
            "container": model["container"],
            "exits": model["exits"],
            "health_url": f"{model['url']}/health" if model["api"] else "",
            "kind": model["kind"],
            "model": {"hf_repo": model["hf_repo"], "hf_revision": model["hf_revision"]},
            "secrets_file": model["secrets_file"],
            # The quality gate's record (roles/vllm_server/tasks/gate.yml writes it there).
            "canaries": f"{model['last_good']}.canaries.json",
        }
        for index, model in enumerate(models)
    ]
    return parse_config(json.dumps(config))


class GuardError(Exception):
    """A configuration the guard cannot work with; the start is refused with this message."""


def parse_config(text: str) -> dict[str, Any]:
    """The host's guard configuration (CONFIG_NAME), checked: every key known, the units a list of mappings."""
    try:
        config = json.loads(text)
    except ValueError as error:
        raise GuardError(f"the guard's configuration is not JSON: {error}") from error
    if not isinstance(config, Mapping) or set(config) != CONFIG_KEYS:
        raise GuardError(f"the guard's configuration must hold exactly {', '.join(sorted(CONFIG_KEYS))}")
    if not isinstance(config["watch"], Mapping) or set(config["watch"]) != WATCH_KEYS:
        raise GuardError(f"the guard's watch settings must hold exactly {', '.join(sorted(WATCH_KEYS))}")
    for entry in config["units"]:
        if not isinstance(entry, Mapping) or set(entry) != UNIT_KEYS:
            raise GuardError(f"each unit of the guard's configuration must hold exactly {', '.join(sorted(UNIT_KEYS))}")
    return dict(config)


def unit_entry(config: Mapping[str, Any], unit: str) -> dict[str, Any]:
    for entry in config["units"]:
        if entry["unit"] == unit:
            return dict(entry)
    raise GuardError(f"{unit} is not in the guard's configuration (run the serving stage again)")


def loading(entry: Mapping[str, Any], shown: Mapping[str, str], health: Callable[[str], int | None]) -> bool:
    """Whether another unit of this Spark is loading: its container runs and its /health does not answer 200 yet,
    so it has not taken its whole share of the pool. A unit without an API (a group's worker) is seen at its head."""
    if shown.get("SubState") != "running" or not entry["health_url"]:
        return False
    return health(entry["health_url"]) != 200


def start_units(config: Mapping[str, Any], unit: str, still_loading: list[str]) -> list[StartUnit]:
    """The steps of the start check: the units still loading take their shares first, then this one."""
    steps = [
        StartUnit(name=entry["name"], unit=entry["unit"], gpu_memory_utilization=float(entry["share"]))
        for entry in config["units"]
        if entry["unit"] in still_loading
    ]
    entry = unit_entry(config, unit)
    steps.append(StartUnit(name=entry["name"], unit=unit, gpu_memory_utilization=float(entry["share"])))
    return steps


class Host:
    """What the guard reads and does on the Spark; tests give it another meminfo, clock, systemd and HTTP."""

    def __init__(self, config_dir: str) -> None:
        self.config_dir = config_dir

    def config(self) -> dict[str, Any]:
        path = os.path.join(self.config_dir, CONFIG_NAME)
        try:
            with open(path, encoding="utf-8") as handle:
                return parse_config(handle.read())
        except OSError as error:
            raise GuardError(f"cannot read the guard's configuration {path}: {error}") from error

    def meminfo(self) -> str:
        with open("/proc/meminfo", encoding="ascii") as handle:
            return handle.read()

    def drop_caches(self) -> None:
        """sync, then drop the page cache; a host that forbids it (a container) is tolerated, as the unit allows."""
        os.sync()
        with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as knob:
            knob.write("3\n")

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def run(self, argv: list[str], timeout: float = 30) -> str:
        import subprocess

        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout if done.returncode == 0 else ""

    def show(self, units: list[str]) -> dict[str, dict[str, str]]:
        if not units:
            return {}
        return parse_show(self.run(["systemctl", "show", "--property=" + ",".join(SHOWN), "--", *units]))

    def health(self, url: str) -> int | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code
        except (OSError, ValueError):
            return None

    def get_text(self, url: str, timeout: float = 10) -> str | None:
        """The body of a GET answered 200, else None."""
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return answer.read().decode("utf-8", "replace") if answer.status == 200 else None
        except (OSError, ValueError):
            return None

    def post(self, url: str, body: Mapping[str, Any], api_key: str, timeout: float) -> tuple[int | None, str]:
        """(status, body) of a JSON POST; (None, "timeout") when no answer came within TIMEOUT seconds, (None, the
        error) when it could not be asked."""
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")
        except TimeoutError:
            return None, "timeout"
        except urllib.error.URLError as error:
            return None, "timeout" if isinstance(error.reason, TimeoutError) else str(error.reason)
        except (OSError, ValueError) as error:
            return None, str(error)

    def kill(self, container: str) -> bool:
        """SIGKILL to the container (a wedged engine may never act on SIGTERM): its unit's main process ends."""
        return bool(self.run(["docker", "kill", "--signal", "KILL", "--", container]).strip())

    def container_state(self, container: str) -> dict[str, Any]:
        """docker inspect's State of the unit's container (kept until ExecStopPost removes it), {} when gone."""
        text = self.run(["docker", "inspect", "--format", "{{json .State}}", "--", container])
        try:
            state = json.loads(text) if text.strip() else {}
        except ValueError:
            return {}
        return state if isinstance(state, dict) else {}

    def last_lines(self, unit: str, container: str, count: int = LOG_LINES) -> list[str]:
        """The container's last log lines (vLLM's own traceback), else the unit's journal."""
        text = self.run(["docker", "logs", "--tail", str(count), "--", container])
        if not text.strip():
            text = self.run(["journalctl", "--unit", unit, "--lines", str(count), "--output", "cat", "--no-pager"])
        return text.splitlines()[-count:]


def start_decision(host: Host, unit: str) -> tuple[int, str]:
    """ExecCondition of a unit: (0, the line saying the start fits) or (REFUSED, the reason, one line)."""
    config = host.config()
    entry = unit_entry(config, unit)
    others = [other for other in config["units"] if other["unit"] != unit]
    deadline = host.now() + float(config["queue_wait_s"])
    waited_for: list[str] = []
    while True:
        shown = host.show([other["unit"] for other in others])
        still = [other["unit"] for other in others if loading(other, shown.get(other["unit"], {}), host.health)]
        waited_for = sorted(set(waited_for) | set(still))
        if not still or host.now() >= deadline:
            break
        host.sleep(float(config["poll_s"]))
    deadline = host.now() + float(config["memory_wait_s"])
    while True:
        if config["drop_caches"]:
            host.drop_caches()
        check = start_check(
            memory_figures(host.meminfo()),
            start_units(config, unit, still),
            margin_gib=float(config["margin_gib"]),
            use_available=bool(config["drop_caches"]),
        )
        if check.fits or host.now() >= deadline:
            break
        host.sleep(float(config["poll_s"]))
    after = f" after {', '.join(waited_for)} loaded" if waited_for and not still else ""
    if check.fits:
        loaded = f", {', '.join(still)} still loading counted at their shares" if still else ""
        return 0, (
            f"sparkfleet-vllm-guard: {unit} may start{after}: {check.free_bytes / GIB:,.1f} GiB free "
            f"({check.free_source}) for {check.needed_bytes / GIB:,.1f} GiB of shares + "
            f"{check.margin_bytes / GIB:,.1f} GiB margin{loaded}"
        )
    waited = f" (waited {config['memory_wait_s']} s for memory to come back)"
    return REFUSED, f"sparkfleet-vllm-guard: refused to start {unit} ({entry['served']}){waited}: {check.reasons[0]}"


COUNTERS = (
    "unplanned_exits_total",
    "oom_kills_total",
    "refused_starts_total",
    "failures_total",
    "watch_restarts_total",
)


def exits_document(text: str | None, unit: str) -> dict[str, Any]:
    """A unit's exits file, or a new one: counters and the last records."""
    try:
        document = json.loads(text) if text else None
    except ValueError:
        document = None
    if not isinstance(document, dict) or not isinstance(document.get("records"), list):
        document = {"unit": unit, "records": []}
    for counter in COUNTERS:
        document[counter] = int(document.get(counter) or 0)
    return document


def add_record(document: dict[str, Any], record: Mapping[str, Any], kept: int) -> dict[str, Any]:
    """The document with one record more (the newest last, at most `kept`) and its counters moved."""
    kind = record["kind"]
    counter = {"exit": "unplanned_exits_total", "refused": "refused_starts_total", "failed": "failures_total"}[kind]
    document[counter] += 1
    if record.get("oom_kill"):
        document["oom_kills_total"] += 1
    if record.get("watch"):
        document["watch_restarts_total"] += 1
    document["records"] = [*document["records"], dict(record)][-max(1, kept) :]
    return document


def exit_record(
    env: Mapping[str, str], container: Mapping[str, Any], memory: Mapping[str, int], shown: Mapping[str, str]
) -> dict[str, Any]:
    """What an unplanned exit leaves: systemd's view ($SERVICE_RESULT, $EXIT_CODE, $EXIT_STATUS of ExecStopPost),
    the container's (docker's State: its exit code, OOMKilled, error), MemAvailable now and the restarts so far."""
    result = env.get("SERVICE_RESULT", "")
    oom = result == "oom-kill" or bool(container.get("OOMKilled"))
    how = env.get("EXIT_CODE", "")
    status = env.get("EXIT_STATUS", "")
    return {
        "kind": "exit",
        "service_result": result,
        "exit": f"signal {status}" if how in ("killed", "dumped") else f"status {status}",
        "container_exit_code": container.get("ExitCode"),
        "container_error": container.get("Error") or "",
        "oom_kill": oom,
        "mem_available_gib": round(memory.get("mem_available_bytes", 0) / GIB, 2),
        "restarts": int(shown.get("NRestarts") or 0),
    }


def metrics_text(
    config: Mapping[str, Any],
    documents: Mapping[str, Mapping],
    shown: Mapping,
    now: float,
    watched: Mapping[str, Mapping] | None = None,
) -> str:
    """The textfile metrics of every unit of the host: counters from their exits files, systemd's state, and the
    runtime watch's state of each unit it watches (WATCHED)."""
    families = (
        ("unplanned_exits_total", "counter", "Exits of the vLLM unit that nobody asked for (crash, kill, OOM).",
         lambda doc, _: doc["unplanned_exits_total"]),
        ("oom_kills_total", "counter", "Exits of the vLLM unit that were an OOM kill.",
         lambda doc, _: doc["oom_kills_total"]),
        ("refused_starts_total", "counter", "Starts the guard refused: the planned memory was not free.",
         lambda doc, _: doc["refused_starts_total"]),
        ("restarts", "gauge", "systemd's automatic restarts of the unit since it was last started by hand.",
         lambda _, unit: int(unit.get("NRestarts") or 0)),
        ("failed", "gauge", "1: the unit failed for good (its restart budget spent, or it failed to start).",
         lambda _, unit: int(unit.get("ActiveState") == "failed")),
        ("last_unplanned_exit_timestamp_seconds", "gauge", "When the unit last exited unplanned (0: never kept).",
         lambda doc, _: next((r["timestamp"] for r in reversed(doc["records"]) if r.get("kind") == "exit"), 0)),
    )  # fmt: skip
    lines = []
    for suffix, kind, help_text, value in families:
        name = f"{METRIC_PREFIX}_{suffix}"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for entry in config["units"]:
            labels = f'unit="{label(entry["unit"])}",served="{label(entry["served"])}"'
            document = documents.get(entry["unit"]) or exits_document(None, entry["unit"])
            lines.append(f"{name}{{{labels}}} {value(document, shown.get(entry['unit'], {}))}")
    watch_families = (
        ("watch_failures", "gauge", "Probes of the runtime watch failed in a row on the unit's running container.",
         lambda state: state.get("failures", 0)),
        ("watch_restarts_total", "counter", "Restarts of the unit the runtime watch caused (a wedge, a wrong answer).",
         lambda state: state.get("restarts_total", 0)),
        ("watch_last_pass_timestamp_seconds", "gauge", "When a probe of the runtime watch last passed (0: never).",
         lambda state: state.get("passed_at", 0)),
        ("watch_probe_seconds", "gauge", "How long the runtime watch's last probe of the unit took.",
         lambda state: (state.get("last") or {}).get("seconds", 0)),
    )  # fmt: skip
    for suffix, kind, help_text, value in watch_families:
        name = f"{METRIC_PREFIX}_{suffix}"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for entry in config["units"]:
            if entry["health_url"]:  # a group's worker is watched at its head
                labels = f'unit="{label(entry["unit"])}",served="{label(entry["served"])}"'
                state = {**(watched or {}).get(entry["unit"], {})}
                state["restarts_total"] = (documents.get(entry["unit"]) or {}).get("watch_restarts_total", 0)
                lines.append(f"{name}{{{labels}}} {value(state)}")
    lines += [
        "# HELP sparkfleet_vllm_guard_timestamp_seconds When the guard last wrote these metrics.",
        "# TYPE sparkfleet_vllm_guard_timestamp_seconds gauge",
        f"sparkfleet_vllm_guard_timestamp_seconds {now:.0f}",
    ]
    return "\n".join(lines) + "\n"


def env_file_value(text: str | None, key: str) -> str:
    """KEY's value in an env file the role wrote (KEY=value, the value one shell word: filter env_file_value)."""
    import shlex

    for line in (text or "").splitlines():
        if line.startswith(f"{key}="):
            words = shlex.split(line[len(key) + 1 :])
            return words[0] if words else ""
    return ""


def progress(metrics: str | None) -> float | None:
    """The engine's processed tokens so far (PROGRESS_COUNTERS summed over their labels), None when unknown."""
    if metrics is None:
        return None
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(tuple(name + suffix for name in PROGRESS_COUNTERS for suffix in ("{", " "))):
            with contextlib.suppress(ValueError):
                total += float(line.rsplit(" ", 1)[1])
                seen = True
    return total if seen else None


def watched_canary(record_text: str | None, model: Mapping[str, str]) -> tuple[str, str, int] | None:
    """(prompt, answer, max_tokens) of the cheapest canary the quality gate recorded for this model (its repository
    and revision), None when none was, or only with a thinking model's budget (above WATCH_CANARY_MAX_TOKENS)."""
    try:
        identity = json.loads(record_text or "null").get("model")
    except (ValueError, AttributeError):
        return None
    if not isinstance(identity, dict) or any(identity.get(key) != value for key, value in model.items()):
        return None
    max_tokens = identity.get("max_tokens")
    if not isinstance(max_tokens, int) or not 0 < max_tokens <= WATCH_CANARY_MAX_TOKENS:
        return None
    answers = held_answers(record_text, identity)
    if not answers:
        return None
    prompt = min(answers, key=lambda asked: (len(answers[asked]), asked))
    return prompt, answers[prompt], max_tokens


def container_age(state: Mapping[str, Any], now: float) -> float | None:
    """Seconds since docker started the container (its State.StartedAt, RFC 3339 in UTC), None when unknown."""
    import calendar

    started = str(state.get("StartedAt") or "")
    try:
        stamp = calendar.timegm(time.strptime(started[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return max(0.0, now - stamp)


def probe_request(entry: Mapping[str, Any], canary: tuple[str, str, int] | None) -> tuple[str, dict[str, Any]]:
    """(path, body) of the watch's probe of one unit: the recorded canary, else a one-token greedy generation; a
    pooling model's own probe (model_kinds.probe)."""
    if entry["kind"] != CHAT:
        return pooling_probe(entry["kind"], entry["served"])
    prompt, max_tokens = (canary[0], canary[2]) if canary else ("Hi", 1)
    body = {
        "model": entry["served"],
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return "/v1/chat/completions", body


def answer_problem(entry: Mapping[str, Any], canary: tuple[str, str, int] | None, text: str) -> str | None:
    """What is wrong with the probe's answer (HTTP 200), or None."""
    try:
        answer = json.loads(text)
    except ValueError:
        return f"the answer is not JSON: {text[:200]!r}"
    if not isinstance(answer, dict):
        return f"the answer is not a JSON object: {text[:200]!r}"
    if entry["kind"] != CHAT:
        problems, _ = probe_problems(entry["kind"], answer, entry["served"])
        return problems[0] if problems else None
    if canary:
        problem = canary_problem(answer, canary[1], reasoning_parser=False)
        return f"the canary {canary[0]!r}: {problem}" if problem else None
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    if not (isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] > 0):
        return f"no token generated: {text[:200]!r}"
    return None


def watch_outcome(
    host: Host, config: Mapping[str, Any], entry: Mapping[str, Any], shown: Mapping[str, str], container: Mapping
) -> dict[str, Any]:
    """One probe of one unit: {"outcome": passed|failed|busy|loading|idle, "reason", "seconds", "canary"}.
    idle: the unit or its container does not run (systemd's restarts and the guard's records handle that);
    loading: /health does not answer 200 yet, within the health gate's time of the container's start (queue_wait_s);
    busy: the probe got no answer in time, but the engine processed tokens meanwhile."""
    started = host.now()
    watch = config["watch"]

    def result(outcome: str, reason: str = "", canary: bool = False) -> dict[str, Any]:
        return {"outcome": outcome, "reason": reason, "seconds": round(host.now() - started, 2), "canary": canary}

    if shown.get("SubState") != "running" or not container.get("Running"):
        return result("idle", "the unit or its container is not running")
    status = host.health(entry["health_url"])
    if status != 200:
        age = container_age(container, host.now())
        if age is not None and age < float(config["queue_wait_s"]):
            return result("loading", f"/health answered {status} {age:.0f} s after the container started")
        return result("failed", f"/health answered {status or 'nothing'}")
    base = entry["health_url"].removesuffix("/health")
    canary = watched_canary(read_text(entry["canaries"]), entry["model"]) if entry["kind"] == CHAT else None
    before = progress(host.get_text(f"{base}/metrics"))
    path, body = probe_request(entry, canary)
    api_key = env_file_value(read_text(entry["secrets_file"]), "VLLM_API_KEY")
    code, text = host.post(base + path, body, api_key, float(watch["deadline_s"]))
    if code is None:
        if text != "timeout":
            return result("failed", f"{path} could not be asked: {text}", bool(canary))
        after = progress(host.get_text(f"{base}/metrics"))
        if before is not None and after is not None and after > before:
            return result("busy", f"no answer within {watch['deadline_s']} s, but the engine processed "
                          f"{after - before:.0f} tokens meanwhile", bool(canary))  # fmt: skip
        return result("failed", f"wedged: /health answers 200, but no answer within {watch['deadline_s']} s and no "
                      "token processed meanwhile", bool(canary))  # fmt: skip
    if code != 200:
        return result("failed", f"{path} answered HTTP {code}: {text[:200]!r}", bool(canary))
    problem = answer_problem(entry, canary, text)
    return result("failed", problem, bool(canary)) if problem else result("passed", "", bool(canary))


def label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


class Guard:
    """The guard's commands on a host."""

    def __init__(self, host: Host, metrics_file: str = METRICS_FILE, state_dir: str = STATE_DIR) -> None:
        self.host = host
        self.metrics_file = metrics_file
        self.state_dir = state_dir

    def marker(self, unit: str) -> str:
        return os.path.join(self.state_dir, f"{unit}.stopping")

    def watch_marker(self, unit: str) -> str:
        """Left by the watch when it kills a container: the reason, for the exit record."""
        return os.path.join(self.state_dir, f"{unit}.watch-kill")

    def watch_state_file(self, unit: str) -> str:
        return os.path.join(self.state_dir, f"{unit}.watch.json")

    def watch_state(self, unit: str) -> dict[str, Any]:
        try:
            state = json.loads(read_text(self.watch_state_file(unit)) or "{}")
        except ValueError:
            state = {}
        return state if isinstance(state, dict) else {}

    def keep(self, unit: str, record: Mapping[str, Any]) -> None:
        config = self.host.config()
        entry = unit_entry(config, unit)
        stamped = {"timestamp": round(self.host.now()), **record}
        stamped["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamped["timestamp"]))
        document = add_record(exits_document(read_text(entry["exits"]), unit), stamped, int(config["records_kept"]))
        write_text_atomically(entry["exits"], json.dumps(document, indent=1) + "\n", mode=0o600)

    def write_metrics(self) -> None:
        config = self.host.config()
        units = [entry["unit"] for entry in config["units"]]
        documents = {unit["unit"]: exits_document(read_text(unit["exits"]), unit["unit"]) for unit in config["units"]}
        watched = {unit: self.watch_state(unit) for unit in units}
        text = metrics_text(config, documents, self.host.show(units), self.host.now(), watched)
        write_text_atomically(self.metrics_file, text, mode=0o644)

    def start(self, unit: str) -> tuple[int, str]:
        # A stop marker left by a stop whose ExecStopPost never ran must not hide this start's next exit, nor a
        # watch's marker name the watch as the cause of it.
        for marker in (self.marker(unit), self.watch_marker(unit)):
            with contextlib.suppress(OSError):
                os.unlink(marker)
        try:
            code, line = start_decision(self.host, unit)
        except (GuardError, ValueError, OSError) as error:
            code, line = REFUSED, f"sparkfleet-vllm-guard: refused to start {unit}: {error}"
        if code:
            self.quietly(lambda: self.keep(unit, {"kind": "refused", "reason": line}))
        self.quietly(self.write_metrics)
        return code, line

    def stopping(self, unit: str, env: Mapping[str, str]) -> tuple[int, str]:
        """ExecStop runs for a stop that was asked for, and also after the main process died on its own (systemd
        runs it whenever the start had succeeded); $MAINPID is set only in the first case."""
        if not env.get("MAINPID"):
            return 0, ""
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        with open(self.marker(unit), "w", encoding="ascii") as handle:
            handle.write(env["MAINPID"] + "\n")
        return 0, ""

    def exited(self, unit: str, env: Mapping[str, str]) -> tuple[int, str]:
        """ExecStopPost: keep an exit nobody asked for (not a stop, not a start the condition refused)."""
        if os.path.exists(self.marker(unit)):
            os.unlink(self.marker(unit))
            # A stop that was asked for while the watch was killing the container: no crash, and no marker left to
            # blame the watch for the next one.
            with contextlib.suppress(OSError):
                os.unlink(self.watch_marker(unit))
            self.quietly(self.write_metrics)
            return 0, ""
        if not env.get("EXIT_CODE"):  # the main process never ran: a refused or failed start is kept elsewhere
            self.quietly(self.write_metrics)
            return 0, ""
        entry = unit_entry(self.host.config(), unit)
        record = exit_record(
            env,
            self.host.container_state(entry["container"]),
            memory_figures(self.host.meminfo()),
            self.host.show([unit]).get(unit, {}),
        )
        record["last_lines"] = self.host.last_lines(unit, entry["container"])
        watched = read_text(self.watch_marker(unit))
        if watched is not None:
            os.unlink(self.watch_marker(unit))
            record["watch"] = watched.strip() or "the runtime watch killed it"
        self.keep(unit, record)
        self.quietly(self.write_metrics)
        cause = f", killed by the runtime watch: {record['watch']}" if record.get("watch") else ""
        line = (
            f"sparkfleet-vllm-guard: {unit} exited unplanned ({record['service_result']}, {record['exit']}"
            f"{', OOM kill' if record['oom_kill'] else ''}{cause}), {record['mem_available_gib']:g} GiB available, "
            f"{record['restarts']} restarts so far"
        )
        return 0, line

    def failed(self, unit: str) -> tuple[int, str]:
        """OnFailure: the unit failed and systemd will not restart it (its budget spent, or it never started)."""
        shown = self.host.show([unit]).get(unit, {})
        restarts = int(shown.get("NRestarts") or 0)
        result = shown.get("Result", "")
        if restarts or result == "start-limit-hit":
            why = (
                f"failed for good after {restarts} restarts (its restart budget, vllm_server_restart_burst starts "
                f"within vllm_server_restart_window_s, is spent; result {result or '?'})"
            )
        else:
            why = f"failed (result {result or '?'}) and systemd does not restart it"
        self.keep(unit, {"kind": "failed", "result": result, "restarts": restarts, "reason": why})
        self.quietly(self.write_metrics)
        return 0, f"sparkfleet-vllm-guard: {unit} {why}; `systemctl reset-failed {unit}` and a start, or an Ansible run"

    def watch(self) -> tuple[int, list[str]]:
        """The timer's run: one probe of every unit that answers the API, its state kept in STATE_DIR (failures in a
        row on the same container); at `failures` the container is killed, so systemd restarts it (inside the
        unit's budget, through the start check). One journal line per unit that did not pass."""
        config = self.host.config()
        threshold = int(config["watch"]["failures"])
        entries = [entry for entry in config["units"] if entry["health_url"]]
        shown = self.host.show([entry["unit"] for entry in entries])
        lines = []
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        for entry in entries:
            unit = entry["unit"]
            container = self.host.container_state(entry["container"])
            result = watch_outcome(self.host, config, entry, shown.get(unit, {}), container)
            state = self.watch_state(unit)
            started = str(container.get("StartedAt") or "")
            if state.get("container") != started:  # a new start: its failures start from 0
                state = {"container": started, "failures": 0, "passed_at": state.get("passed_at", 0)}
            outcome = result["outcome"]
            if outcome == "passed":
                state["failures"] = 0
                state["passed_at"] = round(self.host.now())
            elif outcome == "failed":
                state["failures"] = int(state.get("failures", 0)) + 1
            state["last"] = {**result, "at": round(self.host.now())}
            if outcome not in ("passed", "idle"):
                lines.append(
                    f"sparkfleet-vllm-watch: {unit} {outcome}: {result['reason']}"
                    + (f" ({state['failures']} of {threshold} in a row)" if outcome == "failed" else "")
                )
            if outcome == "failed" and state["failures"] >= threshold:
                reason = f"{state['failures']} failed probes in a row, the last: {result['reason']}"
                write_text_atomically(self.watch_marker(unit), reason + "\n", mode=0o600)
                if self.host.kill(entry["container"]):
                    lines.append(f"sparkfleet-vllm-watch: {unit} restarts: its container was killed ({reason})")
                    state["failures"] = 0
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(self.watch_marker(unit))
                    lines.append(f"sparkfleet-vllm-watch: could not kill {entry['container']} of {unit}")
            write_text_atomically(self.watch_state_file(unit), json.dumps(state) + "\n", mode=0o600)
        self.quietly(self.write_metrics)
        return 0, lines

    @staticmethod
    def quietly(action: Callable[[], object]) -> None:
        """Records and metrics are kept as well as they can be; never at the cost of the decision itself."""
        with contextlib.suppress(GuardError, ValueError, OSError):
            action()


def main(argv: list[str], env: Mapping[str, str], config_dir: str) -> int:
    """sparkfleet-vllm-guard start|stopping|exited|failed UNIT, or metrics, or watch: prints its lines, returns the
    code."""
    guard = Guard(Host(config_dir))
    if argv[:1] == ["metrics"]:
        guard.write_metrics()
        return 0
    if argv[:1] == ["watch"]:
        code, lines = guard.watch()
        for line in lines:
            print(line, flush=True)
        return code
    if len(argv) != 2 or argv[0] not in ("start", "stopping", "exited", "failed"):
        print("usage: sparkfleet-vllm-guard start|stopping|exited|failed UNIT | metrics | watch")
        return 2
    command, unit = argv
    if command == "start":
        code, line = guard.start(unit)  # refuses on any error of its own: no start on an unknown memory
    else:
        # A record that cannot be kept must never fail the unit's stop or keep systemd from restarting it.
        try:
            if command == "stopping":
                code, line = guard.stopping(unit, env)
            elif command == "exited":
                code, line = guard.exited(unit, env)
            else:
                code, line = guard.failed(unit)
        except (GuardError, ValueError, OSError) as error:
            code, line = 0, f"sparkfleet-vllm-guard: could not keep the record of {unit}: {error}"
    if line:
        print(line, flush=True)
    return code
