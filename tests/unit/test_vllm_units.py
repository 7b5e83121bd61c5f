"""module_utils/unit_restarts.py and library/vllm_units.py: which vLLM units (re)start, why, with whom and on which
image. One test per restart rule: nothing changed, flags changed, image changed, a pair's head changed (its worker
restarts with it), a worker changed (its head restarts with it), a unit that failed, a unit that is missing.

The models are the real vllm_models module's answer for the qwen3-0.6b recipe (a single Spark, and both ranks of a
pair); systemd's answer is recorded from the simulated Spark (tests/fixtures/recorded/)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import basic
from helpers import ROOT
from unit_restarts import (
    VOLATILE_KEYS,
    endpoints,
    parse_show,
    plan_units,
    reconfigured,
    unit_image,
    with_images,
)

SHOW_RECORDED = (ROOT / "tests" / "fixtures" / "recorded" / "systemctl-show-three-units.txt").read_text()
PINNED = {"server_image": "", "pinned_image_id": "sha256:" + "a" * 64, "pinned_image_ref": "vllm/vllm-openai@sha256:b"}
HEAD_FABRIC = {
    "pair": "pair_a",
    "rank": 0,
    "head": "spark-1",
    "peers": ["spark-2"],
    "head_address": "192.168.100.10",
    "master_port": 29501,
    "rdma": False,
    "env": {},
}
WORKER_FABRIC = HEAD_FABRIC | {"rank": 1, "peers": ["spark-1"]}


def resolved_models(run_module, entry: dict | None = None, fabric: dict | None = None) -> list[dict]:
    """What preflight resolves for one qwen3-0.6b entry (library/vllm_models), with the pinned image named."""
    result = run_module(
        "vllm_models",
        {
            "models": [{"recipe": "qwen3-0.6b", "port": 8000, "gpu_memory_utilization": 0.3, **(entry or {})}],
            "recipes_dir": str(ROOT / "recipes"),
            "listen_address": "127.0.0.1",
            "data_dir": "/var/lib/sparkfleet",
            "config_dir": "/etc/sparkfleet/vllm",
            "fabric": fabric or {},
            "host": "spark-1",
            "memory_total_bytes": 127_601_400 * 1024,
        },
        check_mode=True,
    )
    assert not result.get("failed"), result
    return with_images(result["models"], **PINNED)


def shown(unit: str, *, running: bool = True, existed: bool = True, enabled: bool = True, failed: bool = False):
    """systemd's answer about one unit, as parse_show reads it."""
    return {
        unit: {
            "Id": unit,
            "ActiveState": "failed" if failed else "active" if running else "inactive",
            "SubState": "failed" if failed else "running" if running else "dead",
            "FragmentPath": f"/etc/systemd/system/{unit}" if existed else "",
            "UnitFileState": "enabled" if enabled else "disabled" if existed else "",
        }
    }


def record(model: dict, **changes: object) -> dict:
    """The model's last good configuration as the gate keeps it, with CHANGES (the configuration that ran before)."""
    return {key: value for key, value in model.items() if key not in VOLATILE_KEYS} | changes


def plan_one(model: dict, *, state: dict | None = None, written: bool = False, last_good=None, **partner) -> dict:
    (unit,) = plan_units(
        [model],
        shown=state if state is not None else shown(model["unit"]),
        written={model["unit"]: written},
        last_good={model["unit"]: last_good},
        **partner,
    )
    return unit


@pytest.fixture(scope="module")
def _models(run_module) -> dict:
    """The single Spark's model, and the head's and worker's of a pair, as preflight resolves them."""
    return {
        "single": resolved_models(run_module)[0],
        "head": resolved_models(run_module, {"tensor_parallel_size": 2}, HEAD_FABRIC)[0],
        "worker": resolved_models(run_module, {"tensor_parallel_size": 2}, WORKER_FABRIC)[0],
    }


@pytest.fixture(scope="module")
def single(_models) -> dict:
    return _models["single"]


# --- the restart rules -------------------------------------------------------------------------------------------


def test_nothing_changed_leaves_a_running_unit_alone(single):
    unit = plan_one(single, last_good=record(single))
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (False, "none", False)
    assert unit["why"] == "unchanged and running"
    assert unit["enable"] is False


def test_an_unchanged_unit_that_does_not_start_at_boot_is_only_enabled(single):
    unit = plan_one(single, state=shown(single["unit"], enabled=False))
    assert unit["restart"] is False
    assert unit["enable"] is True


def test_changed_flags_restart_the_unit_after_a_reload_and_say_which(single):
    before = single["serve_args"]
    at = before.index("--max-model-len")
    old_args = [*before[: at + 1], "4096", *before[at + 2 :]]
    unit = plan_one(single, written=True, last_good=record(single, serve_args=old_args))
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (True, "restarted", True)
    new_length = single["serve_args"][at + 1]
    assert unit["why"] == f"its configuration changed: --max-model-len 4096 -> {new_length}"
    assert reconfigured([unit]) == [single["unit"]]


def test_a_changed_image_restarts_the_unit_and_names_both_images(single):
    unit = plan_one(single, written=True, last_good=record(single, image="sha256:" + "0" * 64))
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (True, "restarted", True)
    assert unit["why"] == f"its configuration changed: image sha256:{'0' * 64} -> {single['image']}"


def test_changed_files_with_the_same_settings_still_restart(single):
    # The secrets file (an API key) or the unit template itself changed: the settings compare equal.
    unit = plan_one(single, written=True, last_good=record(single))
    assert (unit["restart"], unit["action"]) == (True, "restarted")
    assert unit["why"] == "its unit or secrets file changed"


def test_a_first_configuration_restarts_without_a_last_good_one(single):
    unit = plan_one(single, written=True, last_good=None)
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (True, "restarted", True)
    assert unit["why"] == "a new configuration (none has passed the health gate on this host yet)"


def test_a_new_unit_in_check_mode_is_not_known_to_systemd(single):
    # Check mode writes nothing, so systemd knows no such unit: the restart task skips it (unit_existed).
    unit = plan_one(single, state={}, written=True)
    assert (unit["restart"], unit["action"], unit["unit_existed"]) == (True, "restarted", False)


def test_a_pair_head_that_changed_restarts_its_worker_with_it(_models):
    head, worker = _models["head"], _models["worker"]
    head_unit = plan_one(head, written=True, last_good=record(head))
    partner_restarts = reconfigured([head_unit])
    unit = plan_one(worker, partner_reconfigured=partner_restarts, partner="spark-1")
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (True, "restarted", False)
    assert unit["with_partner"] is True
    assert unit["why"] == f"spark-1 of its group restart(s) {worker['unit']} with a new configuration"
    # A restart for the partner is no new configuration of this side's own: it is not passed back.
    assert reconfigured([unit]) == []


def test_a_worker_that_changed_restarts_its_head_with_it(_models):
    head, worker = _models["head"], _models["worker"]
    worker_unit = plan_one(worker, written=True, last_good=record(worker))
    unit = plan_one(head, partner_reconfigured=reconfigured([worker_unit]), partner="spark-2")
    assert (unit["restart"], unit["with_partner"], unit["daemon_reload"]) == (True, True, False)


def test_a_pair_side_restarts_for_its_own_change_not_for_its_partner(_models):
    worker = _models["worker"]
    unit = plan_one(worker, written=True, last_good=record(worker), partner_reconfigured=[worker["unit"]])
    assert (unit["with_partner"], unit["daemon_reload"]) == (False, True)


def test_a_single_spark_unit_never_restarts_for_a_partner(single):
    unit = plan_one(single, partner_reconfigured=[single["unit"]], partner="spark-2")
    assert unit["restart"] is False


def test_a_failed_unit_is_started_again_without_a_reload(single):
    unit = plan_one(single, state=shown(single["unit"], running=False, failed=True))
    assert (unit["restart"], unit["action"], unit["daemon_reload"]) == (True, "started", False)
    assert unit["why"] == "it had failed"


def test_a_stopped_unit_is_started(single):
    unit = plan_one(single, state=shown(single["unit"], running=False))
    assert (unit["action"], unit["why"]) == ("started", "it was not running")


def test_a_missing_unit_is_started_and_said_missing(single):
    # Check mode on a fresh host: the unit file was not written, so systemd knows no such unit.
    unit = plan_one(single, state={}, written=False)
    assert (unit["restart"], unit["action"], unit["unit_existed"]) == (True, "started", False)
    assert unit["why"] == "its unit is missing"


# --- images, systemd's answer, endpoints -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe_image", "server_image", "image", "image_shown"),
    [
        ("registry.lab/vllm:own", "vllm/vllm-openai:v1", "registry.lab/vllm:own", "registry.lab/vllm:own"),
        ("", "vllm/vllm-openai:v1", "vllm/vllm-openai:v1", "vllm/vllm-openai:v1"),
        ("", "", PINNED["pinned_image_id"], f"vllm/vllm-openai@sha256:b (image {PINNED['pinned_image_id']})"),
    ],
)
def test_a_recipe_image_wins_then_the_server_image_then_the_pinned_one(recipe_image, server_image, image, image_shown):
    images = PINNED | {"server_image": server_image}
    assert unit_image({"recipe_image": recipe_image}, **images) == {"image": image, "image_shown": image_shown}


def test_no_image_is_known_before_the_image_role_pinned_one():
    named = unit_image({"recipe_image": ""}, server_image="", pinned_image_id="", pinned_image_ref="")
    assert named == {"image": "", "image_shown": "? (image ?)"}


def test_systemds_recorded_answer_about_three_units_is_read_unit_by_unit():
    units = parse_show(SHOW_RECORDED)
    assert sorted(units) == ["vllm-a.service", "vllm-b.service", "vllm-missing.service"]
    assert units["vllm-a.service"]["SubState"] == "running"
    assert units["vllm-b.service"]["ActiveState"] == "failed"
    assert units["vllm-b.service"]["UnitFileState"] == "enabled"
    assert units["vllm-missing.service"]["FragmentPath"] == ""


def test_the_recorded_states_decide_as_their_words_say(single):
    models = [single | {"unit": name} for name in ("vllm-a.service", "vllm-b.service", "vllm-missing.service")]
    units = plan_units(models, shown=parse_show(SHOW_RECORDED), written={}, last_good={})
    assert [(unit["action"], unit["why"]) for unit in units] == [
        ("none", "unchanged and running"),
        ("started", "it had failed"),
        ("started", "its unit is missing"),
    ]
    # vllm-a is a static unit (no [Install] section): not "enabled", so it is enabled at boot.
    assert units[0]["enable"] is True


def test_only_units_that_answer_the_api_are_endpoints(_models):
    head, worker = _models["head"], _models["worker"]
    units = plan_units([head], shown=shown(head["unit"]), written={}, last_good={})
    units += plan_units([worker], shown=shown(worker["unit"]), written={}, last_good={})
    (endpoint,) = endpoints(units)
    assert endpoint["unit"] == head["unit"] and endpoint["url"] == "http://127.0.0.1:8000"
    assert endpoint["image_shown"] == head["image_shown"]
    assert endpoint["memory"] == head["plan"]["summary"]
    assert endpoint["kind"] == "chat"
    assert set(endpoint) == {
        "served",
        "aliases",
        "kind",
        "port",
        "unit",
        "recipe",
        "url",
        "hf_repo",
        "hf_revision",
        "image_shown",
        "snapshot",
        "memory",
        "max_model_len",
        "prefix_caching",
    }
    assert endpoint["snapshot"] == head["snapshot"]
    assert (endpoint["max_model_len"], endpoint["prefix_caching"]) == (
        head["plan"]["max_model_len"],
        head["plan"]["prefix_caching"],
    )


# --- the module ----------------------------------------------------------------------------------------------------


def test_the_module_asks_systemd_once_and_reads_the_last_good_configuration(run_module, monkeypatch, tmp_path, single):
    model = single | {"last_good": str(tmp_path / "qwen.last-good"), "unit": "vllm-a.service"}
    (tmp_path / "qwen.last-good.json").write_text(json.dumps(record(model, image="sha256:" + "0" * 64)))
    asked = []

    def systemctl(_self, argv, **_kwargs):
        asked.append(argv)
        return 0, SHOW_RECORDED, ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", systemctl)
    result = run_module("vllm_units", {"models": [model], "written": {"vllm-a.service": True}}, check_mode=True)
    assert asked == [
        ["systemctl", "show", "--property=Id,FragmentPath,ActiveState,SubState,UnitFileState", "vllm-a.service"]
    ]
    assert result["changed"] is False
    (unit,) = result["units"]
    assert unit["action"] == "restarted" and unit["why"].startswith("its configuration changed: image sha256:000")
    assert result["reconfigured"] == ["vllm-a.service"]
    assert result["volatile_keys"] == list(VOLATILE_KEYS)


def test_the_module_fails_naming_the_command_when_systemd_does_not_answer(run_module, monkeypatch, single):
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda _self, argv, **_kw: (1, "", "Failed to connect"))
    result = run_module("vllm_units", {"models": [single]})
    assert result["failed"] and "systemctl show" in result["msg"] and "Failed to connect" in result["msg"]
