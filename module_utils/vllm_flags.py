"""The `vllm serve` flag list: read from what `vllm serve --help=all` prints, and kept as one line per flag.

The help text is the authority: it is what the vLLM in an image accepts. tests/contracts/vllm/regenerate.py turns
a release's help into recipes/vllm-serve-flags.txt (the fast check in preflight, on the controller), and
library/vllm_image_flags.py reads the pinned image's own help on the Spark. Both go through parse_serve_help, so
the two lists cannot be read two ways.

A flag list line:  --NAME KIND [ALIAS ...] [off=--NEGATIVE] [choices=A,B,...]
  value     takes one value                   many      one or more values (nargs="+")
  json      a JSON value, or --NAME.key VALUE  optional  the value may be omitted (nargs="?")
  bool      no value; `off` names the form that turns it off (--no-NAME, or vLLM's --disable-X for --enable-X)
  switch    no value, no form that turns it off (store_true)
Standard library only: the regeneration script imports this file inside a scratch vLLM venv without Ansible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("value", "many", "json", "bool", "switch", "optional")

# argparse prints each option at two spaces of indent; wrapped help text and the epilog's examples sit deeper.
_OPTION_LINE = re.compile(r"^  (-\S.*)$")
# What vLLM's help says of every dict or config-dataclass flag (FlexibleArgumentParser's JSON handling).
_JSON_HINT = "Should either be a valid JSON string or JSON keys passed individually"
_MANY = re.compile(r"^(\S+) \[\1 \.\.\.\]$|^\[(\S+) \.\.\.\]$")
_OPTIONAL = re.compile(r"^\[\S+\]$")


@dataclass(frozen=True)
class FlagSpec:
    """One long flag of `vllm serve`: how it takes a value, its other names, its negative form, its choices."""

    kind: str = "value"
    aliases: tuple[str, ...] = ()
    off: str = ""
    choices: tuple[str, ...] = field(default=())


def _choices(metavar: str) -> tuple[str, ...]:
    """argparse prints choices as {a,b}; vLLM's custom metavar for some prints a Python list ['a', 'b']."""
    if metavar.startswith("{") and metavar.endswith("}"):
        return tuple(metavar[1:-1].split(","))
    if metavar.startswith("['") and metavar.endswith("']"):
        return tuple(item.strip().strip("'") for item in metavar[1:-1].split(","))
    return ()


def _entries(text: str) -> list[tuple[str, str]]:
    """(invocation, help text) of each option in argparse's help output, help lines joined with spaces."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if match:
            invocation, _, help_start = match.group(1).partition("  ")
            entries.append((invocation.strip(), [help_start.strip()]))
        elif entries and line.startswith("   "):
            entries[-1][1].append(line.strip())
        elif entries and line.strip() and not line.startswith(" "):
            entries.append(("", []))  # a section heading or the epilog ends the previous option's help
    return [(invocation, " ".join(part for part in lines if part)) for invocation, lines in entries if invocation]


def parse_serve_help(text: str) -> dict[str, FlagSpec]:
    """Flag name (without the leading dashes) -> FlagSpec, from `vllm serve --help=all` output.

    Raises ValueError when the text holds no option at all (not a help page), naming what it began with.
    """
    flags: dict[str, FlagSpec] = {}
    for invocation, help_text in _entries(text):
        parts = [part.split(" ", 1) for part in re.split(r", (?=-)", invocation)]
        longs = [(name, rest[0] if rest else "") for name, *rest in parts if name.startswith("--")]
        shorts = tuple(name for name, *_ in parts if not name.startswith("--"))
        if not longs or longs[0][0] == "--help":
            continue
        name, metavar = longs[0]
        others = [other for other, _ in longs[1:]]
        if metavar == "":
            kind, off = ("bool", others[0]) if others else ("switch", "")
            aliases = shorts
        else:
            off = ""
            aliases = shorts + tuple(others)
            if _MANY.match(metavar):
                kind = "many"
            elif _OPTIONAL.match(metavar):
                kind = "optional"
            elif _JSON_HINT in help_text:
                kind = "json"
            else:
                kind = "value"
        flags[name[2:]] = FlagSpec(kind=kind, aliases=aliases, off=off, choices=_choices(metavar.split(" [")[0]))
    if not flags:
        raise ValueError(f"no `vllm serve` options found in a help text starting {text[:80]!r}")
    return flags


def render_flag_list(flags: dict[str, FlagSpec]) -> str:
    """The flag list lines (sorted by name), in the format parse_flag_list reads."""
    lines = []
    for name in sorted(flags):
        spec = flags[name]
        words = [f"--{name}", spec.kind, *spec.aliases]
        if spec.off:
            words.append(f"off={spec.off}")
        if spec.choices:
            words.append("choices=" + ",".join(spec.choices))
        lines.append(" ".join(words))
    return "\n".join(lines) + "\n"


def parse_flag_list(text: str, source: str = "flag list") -> dict[str, FlagSpec]:
    """Flag name (no dashes) -> FlagSpec from flag list lines; `#` starts a comment. ValueError names the line."""
    flags: dict[str, FlagSpec] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        kind = words[1] if len(words) > 1 else "value"
        if not words[0].startswith("--") or kind not in KINDS:
            raise ValueError(f"{source}:{number}: expected '--FLAG KIND ...' with KIND one of {', '.join(KINDS)}")
        aliases = tuple(word for word in words[2:] if word.startswith("-"))
        options = dict(word.split("=", 1) for word in words[2:] if "=" in word and not word.startswith("-"))
        choices = tuple(options["choices"].split(",")) if options.get("choices") else ()
        flags[words[0][2:]] = FlagSpec(kind=kind, aliases=aliases, off=options.get("off", ""), choices=choices)
    return flags


def load_flag_list(path: str | Path) -> dict[str, FlagSpec]:
    """parse_flag_list of a file."""
    return parse_flag_list(Path(path).read_text(encoding="utf-8"), str(path))
