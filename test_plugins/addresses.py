"""Jinja tests about addresses for the roles' templates and conditions: `ADDRESS is loopback`, `ADDRESS is
wildcard`.

The rule is module_utils/input_rules.py's is_loopback_host, the one definition the modules use too; it is loaded
from that file, since a controller plugin cannot import the project's module_utils as a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_input_rules", Path(__file__).resolve().parents[1] / "module_utils" / "input_rules.py"
)
input_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(input_rules)


def loopback(address: object) -> bool:
    """Whether only the host itself reaches ADDRESS: 127.0.0.0/8, ::1 however written, localhost."""
    return isinstance(address, str) and input_rules.is_loopback_host(address)


def wildcard(address: object) -> bool:
    """Whether a bind to ADDRESS listens on every address of the host (0.0.0.0, ::)."""
    return isinstance(address, str) and input_rules.is_wildcard(address)


class TestModule:
    def tests(self) -> dict:
        return {"loopback": loopback, "wildcard": wildcard}
