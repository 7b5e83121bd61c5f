"""How the playbooks are laid out and how deep the task files nest.

Every entry playbook is at the repository root (kubespray's cluster.yml -> playbooks/cluster.yml), and playbooks/
holds only the stages they import (and, at the entries' old paths, notices that fail naming the new one). From
every root playbook, at most four include hops reach any task, and no task file includes itself. An
import_playbook, a role of a play, an include_role/import_role and an include_tasks/import_tasks each count as one
hop; a block counts as none. The stage tags are set in the root playbooks alone, so each says what its tags run.

The longest chain is printed (pytest -s), so a change that deepens it shows where."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

MAX_HOPS = 4
IMPORT_PLAYBOOK = "ansible.builtin.import_playbook"
INCLUDE_TASKS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks")
INCLUDE_ROLE = ("ansible.builtin.include_role", "ansible.builtin.import_role")
# The entries that provision before doing their own part import site.yml's stages themselves (importing site.yml
# would add a hop); they must stay site.yml's, with its tags, in its order.
PROVISION_FIRST = ["bench.yml", "acceptance.yml"]


@functools.cache
def load(path: Path) -> list:
    """A YAML file's entries, read once (the walks below read each file many times)."""
    return yaml.safe_load(path.read_text(encoding="utf-8")) or []


def is_playbook(entries: object) -> bool:
    """A list of plays (each names its hosts or imports a playbook), as opposed to a task list or other YAML."""
    return (
        isinstance(entries, list)
        and bool(entries)
        and all(isinstance(entry, dict) and ("hosts" in entry or IMPORT_PLAYBOOK in entry) for entry in entries)
    )


ROOT_PLAYBOOKS = sorted(path.name for path in ROOT.glob("*.yml") if is_playbook(load(path)))
STAGE_FOLDER = ROOT / "playbooks"


def role_file(role: str, tasks_from: str = "main") -> Path:
    name = tasks_from if tasks_from.endswith(".yml") else f"{tasks_from}.yml"
    return ROOT / "roles" / role / "tasks" / name


def literal_items(task: dict) -> list[str]:
    """The loop's items when they are written out (preflight includes one role per item)."""
    loop = task.get("loop")
    return loop if isinstance(loop, list) and all(isinstance(item, str) for item in loop) else []


def included_files(task: dict, here: Path) -> list[Path]:
    """The task files one task leads to. A play's include_tasks is relative to its playbook's folder, as is one of
    a task file outside a role (playbooks/tasks/)."""
    for key in INCLUDE_TASKS:
        if key in task:
            value = task[key]
            name = value["file"] if isinstance(value, dict) else value
            return [(here.parent / name).resolve()]
    for key in INCLUDE_ROLE:
        if key in task:
            value = task[key]
            names = literal_items(task) if "{{" in value["name"] else [value["name"]]
            return [role_file(name, value.get("tasks_from", "main")) for name in names]
    return []


def tasks_of(entries: list) -> list[dict]:
    """Every task of a task list, blocks opened (a block is no hop)."""
    found = []
    for task in entries or []:
        found.append(task)
        for section in ("block", "rescue", "always"):
            found += tasks_of(task.get(section))
    return found


def imported_playbooks(path: Path) -> list[Path]:
    """The playbooks one playbook imports, in order, as resolved paths."""
    return [(path.parent / play[IMPORT_PLAYBOOK]).resolve() for play in load(path) if IMPORT_PLAYBOOK in play]


def chains(path: Path, trail: tuple[Path, ...]) -> list[tuple[Path, ...]]:
    """Every chain of files from a top-level playbook down to a file with tasks, through `path`."""
    trail = (*trail, path)
    found: list[tuple[Path, ...]] = [trail]
    if not path.exists():  # test_every_included_file_exists names it
        return found
    entries = load(path)
    if not is_playbook(entries):  # a task list
        nested = [file for task in tasks_of(entries) for file in included_files(task, path)]
    else:  # a playbook: its imports, its plays' roles and tasks
        nested = []
        for play in entries:
            if IMPORT_PLAYBOOK in play:
                nested.append((path.parent / play[IMPORT_PLAYBOOK]).resolve())
                continue
            for role in play.get("roles", []):
                nested.append(role_file(role["role"] if isinstance(role, dict) else role))
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                nested += [file for task in tasks_of(play.get(section)) for file in included_files(task, path)]
    for file in nested:
        assert file not in trail, f"{file.relative_to(ROOT)} includes itself: {[p.name for p in trail]}"
        found += chains(file, trail)
    return found


@functools.cache
def stages() -> frozenset[Path]:
    """The playbooks under playbooks/ that some root playbook imports."""
    return frozenset(
        imported
        for top in ROOT_PLAYBOOKS
        for chain in chains(ROOT / top, ())
        for imported in chain
        if imported.parent == STAGE_FOLDER
    )


def stage_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported path, tags) of each import_playbook of a root playbook, in order."""
    return [(play[IMPORT_PLAYBOOK], play.get("tags", [])) for play in load(path) if IMPORT_PLAYBOOK in play]


def test_the_root_playbooks_are_found():
    assert {"site.yml", "update.yml", "bench.yml", "acceptance.yml", "recipe_new.yml"} <= set(ROOT_PLAYBOOKS)


@pytest.mark.parametrize("top", ROOT_PLAYBOOKS)
def test_no_task_is_more_than_four_include_hops_deep(top):
    every = chains(ROOT / top, ())
    longest = max(every, key=len)
    shown = " -> ".join(str(path.relative_to(ROOT)) for path in longest)
    print(f"{top}: longest chain, {len(longest) - 1} hops: {shown}")
    assert len(longest) - 1 <= MAX_HOPS, f"{len(longest) - 1} hops: {shown}"


@pytest.mark.parametrize("top", ROOT_PLAYBOOKS)
def test_every_included_file_exists(top):
    missing = {
        f"{chain[-2].relative_to(ROOT)} -> {chain[-1].relative_to(ROOT)}"
        for chain in chains(ROOT / top, ())
        if not chain[-1].exists()
    }
    assert not missing, f"{top} leads to files that do not exist:\n" + "\n".join(sorted(missing))


def test_the_walk_finds_the_deepest_task_files():
    """The walk itself reaches the roles' nested task files (else the depth above would prove nothing)."""
    reached = {path for chain in chains(ROOT / "site.yml", ()) for path in chain}
    assert role_file("vllm_server", "gate") in reached
    assert role_file("model_weights", "copy") in reached
    assert role_file("fleet_router", "validate") in reached
    rolling = {path for chain in chains(ROOT / "update.yml", ()) for path in chain}
    assert STAGE_FOLDER / "tasks" / "update_batch.yml" in rolling
    assert role_file("fleet_router", "drain") in rolling


def test_the_walk_counts_a_hop_through_another_root_playbook(tmp_path):
    """An entry that imports site.yml is one hop deeper than site.yml (the walk once took such an import, written
    ../site.yml from playbooks/, for a task file and missed the hop)."""
    entry = tmp_path / "entry.yml"
    entry.write_text(f"- {IMPORT_PLAYBOOK}: {ROOT / 'site.yml'}\n", encoding="utf-8")
    deepest = max(len(chain) for chain in chains(ROOT / "site.yml", ()))
    assert max(len(chain) for chain in chains(entry, ())) == deepest + 1


@pytest.mark.parametrize("stage", sorted(STAGE_FOLDER.glob("*.yml")), ids=lambda path: path.name)
def test_playbooks_holds_only_stages_and_moved_notices(stage):
    """A playbook under playbooks/ is a stage a root playbook imports, or a notice at an entry's old path that
    fails at once, naming the root playbook it moved to (which exists)."""
    if stage.resolve() in stages():
        return
    plays = load(stage)
    fails = [task for play in plays for task in play.get("tasks", []) if "ansible.builtin.fail" in task]
    message = " ".join(" ".join(str(task["ansible.builtin.fail"].get("msg", "")).split()) for task in fails)
    assert (ROOT / stage.name).exists() and f"moved to {stage.name} at the repository root" in message, (
        f"playbooks/{stage.name} is imported by no root playbook: an entry playbook belongs at the root"
    )
    assert all(play.get("hosts") == "all:localhost" and "always" in play.get("tags", []) for play in plays), (
        f"playbooks/{stage.name}: the notice must run with any --tags and --limit (hosts all:localhost, tag always)"
    )


def test_stage_tags_are_set_in_the_root_playbooks_alone():
    """No stage playbook tags a play, a role or a task: the root playbook that imports it says what each tag runs
    (a tag hidden in a stage once made --tags serving run a role site.yml did not show)."""
    tagged = []
    for stage in sorted(stages()):
        for play in load(stage):
            where = f"{stage.relative_to(ROOT)}: {play.get('name', '?')}"
            if "tags" in play:
                tagged.append(where)
            tagged += [f"{where}: role {role.get('role')}" for role in play.get("roles", []) if "tags" in role]
            for section in ("pre_tasks", "tasks", "post_tasks"):
                tagged += [f"{where}: {task.get('name')}" for task in tasks_of(play.get(section)) if "tags" in task]
    assert not tagged, "tags set inside stage playbooks (set them where site.yml imports the stage):\n" + "\n".join(
        tagged
    )


def test_every_stage_import_of_site_yml_carries_a_tag():
    untagged = [path for path, tags in stage_imports(ROOT / "site.yml") if not tags]
    assert not untagged, f"site.yml imports these without a tag, so no --tags can run them alone: {untagged}"


@pytest.mark.parametrize("entry", PROVISION_FIRST)
def test_the_entries_that_provision_first_import_site_yml_stages(entry):
    assert stage_imports(ROOT / entry) == stage_imports(ROOT / "site.yml"), (
        f"{entry} must import site.yml's stages, with site.yml's tags, in site.yml's order"
    )
