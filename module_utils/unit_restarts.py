"""Which vLLM units (re)start, why, with whom and on which image: the serving stage's one decision, as plain
functions.

roles/vllm_server writes each model's unit and secrets file, then asks library/vllm_units (which reads systemd and
the last good configurations on the host and calls plan_units) what to do with each unit. Every restart rule is
here, and tests/unit/test_vllm_units.py covers each one: nothing changed, flags changed, image changed, a pair's
head or worker changed, a unit that failed, a unit that is missing.

The rules:
- A unit whose unit file or secrets file changed in this run restarts with its new configuration (`restarted`,
  with a daemon-reload, since systemd must read the new file).
- A unit of a two-Spark model whose partner restarts with a new configuration restarts too, without a
  daemon-reload: both ranks run one command line, so they never run different configurations, and each side's
  gate sees a clean start. A side that merely was not running needs no partner restart: the running side waits for
  it (the head) or comes back by itself when the head does (the worker, Restart=always).
- An unchanged unit that does not run (stopped, failed, never started) is started (`started`).
- An unchanged running unit is left alone; it is only enabled at boot when it is not.
- daemon_reload only with a changed unit file: NVIDIA documents that a reload can make running containers lose
  their GPUs.
"""

from __future__ import annotations

UNIT_DIR = "/etc/systemd/system"

# What systemd is asked about each unit (library/vllm_units.py runs `systemctl show` with these).
SHOWN_PROPERTIES = ("Id", "FragmentPath", "ActiveState", "SubState", "UnitFileState")

# What can differ between two runs of one configuration without it changing (the memory plan's figures, this run's
# decision, how the image is shown): left out of a last good configuration and of the comparison with it.
VOLATILE_KEYS = (
    "plan",
    "image_shown",
    "restart",
    "action",
    "why",
    "daemon_reload",
    "with_partner",
    "enable",
    "unit_existed",
    "running",
)

# The keys of a unit compared with its last good configuration to say what changed, in the order they are told.
COMPARED_KEYS = ("image", "serve_args", "env", "docker_args", "volumes", "port", "hf_revision")

# The keys of a unit that the roles routing to, watching or measuring a host read (fact vllm_server_endpoints).
ENDPOINT_KEYS = (
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
)
# ... and from its memory plan: what the server holds of a request (vllm_bench's Arena profile keeps within it).
ENDPOINT_PLAN_KEYS = ("max_model_len", "prefix_caching")


def unit_image(model: dict, *, server_image: str, pinned_image_id: str, pinned_image_ref: str) -> dict[str, str]:
    """The image a model's container runs, and how a person sees it: the recipe's own image, else
    vllm_server_image, else the image vllm_image pinned, by its ID (the same whether it was pulled by digest or
    loaded from an archive, and exactly what a rollback returns to). An empty image means none is known yet (check
    mode on a fresh host, before vllm_image pulled it)."""
    own = model.get("recipe_image") or server_image
    if own:
        return {"image": own, "image_shown": own}
    return {"image": pinned_image_id, "image_shown": f"{pinned_image_ref or '?'} (image {pinned_image_id or '?'})"}


def with_images(models: list[dict], **images: str) -> list[dict]:
    """Each model of vllm_server_resolved with its image named (unit_image)."""
    return [{**model, **unit_image(model, **images)} for model in models]


def parse_show(text: str) -> dict[str, dict[str, str]]:
    """The output of `systemctl show --property=Id,...` for several units (one block of KEY=value lines each,
    blocks separated by an empty line), by unit name."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        properties = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if properties.get("Id"):
            units[properties["Id"]] = properties
    return units


def unit_state(unit: str, shown: dict[str, str]) -> dict[str, bool]:
    """What systemd says of one unit: whether it is the file this role writes (existed), whether it runs, whether
    it starts at boot, and whether it failed."""
    return {
        "existed": shown.get("FragmentPath", "") == f"{UNIT_DIR}/{unit}",
        "running": shown.get("SubState", "") == "running",
        "enabled": shown.get("UnitFileState", "") == "enabled",
        "failed": shown.get("ActiveState", "") == "failed",
    }


def flag_values(args: list[str]) -> dict[str, str]:
    """`vllm serve` arguments as {flag: its value(s), joined by spaces}; a flag without a value maps to ""."""
    flags: dict[str, list[str]] = {}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            current = arg
            flags.setdefault(current, [])
        else:
            flags.setdefault(current, []).append(arg)
    return {flag: " ".join(values) for flag, values in flags.items()}


def _flag_changes(old: list[str], new: list[str]) -> list[str]:
    before, after = flag_values(old), flag_values(new)
    changes = []
    for flag in sorted(before.keys() | after.keys()):
        if flag not in after:
            changes.append(f"{flag} removed")
        elif flag not in before:
            changes.append(f"{flag} {after[flag]} added".replace("  ", " "))
        elif before[flag] != after[flag]:
            changes.append(f"{flag} {before[flag]} -> {after[flag]}")
    return changes


def changes_since(last_good: dict | None, model: dict) -> list[str]:
    """What differs between the last good configuration of a unit (its saved JSON) and the new one, for people.
    Environment values are not shown, only their names."""
    if last_good is None:
        return []
    changes = []
    for key in COMPARED_KEYS:
        old, new = last_good.get(key), model.get(key)
        if old == new:
            continue
        if key == "image":
            changes.append(f"image {old} -> {new}")
        elif key == "serve_args":
            changes.extend(_flag_changes(old or [], new or []))
        elif key == "env":
            names = sorted(
                {
                    name
                    for name in (old or {}).keys() | (new or {}).keys()
                    if (old or {}).get(name) != (new or {}).get(name)
                }
            )
            changes.append(f"environment {', '.join(names)}")
        else:
            changes.append(f"{key} {old} -> {new}")
    return changes


def decide(
    model: dict,
    *,
    state: dict[str, bool],
    written: bool,
    last_good: dict | None,
    partner_reconfigured: list[str],
    partner: str,
) -> dict:
    """What happens to one unit in this run: whether it (re)starts (restart), how (action: restarted, started or
    none), why, whether systemd reloads its files first (daemon_reload), whether it restarts only because its pair
    partner does (with_partner), and whether it only needs enabling at boot (enable)."""
    unit = model["unit"]
    base = {
        "unit_existed": state["existed"],
        "running": state["running"],
        # Failed for good (its restart budget spent): the run gives it a new budget before it starts it.
        "failed": state["failed"],
        "with_partner": False,
        "enable": False,
    }
    if written:
        changes = changes_since(last_good, model)
        if last_good is None:
            why = "a new configuration (none has passed the health gate on this host yet)"
        elif changes:
            why = "its configuration changed: " + "; ".join(changes)
        else:
            why = "its unit or secrets file changed"
        return {**base, "restart": True, "action": "restarted", "daemon_reload": True, "why": why}
    if model.get("multinode") and unit in partner_reconfigured:
        why = f"{partner} of its group restart(s) {unit} with a new configuration"
        return {
            **base,
            "restart": True,
            "action": "restarted",
            "daemon_reload": False,
            "with_partner": True,
            "why": why,
        }
    if not state["running"]:
        why = "it had failed" if state["failed"] else "it was not running"
        if not state["existed"]:
            why = "its unit is missing"
        return {**base, "restart": True, "action": "started", "daemon_reload": False, "why": why}
    why = "unchanged and running"
    return {
        **base,
        "restart": False,
        "action": "none",
        "daemon_reload": False,
        "why": why,
        "enable": not state["enabled"],
    }


def plan_units(
    models: list[dict],
    *,
    shown: dict[str, dict[str, str]],
    written: dict[str, bool],
    last_good: dict[str, dict | None],
    partner_reconfigured: list[str] | None = None,
    partner: str = "",
) -> list[dict]:
    """Every unit of the host with its decision (decide), in the order of vllm_server_models (the order they
    restart in). `models` carry their image (with_images); `shown` is parse_show's answer, `written` whether each
    unit's files changed in this run, `last_good` each unit's last good configuration (None when there is none)."""
    return [
        {
            **model,
            **decide(
                model,
                state=unit_state(model["unit"], shown.get(model["unit"], {})),
                written=bool(written.get(model["unit"], False)),
                last_good=last_good.get(model["unit"]),
                partner_reconfigured=partner_reconfigured or [],
                partner=partner,
            ),
        }
        for model in models
    ]


def reconfigured(units: list[dict]) -> list[str]:
    """The units this host restarts with a new configuration of its own (read by a pair's partner)."""
    return [unit["unit"] for unit in units if unit["action"] == "restarted" and not unit["with_partner"]]


def endpoints(units: list[dict]) -> list[dict]:
    """The units that answer the API, as the roles routing to, watching or measuring the host read them: name,
    port, unit, recipe, URL on the host, model, image, the model's files on the host, the memory plan's summary,
    its max_model_len and whether it caches prefixes."""
    return [
        {
            **{key: unit[key] for key in ENDPOINT_KEYS},
            **{key: unit["plan"].get(key) for key in ENDPOINT_PLAN_KEYS},
            "memory": unit["plan"]["summary"],
        }
        for unit in units
        if unit["api"]
    ]
