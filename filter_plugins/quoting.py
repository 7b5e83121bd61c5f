"""Quoting helpers for the templates: one per file format a value can land in. Preflight has already refused a
value that is not what it may be (module_utils/input_rules.py); these are the second line, so a template never
writes a value raw:

- systemd_word: one word of a unit's command line (ExecStart=...), double-quoted with systemd's escapes.
- env_file_value: the value of a KEY=value line of a file that a shell sources (`set -a; . FILE`), single-quoted.
- rsyncd_value: a value of rsyncd.conf, which has no quoting at all: only a value without a line break can be
  written, so anything else fails the template.
- Shell lines printed for people use ansible.builtin.quote; YAML and JSON files use to_json (JSON is YAML).

Every helper fails on a control character: a newline is never a value, in any of these formats.
"""

from __future__ import annotations

import re
import shlex

from ansible.errors import AnsibleFilterError

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # as module_utils/input_rules.py: C0, DEL and C1


def _one_line(value: object, helper: str) -> str:
    text = str(value)
    if CONTROL.search(text):
        raise AnsibleFilterError(f"{helper}: refusing to write {text!r}, which contains a control character")
    return text


def systemd_word(value: object) -> str:
    """systemd.syntax(7): a double-quoted word, with \\ and " escaped; % (specifiers) and $ (variables) doubled."""
    text = _one_line(value, "systemd_word")
    for raw, escaped in (("\\", "\\\\"), ('"', '\\"'), ("%", "%%"), ("$", "$$")):
        text = text.replace(raw, escaped)
    return f'"{text}"'


def env_file_value(value: object) -> str:
    """A POSIX shell word in single quotes (shlex.quote), for a KEY=value line read with `set -a; . FILE`."""
    return shlex.quote(_one_line(value, "env_file_value"))


def rsyncd_value(value: object) -> str:
    """rsyncd.conf(5) takes a value up to the line's end, without quotes: a line break would start a new module."""
    text = _one_line(value, "rsyncd_value")
    if text != text.strip():
        raise AnsibleFilterError(f"rsyncd_value: refusing {text!r}: rsyncd strips the spaces around a value")
    return text


class FilterModule:
    def filters(self) -> dict:
        return {"systemd_word": systemd_word, "env_file_value": env_file_value, "rsyncd_value": rsyncd_value}
