"""The vLLM guard (module_utils/vllm_guard.py): the start check between runs, the records of unplanned exits and the
units' metrics, on a host whose memory, clock, systemd and endpoints the test sets."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import vllm_guard
from helpers import ROOT
from unit_restarts import parse_show
from vllm_guard import REFUSED, Guard, GuardError, Host, host_config, parse_config

GIB_KB = 1024 * 1024  # /proc/meminfo's kB in a GiB


def meminfo(total_gib: float, available_gib: float, free_gib: float | None = None) -> str:
    free = available_gib if free_gib is None else free_gib
    return (
        f"MemTotal: {int(total_gib * GIB_KB)} kB\nMemFree: {int(free * GIB_KB)} kB\n"
        f"MemAvailable: {int(available_gib * GIB_KB)} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    )


def models(tmp_path: Path) -> list[dict]:
    common = {"kind": "chat", "hf_repo": "org/model", "hf_revision": "0" * 40}
    return [
        {"unit": "vllm-a.service", "served": "a", "gpu_memory_utilization": 0.5, "container": "vllm-a",
         "exits": str(tmp_path / "a.exits.json"), "url": "http://127.0.0.1:8000", "api": True, **common,
         "secrets_file": str(tmp_path / "a.secrets.env"), "last_good": str(tmp_path / "a.last-good")},
        {"unit": "vllm-b.service", "served": "b", "gpu_memory_utilization": 0.25, "container": "vllm-b",
         "exits": str(tmp_path / "b.exits.json"), "url": "http://127.0.0.1:8001", "api": True, **common,
         "secrets_file": str(tmp_path / "b.secrets.env"), "last_good": str(tmp_path / "b.last-good")},
    ]  # fmt: skip


SETTINGS = {
    "margin_gib": 3.0, "drop_caches": True, "memory_wait_s": 60, "queue_wait_s": 600,
    "watch_period_s": 60, "watch_deadline_s": 20, "watch_failures": 2,
}  # fmt: skip


class FakeHost(Host):
    """A Spark of 100 GiB whose memory comes back on a schedule, whose units and endpoints the test sets."""

    def __init__(self, tmp_path: Path, available: list[float], states: dict | None = None, health=None) -> None:
        super().__init__(str(tmp_path))
        (tmp_path / vllm_guard.CONFIG_NAME).write_text(json.dumps(host_config(models(tmp_path), SETTINGS, "m")))
        self.available = list(available)
        self.states = states or {}
        self.healthy = health or (lambda url: 200)
        self.clock = 1_000_000.0
        self.drops = 0
        self.probes: list[str] = []

    def meminfo(self) -> str:
        value = self.available.pop(0) if len(self.available) > 1 else self.available[0]
        return meminfo(100, value)

    def drop_caches(self) -> None:
        self.drops += 1

    def now(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.clock += seconds

    def show(self, units: list[str]) -> dict:
        state = self.states(self.clock) if callable(self.states) else self.states
        return {
            unit: {"Id": unit, **state.get(unit, {"ActiveState": "inactive", "SubState": "dead"})} for unit in units
        }

    def health(self, url: str) -> int | None:
        self.probes.append(url)
        return self.healthy(url)

    def container_state(self, container: str) -> dict:
        return {"ExitCode": 137, "OOMKilled": True, "Error": ""}

    def last_lines(self, unit: str, container: str, count: int = 20) -> list[str]:
        return ["RuntimeError: CUDA error: out of memory"]


def guard(tmp_path: Path, host: FakeHost) -> Guard:
    return Guard(host, metrics_file=str(tmp_path / "guard.prom"), state_dir=str(tmp_path / "run"))


def test_a_start_that_fits_may_go_and_the_page_cache_is_dropped_first(tmp_path):
    host = FakeHost(tmp_path, [90])
    code, line = guard(tmp_path, host).start("vllm-a.service")
    assert code == 0
    assert "vllm-a.service may start: 90.0 GiB free (MemAvailable) for 50.0 GiB of shares + 3.0 GiB margin" in line
    assert host.drops == 1


def test_a_start_waits_for_the_memory_a_crash_gives_back(tmp_path):
    host = FakeHost(tmp_path, [20, 30, 40, 60])
    code, line = guard(tmp_path, host).start("vllm-a.service")
    assert code == 0, line
    assert host.clock == 1_000_000 + 3 * 5  # three polls of poll_s
    assert not (tmp_path / "a.exits.json").exists()


def test_a_start_whose_memory_never_comes_back_is_refused_once_with_the_reason_and_recorded(tmp_path):
    host = FakeHost(tmp_path, [40])
    code, line = guard(tmp_path, host).start("vllm-a.service")
    assert code == REFUSED
    assert line.startswith("sparkfleet-vllm-guard: refused to start vllm-a.service (a) (waited 60 s")
    assert "not enough free memory to (re)start vllm-a.service (m[0], gpu_memory_utilization 0.50" in line
    assert "\n" not in line
    assert host.clock - 1_000_000 == 60
    record = json.loads((tmp_path / "a.exits.json").read_text())
    assert record["refused_starts_total"] == 1
    assert record["records"][-1]["kind"] == "refused"
    metrics = (tmp_path / "guard.prom").read_text()
    assert 'sparkfleet_vllm_unit_refused_starts_total{unit="vllm-a.service",served="a"} 1' in metrics
    assert 'sparkfleet_vllm_unit_refused_starts_total{unit="vllm-b.service",served="b"} 0' in metrics


def test_a_model_still_loading_starts_first_and_the_next_waits_for_its_health(tmp_path):
    # vllm-a runs but answers /health only from t0 + 100 s: vllm-b waits, then checks its own share alone.
    healthy_at = 1_000_000 + 100
    host = FakeHost(tmp_path, [50], states={"vllm-a.service": {"ActiveState": "active", "SubState": "running"}})
    host.healthy = lambda url: 200 if host.clock >= healthy_at else None
    code, line = guard(tmp_path, host).start("vllm-b.service")
    assert code == 0, line
    assert host.clock >= healthy_at
    assert "may start after vllm-a.service loaded" in line
    assert "http://127.0.0.1:8000/health" in host.probes


def test_a_model_loading_past_the_wait_is_counted_at_its_whole_share(tmp_path):
    # vllm-a never answers: after queue_wait_s vllm-b must find both shares free (50 + 25 + 3 GiB > 60).
    host = FakeHost(tmp_path, [60], states={"vllm-a.service": {"ActiveState": "active", "SubState": "running"}})
    host.healthy = lambda url: None
    code, line = guard(tmp_path, host).start("vllm-b.service")
    assert code == REFUSED
    assert "vllm-a.service takes 50.0 GiB first" in line
    host = FakeHost(tmp_path, [80], states={"vllm-a.service": {"ActiveState": "active", "SubState": "running"}})
    host.healthy = lambda url: None
    code, line = guard(tmp_path, host).start("vllm-b.service")
    assert code == 0
    assert "vllm-a.service still loading counted at their shares" in line


def test_a_unit_not_in_the_configuration_or_a_broken_configuration_is_refused(tmp_path):
    host = FakeHost(tmp_path, [90])
    code, line = guard(tmp_path, host).start("vllm-other.service")
    assert code == REFUSED
    assert "vllm-other.service is not in the guard's configuration (run the serving stage again)" in line
    (tmp_path / vllm_guard.CONFIG_NAME).write_text('{"units": []}')
    code, line = guard(tmp_path, host).start("vllm-a.service")
    assert code == REFUSED
    assert "the guard's configuration must hold exactly" in line


def test_a_stop_that_was_asked_for_is_not_recorded_but_a_crash_is(tmp_path):
    host = FakeHost(tmp_path, [70], states={"vllm-a.service": {"NRestarts": "2"}})
    g = guard(tmp_path, host)
    g.stopping("vllm-a.service", {"MAINPID": "4242"})
    g.exited("vllm-a.service", {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "143"})
    assert not (tmp_path / "a.exits.json").exists()
    # The main process died on its own: ExecStop runs without $MAINPID, so nothing is marked.
    g.stopping("vllm-a.service", {})
    code, line = g.exited(
        "vllm-a.service", {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "137"}
    )
    assert code == 0
    assert line == (
        "sparkfleet-vllm-guard: vllm-a.service exited unplanned (exit-code, status 137, OOM kill), 70 GiB available, "
        "2 restarts so far"
    )
    document = json.loads((tmp_path / "a.exits.json").read_text())
    record = document["records"][-1]
    assert record["kind"] == "exit"
    assert record["container_exit_code"] == 137 and record["oom_kill"] is True
    assert record["last_lines"] == ["RuntimeError: CUDA error: out of memory"]
    assert record["mem_available_gib"] == 70 and record["restarts"] == 2
    assert document["unplanned_exits_total"] == 1 and document["oom_kills_total"] == 1
    metrics = (tmp_path / "guard.prom").read_text()
    assert 'sparkfleet_vllm_unit_unplanned_exits_total{unit="vllm-a.service",served="a"} 1' in metrics
    assert 'sparkfleet_vllm_unit_oom_kills_total{unit="vllm-a.service",served="a"} 1' in metrics
    assert (
        f'sparkfleet_vllm_unit_last_unplanned_exit_timestamp_seconds{{unit="vllm-a.service",served="a"}} {1_000_000}'
        in metrics
    )
    # A start the condition refused never ran a main process: no exit to record.
    g.exited("vllm-a.service", {"SERVICE_RESULT": "success", "EXIT_CODE": "", "EXIT_STATUS": ""})
    assert json.loads((tmp_path / "a.exits.json").read_text())["unplanned_exits_total"] == 1


def test_a_watch_marker_blames_only_the_exit_it_caused(tmp_path):
    host = FakeHost(tmp_path, [70])
    g = guard(tmp_path, host)
    crash = {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "137"}
    (tmp_path / "run").mkdir(exist_ok=True)
    # The watch killed the container while an owner stopped the unit: a stop, and the marker is gone with it.
    Path(g.watch_marker("vllm-a.service")).write_text("wedged\n")
    g.stopping("vllm-a.service", {"MAINPID": "4242"})
    g.exited("vllm-a.service", crash)
    assert not Path(g.watch_marker("vllm-a.service")).exists()
    # A marker left behind (its exit never recorded) is cleared by the next start.
    Path(g.watch_marker("vllm-a.service")).write_text("wedged\n")
    g.start("vllm-a.service")
    g.exited("vllm-a.service", crash)
    record = json.loads((tmp_path / "a.exits.json").read_text())["records"][-1]
    assert record["kind"] == "exit" and "watch" not in record


def test_a_signal_is_named_as_one(tmp_path):
    host = FakeHost(tmp_path, [70])
    _, line = guard(tmp_path, host).exited(
        "vllm-a.service", {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}
    )
    assert "(signal, signal KILL, OOM kill)" in line


def test_the_records_are_bounded_and_the_counters_keep_counting(tmp_path):
    host = FakeHost(tmp_path, [70])
    g = guard(tmp_path, host)
    for _ in range(vllm_guard.RECORDS_KEPT + 5):
        g.exited("vllm-b.service", {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"})
    document = json.loads((tmp_path / "b.exits.json").read_text())
    assert len(document["records"]) == vllm_guard.RECORDS_KEPT
    assert document["unplanned_exits_total"] == vllm_guard.RECORDS_KEPT + 5


def test_a_unit_failed_for_good_is_recorded_and_shown_in_the_metrics(tmp_path):
    state = {"vllm-b.service": {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "NRestarts": "4"}}
    host = FakeHost(tmp_path, [70], states=state)
    code, line = guard(tmp_path, host).failed("vllm-b.service")
    assert code == 0
    assert "vllm-b.service failed for good after 4 restarts (its restart budget" in line
    assert "systemctl reset-failed vllm-b.service" in line
    metrics = (tmp_path / "guard.prom").read_text()
    assert 'sparkfleet_vllm_unit_failed{unit="vllm-b.service",served="b"} 1' in metrics
    assert 'sparkfleet_vllm_unit_failed{unit="vllm-a.service",served="a"} 0' in metrics
    assert 'sparkfleet_vllm_unit_restarts{unit="vllm-b.service",served="b"} 4' in metrics


def test_the_metrics_file_is_valid_prometheus_text(tmp_path):
    promtool = Path("/usr/bin/promtool")
    if not promtool.exists():
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    host = FakeHost(tmp_path, [70])
    guard(tmp_path, host).write_metrics()
    text = (tmp_path / "guard.prom").read_text()
    done = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True)
    assert "error" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr


def test_systemctl_show_of_several_units_is_read_by_unit():
    text = "Id=vllm-a.service\nActiveState=active\nNRestarts=0\n\nId=vllm-b.service\nActiveState=failed\nNRestarts=4\n"
    shown = parse_show(text)
    assert shown["vllm-b.service"] == {"Id": "vllm-b.service", "ActiveState": "failed", "NRestarts": "4"}


def test_an_unknown_key_in_the_configuration_is_refused(tmp_path):
    config = host_config(models(tmp_path), SETTINGS, "m")
    config["units"][0]["extra"] = 1
    with pytest.raises(GuardError, match="each unit of the guard's configuration must hold exactly"):
        parse_config(json.dumps(config))


def test_the_shipped_files_are_all_the_guard_imports(tmp_path):
    """GUARD_FILES, laid out as the role lays them, run alone with the system's Python (no Ansible on its path)."""
    package = tmp_path / "ansible" / "module_utils"
    package.mkdir(parents=True)
    (tmp_path / "ansible" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    for name in vllm_guard.GUARD_FILES:
        (package / name).write_text((ROOT / "module_utils" / name).read_text())
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from ansible.module_utils.vllm_guard import main; sys.exit(main(['nonsense'], {}, sys.argv[1]))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "usage: sparkfleet-vllm-guard" in done.stdout


def test_a_unit_that_failed_without_a_restart_is_not_said_to_have_spent_its_budget(tmp_path):
    state = {"vllm-a.service": {"ActiveState": "failed", "Result": "dependency", "NRestarts": "0"}}
    _, line = guard(tmp_path, FakeHost(tmp_path, [70], states=state)).failed("vllm-a.service")
    assert "vllm-a.service failed (result dependency) and systemd does not restart it" in line


def test_a_record_that_cannot_be_kept_never_fails_the_units_stop(tmp_path, capsys):
    # No configuration at all: the start is refused, the stop and exit still succeed with a line that says so.
    assert vllm_guard.main(["start", "vllm-a.service"], {}, str(tmp_path)) == REFUSED
    env = {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"}
    assert vllm_guard.main(["exited", "vllm-a.service"], env, str(tmp_path)) == 0
    assert "could not keep the record of vllm-a.service" in capsys.readouterr().out


def test_a_stale_stop_marker_does_not_hide_the_next_crash(tmp_path):
    host = FakeHost(tmp_path, [90])
    g = guard(tmp_path, host)
    g.stopping("vllm-a.service", {"MAINPID": "7"})  # its ExecStopPost never ran
    assert g.start("vllm-a.service")[0] == 0
    g.exited("vllm-a.service", {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"})
    assert json.loads((tmp_path / "a.exits.json").read_text())["unplanned_exits_total"] == 1


def test_the_watch_leaves_a_stopped_or_loading_unit_alone_and_fails_a_dead_health(tmp_path):
    health = {"code": 503}
    host = FakeHost(tmp_path, [90], health=lambda url: health["code"])
    config = host.config()
    entry = config["units"][0]
    running = {"ActiveState": "active", "SubState": "running"}

    def started(seconds_ago: float) -> dict:
        stamp = vllm_guard.time.strftime(
            "%Y-%m-%dT%H:%M:%S.123456789Z", vllm_guard.time.gmtime(host.clock - seconds_ago)
        )
        return {"Running": True, "StartedAt": stamp}

    assert vllm_guard.watch_outcome(host, config, entry, {"SubState": "dead"}, {})["outcome"] == "idle"
    # Within the health gate's time of its start (queue_wait_s, 600 s here) a model is still loading.
    loading = vllm_guard.watch_outcome(host, config, entry, running, started(30))
    assert loading["outcome"] == "loading" and "503 30 s after" in loading["reason"]
    dead = vllm_guard.watch_outcome(host, config, entry, running, started(3600))
    assert dead["outcome"] == "failed" and dead["reason"] == "/health answered 503"


def test_the_watch_reads_the_key_as_the_role_quoted_it_and_the_engines_token_counters():
    key = 'it\'s a "key" $HOME'
    text = f"HF_TOKEN='x'\nVLLM_API_KEY={shlex.quote(key)}\n"
    assert vllm_guard.env_file_value(text, "VLLM_API_KEY") == key
    assert vllm_guard.env_file_value("HF_TOKEN='x'\n", "VLLM_API_KEY") == ""
    metrics = (
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9\n'
    )
    assert vllm_guard.progress(metrics) == 150.0
    assert vllm_guard.progress("# nothing\n") is None and vllm_guard.progress(None) is None


def test_a_watched_units_metrics_start_at_zero_and_a_groups_worker_has_none(tmp_path):
    config = host_config([*models(tmp_path)[:1], {**models(tmp_path)[1], "api": False}], SETTINGS, "vllm_server_models")
    text = vllm_guard.metrics_text(config, {}, {}, 1.0)
    assert 'sparkfleet_vllm_unit_watch_failures{unit="vllm-a.service",served="a"} 0' in text
    assert 'sparkfleet_vllm_unit_watch_restarts_total{unit="vllm-a.service",served="a"} 0' in text
    assert 'watch_failures{unit="vllm-b.service"' not in text
    assert config["watch"] == {"deadline_s": 20, "failures": 2, "period_s": 60}
    with pytest.raises(GuardError, match="watch settings"):
        parse_config(json.dumps({**config, "watch": {"period_s": 60}}))
