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
