"""How deep the task files nest: at most four include hops from a top-level playbook to any task, and no task file
that includes itself. An import_playbook, a role of a play, an include_role/import_role and an
include_tasks/import_tasks each count as one hop; a block counts as none.

The longest chain is printed (pytest -s), so a change that deepens it shows where."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import ROOT

MAX_HOPS = 4
TOP_LEVEL = ["site.yml", "playbooks/update.yml"]
INCLUDE_TASKS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks")
INCLUDE_ROLE = ("ansible.builtin.include_role", "ansible.builtin.import_role")


def load(path: Path) -> list:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or []


def role_file(role: str, tasks_from: str = "main") -> Path:
    name = tasks_from if tasks_from.endswith(".yml") else f"{tasks_from}.yml"
    return ROOT / "roles" / role / "tasks" / name


def literal_items(task: dict) -> list[str]:
    """The loop's items when they are written out (preflight includes one role per item)."""
    loop = task.get("loop")
    return loop if isinstance(loop, list) and all(isinstance(item, str) for item in loop) else []


def included_files(task: dict, here: Path) -> list[Path]:
    """The task files one task leads to."""
    for key in INCLUDE_TASKS:
        if key in task:
            value = task[key]
            name = value["file"] if isinstance(value, dict) else value
            return [here.parent / name]
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


def chains(path: Path, trail: tuple[Path, ...]) -> list[tuple[Path, ...]]:
    """Every chain of files from a top-level playbook down to a file with tasks, through `path`."""
    trail = (*trail, path)
    found: list[tuple[Path, ...]] = [trail]
    if path.parent.name == "tasks" or path.parent.parent.name == "playbooks":
        entries = tasks_of(load(path))
        nested = [file for task in entries for file in included_files(task, path)]
    else:  # a playbook: its imports, its plays' roles and tasks
        nested = []
        for play in load(path):
            if "ansible.builtin.import_playbook" in play:
                nested.append(path.parent / play["ansible.builtin.import_playbook"])
                continue
            for role in play.get("roles", []):
                nested.append(role_file(role["role"] if isinstance(role, dict) else role))
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                nested += [file for task in tasks_of(play.get(section)) for file in included_files(task, path)]
    for file in nested:
        assert file not in trail, f"{file.relative_to(ROOT)} includes itself: {[p.name for p in trail]}"
        found += chains(file, trail)
    return found


@pytest.mark.parametrize("top", TOP_LEVEL)
def test_no_task_is_more_than_four_include_hops_deep(top):
    every = chains(ROOT / top, ())
    longest = max(every, key=len)
    shown = " -> ".join(str(path.relative_to(ROOT)) for path in longest)
    print(f"{top}: longest chain, {len(longest) - 1} hops: {shown}")
    assert len(longest) - 1 <= MAX_HOPS, f"{len(longest) - 1} hops: {shown}"


def test_the_walk_finds_the_deepest_task_files():
    """The walk itself reaches the roles' nested task files (else the depth above would prove nothing)."""
    reached = {path for chain in chains(ROOT / "site.yml", ()) for path in chain}
    assert role_file("vllm_server", "gate") in reached
    assert role_file("model_weights", "copy") in reached
    assert role_file("fleet_router", "validate") in reached
