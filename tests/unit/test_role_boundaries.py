"""Roles share only documented public facts (DebOps' rule): a role's tasks, variables and templates may name another
role's variable only when that role lists it under "Public facts" in its meta/argument_specs.yml. Messages may
still name another role's input, to tell the user what to set; comments are not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "meta" / "argument_specs.yml").is_file())
# Task keys whose text is for the user, not a value the role reads.
MESSAGE_KEYS = {"name", "msg", "fail_msg", "success_msg", "description"}
JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.S)


def public_facts(role: str) -> set[str]:
    """The facts a role documents as public: C(<role>_...) in a "Public facts" line of any entry point."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    lines = [line for entry in specs.values() for line in entry.get("description") or [] if isinstance(line, str)]
    text = " ".join(line for line in lines if line.startswith("Public facts"))
    return set(re.findall(rf"C\(({role}_\w+)\)", text))


def read_values(node: object) -> list[str]:
    """Every string a task file or variables file evaluates, without the messages."""
    if isinstance(node, dict):
        return [text for key, value in node.items() if key not in MESSAGE_KEYS for text in read_values(value)]
    if isinstance(node, list):
        return [text for item in node for text in read_values(item)]
    return [node] if isinstance(node, str) else []


def texts_of(role: str) -> list[tuple[Path, str]]:
    found = []
    for path in sorted((ROOT / "roles" / role).rglob("*")):
        if "meta" in path.parts or not path.is_file():
            continue
        if path.suffix == ".yml":
            found += [(path, text) for text in read_values(yaml.safe_load(path.read_text()))]
        elif path.suffix == ".j2":
            found.append((path, JINJA_COMMENT.sub("", path.read_text())))
    return found


def test_the_roles_publish_facts():
    """The rule below proves something only if the roles do declare what they share."""
    assert {"vllm_server_resolved", "vllm_server_endpoints"} <= public_facts("vllm_server")
    assert {"spark_fabric_node"} <= public_facts("spark_fabric")


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_only_the_public_facts_of_other_roles(role):
    allowed = {fact for other in ROLES if other != role for fact in public_facts(other)}
    others = "|".join(other for other in ROLES if other != role)
    pattern = re.compile(rf"\b(?:{others})_\w+")
    read = {
        (str(path.relative_to(ROOT)), name)
        for path, text in texts_of(role)
        for name in pattern.findall(text)
        if name not in allowed
    }
    assert not read, f"{role} reads other roles' inputs or internals: {sorted(read)}"


# --- project facts: set by the entry playbooks, declared in one list (docs/stages.md, "Project facts") -----------

STAGES_DOC = ROOT / "docs" / "stages.md"
PROJECT_NAME = re.compile(r"\bsparkfleet_\w+")
TASK_LISTS = ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")


def declared_project_names(doc: Path = STAGES_DOC) -> set[str]:
    """The `sparkfleet_` names of the "Project facts" section: a bullet each (facts, then shared inputs)."""
    text = doc.read_text(encoding="utf-8")
    section = text.split("## Project facts", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `(sparkfleet_\w+)`", section, flags=re.M))


def playbook_files(root: Path = ROOT) -> list[Path]:
    """Every playbook and task file outside the roles: the entry playbooks at the root, and playbooks/."""
    root_playbooks = [path for path in sorted(root.glob("*.yml")) if isinstance(yaml.safe_load(path.read_text()), list)]
    return root_playbooks + sorted((root / "playbooks").rglob("*.yml"))


def facts_set(node: object) -> set[str]:
    """The facts that the plays or tasks of NODE set with set_fact (at any depth of blocks)."""
    if isinstance(node, list):
        return {name for item in node for name in facts_set(item)}
    if not isinstance(node, dict):
        return set()
    names = set()
    for key in ("ansible.builtin.set_fact", "set_fact"):
        if isinstance(node.get(key), dict):
            names |= {name for name in node[key] if name != "cacheable"}
    for key in TASK_LISTS:
        names |= facts_set(node.get(key))
    return names


def undeclared_facts(files: list[Path], declared: set[str]) -> set[tuple[str, str]]:
    """(file, fact) for each fact a playbook sets that is neither internal (`__`) nor declared."""
    return {
        (path.name, name)
        for path in files
        for name in facts_set(yaml.safe_load(path.read_text()))
        if not name.startswith("__") and name not in declared
    }


def test_the_project_facts_are_declared():
    assert {"sparkfleet_pair", "sparkfleet_left_out"} <= declared_project_names()


def test_every_fact_a_playbook_sets_is_declared():
    assert not undeclared_facts(playbook_files(), declared_project_names())


def test_the_check_finds_a_fact_planted_in_a_playbook(tmp_path):
    # A play that sets a fact nobody declared, nested in a block as real playbooks do.
    (tmp_path / "playbooks").mkdir()
    planted = [{"hosts": "all", "tasks": [{"block": [{"ansible.builtin.set_fact": {"sparkfleet_secret_plan": 1}}]}]}]
    (tmp_path / "playbooks" / "planted.yml").write_text(yaml.safe_dump(planted))
    found = undeclared_facts(playbook_files(tmp_path), declared_project_names())
    assert found == {("planted.yml", "sparkfleet_secret_plan")}


def test_every_declared_fact_is_set_by_a_playbook_or_shared_by_the_roles():
    set_by_playbooks = {name for path in playbook_files() for name in facts_set(yaml.safe_load(path.read_text()))}
    read_by_roles = {name for role in ROLES for path, text in texts_of(role) for name in PROJECT_NAME.findall(text)}
    assert declared_project_names() <= set_by_playbooks | read_by_roles


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_only_declared_project_names(role):
    # Task, variables and defaults files (templates name HAProxy sections sparkfleet_*, which are no variables).
    read = {
        (str(path.relative_to(ROOT)), name)
        for path, text in texts_of(role)
        if path.suffix == ".yml"
        for name in PROJECT_NAME.findall(text)
        if name not in declared_project_names()
    }
    assert not read, f"{role} reads project names that docs/stages.md does not declare: {sorted(read)}"
