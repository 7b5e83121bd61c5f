"""Every role's defaults and meta/argument_specs.yml describe the same variables with the same defaults."""

from pathlib import Path

import pytest
import yaml
from helpers import ROOT

ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "tasks" / "main.yml").exists())


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_the_argument_spec(role):
    defaults = load(ROOT / "roles" / role / "defaults" / "main.yml")
    options = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    for name, spec in options.items():
        assert spec.get("default") == defaults[name], f"{role}: default of {name} differs"
        assert spec.get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_every_variable_is_prefixed_and_commented(role):
    text = (ROOT / "roles" / role / "defaults" / "main.yml").read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(text):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            assert line.startswith(f"{role}_"), f"{role}/defaults/main.yml:{number + 1}: {line!r} lacks the prefix"
            assert text[number - 1].startswith("#"), f"{role}/defaults/main.yml:{number + 1}: no comment above"


def test_there_is_at_least_one_role():
    assert "spark_preflight" in ROLES
