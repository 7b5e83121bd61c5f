"""Parse `vllm serve` arguments the way real vLLM does, against the real flag list.

Real vLLM uses `FlexibleArgumentParser` (an argparse subclass, vllm/utils/argparse_utils.py). What matters to a
test bench is which command lines it accepts and which it refuses, so this module reproduces exactly that:

* the flag set comes from recipes/vllm-serve-flags.txt (generated from the real release's help by
  tests/contracts/vllm/regenerate.py), never from here;
* ``--flag_name`` equals ``--flag-name``, ``--flag=value`` works, ``-O3`` means ``--optimization-level 3``;
* boolean flags are turned off by their listed negative form (``--no-X``, or ``--disable-X`` for vLLM's
  ``--enable-X``, with ``--no-enable-X`` still accepted as vLLM's hidden alias), only where vLLM registers them
  with ``BooleanOptionalAction``;
* a value outside a flag's choices ends like argparse: ``argument --kv-cache-dtype: invalid choice: ...``;
* anything else ends like argparse ends: usage plus ``error: unrecognized arguments: ...`` on stderr, exit 2.

``--help=all`` prints the real release's recorded help (tests/contracts/vllm/serve-help-all.txt) where it is
found. Value validation beyond choices is left to what the stand-in itself needs (config.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

FLAGS_FILE_NAME = "vllm-serve-flags.txt"
HELP_FILE_NAME = "serve-help-all.txt"  # tests/contracts/vllm/: the release's recorded `vllm serve --help=all`
FLAGS_FILE_ENV = "VLLM_STANDIN_FLAGS_FILE"

# Kinds used in the flag file; see its header for what each one means.
KINDS = frozenset({"value", "many", "json", "bool", "switch", "optional"})
NO_VALUE_KINDS = frozenset({"bool", "switch"})

USAGE = "usage: vllm serve [model_tag] [options]"


class UsageError(Exception):
    """A command line real vLLM would refuse; argparse reports these with exit status 2."""


class HelpRequested(Exception):
    """``-h``/``--help``/``--help=TOPIC``: print help and exit 0, like argparse."""

    def __init__(self, topic: str | None) -> None:
        super().__init__(topic or "")
        self.topic = topic


@dataclass(frozen=True)
class FlagSpec:
    """One `vllm serve` flag: its canonical long name, how it takes values, and its short aliases."""

    name: str
    kind: str
    aliases: tuple[str, ...] = ()
    off: str = ""  # the negative form of a bool flag (--no-X, or --disable-X)
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The argparse destination (``--max-model-len`` -> ``max_model_len``)."""
        return self.name[2:].replace("-", "_")


@dataclass
class FlagTable:
    """All flags of one vLLM version, indexed by every option string that selects them."""

    source: Path
    specs: dict[str, FlagSpec] = field(default_factory=dict)
    # option string -> (spec, negated); "--no-enable-prefix-caching" maps to (enable-prefix-caching, True)
    options: dict[str, tuple[FlagSpec, bool]] = field(default_factory=dict)

    def add(self, spec: FlagSpec) -> None:
        if spec.name in self.specs:
            raise ValueError(f"{self.source}: flag {spec.name} is listed twice")
        self.specs[spec.name] = spec
        self.options[spec.name] = (spec, False)
        for alias in spec.aliases:
            self.options[alias] = (spec, False)
        if spec.kind == "bool":
            # vLLM's EnableDisableAction keeps --no-enable-X as a hidden alias of --disable-X.
            for negative in {spec.off or "--no-" + spec.name[2:], "--no-" + spec.name[2:]}:
                self.options[negative] = (spec, True)


@dataclass
class ParsedArgs:
    """The result of parsing: the positional model tag and the values of the flags that were given."""

    model_tag: str | None
    # dest -> str | list[str] | bool | dict (json flags given as --flag.key value) | True (optional without value)
    values: dict[str, object]
    given: list[str]  # canonical names of the flags given, in order (for the "non-default args" log line)


def default_flags_file() -> Path:
    """Where the flag list lives: $VLLM_STANDIN_FLAGS_FILE, else beside the stand-in, else the repo's recipes/.

    The install directory is the one holding the ``vllm`` script and the ``vllm_standin`` package, so an image
    can ship the list next to them; in the repository the list sits in recipes/ (three levels up).
    """
    env = os.environ.get(FLAGS_FILE_ENV)
    if env:
        return Path(env)
    install_dir = Path(__file__).resolve().parent.parent
    candidates = [install_dir / FLAGS_FILE_NAME, install_dir.parent.parent.parent / "recipes" / FLAGS_FILE_NAME]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"flag list {FLAGS_FILE_NAME} not found; looked at {', '.join(str(c) for c in candidates)}; "
        f"set {FLAGS_FILE_ENV} to its path"
    )


def load_flag_table(path: Path) -> FlagTable:
    """Read the flag file (``--NAME KIND [ALIAS ...] [off=--NEG] [choices=A,B]`` lines, ``#`` comments)."""
    table = FlagTable(source=path)
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        name, kind = parts[0], parts[1] if len(parts) > 1 else "value"
        if not name.startswith("--") or kind not in KINDS:
            raise ValueError(f"{path}:{number}: expected '--NAME KIND ...' with KIND in {sorted(KINDS)}: {raw!r}")
        options = dict(part.split("=", 1) for part in parts[2:] if "=" in part and not part.startswith("-"))
        table.add(
            FlagSpec(
                name=name,
                kind=kind,
                aliases=tuple(part for part in parts[2:] if part.startswith("-")),
                off=options.get("off", ""),
                choices=tuple(options["choices"].split(",")) if options.get("choices") else (),
            )
        )
    return table


def normalize_argv(argv: list[str]) -> list[str]:
    """Apply FlexibleArgumentParser's rewriting before parsing.

    Underscores in a long flag's name become dashes (only before the first ".", which starts a JSON key), and
    the ``-O`` shorthand becomes ``--optimization-level``: ``-O3``, ``-O=3`` and ``-O 3``.
    """
    out: list[str] = []
    for index, arg in enumerate(argv):
        if arg.startswith("--help="):
            out.append(arg)
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, rest = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + rest + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and index + 1 < len(argv) and argv[index + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _looks_like_option(arg: str) -> bool:
    """argparse treats '-x...' as an option string unless it is a negative number."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def parse_serve_args(argv: list[str], table: FlagTable) -> ParsedArgs:
    """Parse the arguments after ``vllm serve``; raise UsageError for what vLLM would refuse."""
    args = normalize_argv(argv)
    values: dict[str, object] = {}
    given: list[str] = []
    positionals: list[str] = []
    unknown: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            positionals += args[index:]
            break
        if arg in ("-h", "--help"):
            raise HelpRequested(None)
        if arg.startswith("--help="):
            raise HelpRequested(arg.split("=", 1)[1])
        if not _looks_like_option(arg):
            positionals.append(arg)
            continue

        option, eq, inline = arg.partition("=")
        inline_value = inline if eq else None
        option, dot, json_key = option.partition(".")
        found = table.options.get(option)
        if found is None:
            # argparse collects unknown options (not their would-be values) and reports them all at the end.
            unknown.append(arg)
            continue
        spec, negated = found
        shown = option if not dot else f"{option}.{json_key}"
        if dot and spec.kind != "json":
            unknown.append(arg)
            continue

        if spec.kind in NO_VALUE_KINDS:
            if inline_value is not None:
                raise UsageError(f"argument {_display(spec)}: ignored explicit argument '{inline_value}'")
            values[spec.dest] = not negated
        elif spec.kind == "optional":
            if inline_value is not None:
                values[spec.dest] = inline_value
            elif index < len(args) and not _looks_like_option(args[index]):
                values[spec.dest] = args[index]
                index += 1
            else:
                values[spec.dest] = True
        elif spec.kind == "many":
            if inline_value is not None:
                values[spec.dest] = [inline_value]
            else:
                taken: list[str] = []
                while index < len(args) and not _looks_like_option(args[index]) and args[index] != "--":
                    taken.append(args[index])
                    index += 1
                if not taken:
                    raise UsageError(f"argument {_display(spec)}: expected at least one argument")
                values[spec.dest] = taken
        else:  # value, json
            if inline_value is None:
                if index >= len(args) or _looks_like_option(args[index]):
                    raise UsageError(f"argument {_display(spec)}: expected one argument")
                inline_value = args[index]
                index += 1
            if spec.choices and not dot and inline_value not in spec.choices:
                choices = ", ".join(f"'{choice}'" for choice in spec.choices)
                raise UsageError(f"argument {_display(spec)}: invalid choice: '{inline_value}' (choose from {choices})")
            if dot:
                # --speculative-config.method mtp  ->  {"method": "mtp"} merged into the flag's JSON value
                nested = values.get(spec.dest)
                nested = nested if isinstance(nested, dict) else {}
                _set_dotted(nested, json_key, inline_value)
                values[spec.dest] = nested
            else:
                values[spec.dest] = inline_value
        given.append(shown if dot else spec.name)

    model_tag = positionals[0] if positionals else None
    unknown += positionals[1:]
    if unknown:
        raise UsageError("unrecognized arguments: " + " ".join(unknown))
    return ParsedArgs(model_tag=model_tag, values=values, given=given)


def _display(spec: FlagSpec) -> str:
    """How argparse names an argument in errors: its option strings joined by '/'."""
    names = [spec.name, *spec.aliases]
    if spec.kind == "bool":
        names.insert(1, spec.off or "--no-" + spec.name[2:])
    return "/".join(names)


def _set_dotted(target: dict[str, object], dotted_key: str, value: str) -> None:
    """Set ``a.b.c`` in a nested dict; a trailing ``+`` appends (vLLM's ``--json-arg.key+ value`` form)."""
    append = dotted_key.endswith("+")
    keys = dotted_key.rstrip("+").split(".")
    node = target
    for key in keys[:-1]:
        child = node.get(key)
        node[key] = child = child if isinstance(child, dict) else {}
        node = child
    if append:
        existing = node.get(keys[-1])
        items = existing if isinstance(existing, list) else []
        node[keys[-1]] = items + value.split(",")
    else:
        node[keys[-1]] = value


def recorded_help(table: FlagTable) -> str | None:
    """The real release's `vllm serve --help=all`, recorded beside the flag list (without its header), if any."""
    candidates = [table.source.with_name(HELP_FILE_NAME)]
    candidates.append(Path(__file__).resolve().parents[3] / "contracts" / "vllm" / HELP_FILE_NAME)
    for candidate in candidates:
        if candidate.is_file():
            lines = candidate.read_text(encoding="utf-8").splitlines(keepends=True)
            return "".join(line for line in lines if not line.startswith("# "))
    return None


def help_text(table: FlagTable, topic: str | None) -> str:
    """``--help=all``: the recorded real help where there is one; else a short listing of the matching flags."""
    if topic == "all":
        recorded = recorded_help(table)
        if recorded is not None:
            return recorded
    lines = [USAGE, "", "Stand-in vLLM: accepts the flags of real `vllm serve` (list: " + str(table.source) + ")."]
    needle = (topic or "").lower().replace("_", "-").lstrip("-")
    for spec in table.specs.values():
        if needle and needle != "all" and needle not in spec.name:
            continue
        names = [spec.name, *spec.aliases]
        if spec.kind == "bool":
            names.insert(1, spec.off or "--no-" + spec.name[2:])
        lines.append(f"  {', '.join(names)}  ({spec.kind})")
    return "\n".join(lines) + "\n"
