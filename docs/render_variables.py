#!/usr/bin/env python3
"""Write docs/variables.md, the reference of every role's variables, from roles/*/meta/argument_specs.yml.

    python3 docs/render_variables.py           write docs/variables.md
    python3 docs/render_variables.py --check   exit 1 when docs/variables.md differs from what would be written

The argument specs are the single source: Ansible checks every run's variables against them (a wrong type or
value stops the run before any host is changed), and tests/unit/test_argument_specs.py holds them equal to each
role's defaults/main.yml. This file only lays them out: one section per role (sorted by name), one subsection per
entry point (main first, then the others in file order), one table row per option in file order, suboptions as
rows of their own (`parent[].child` for a list of dicts, `parent.child` for a dict). Paths are resolved from this
file, so it runs from any folder. Needs Python 3 and PyYAML."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
OUTPUT = DOCS / "variables.md"
SITE_VARIABLES = DOCS / "site_variables.yml"
COMMAND = "python3 docs/render_variables.py"

# Ansible's documentation markup (C(), O(), V(), M(), ...), rendered as markdown.
MARKUP = re.compile(r"\b([BCEIMOPUV])\(([^()]*)\)|\bL\(([^(),]*),\s*([^()]*)\)")
CODE_MARKUP = {"C", "E", "M", "O", "P", "V"}


def code_span(text: str, in_table: bool) -> str:
    """TEXT as an inline code span, fenced by more backticks than it holds; `|` escaped inside a table."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ") and text.strip()):
        text = f" {text} "
    if in_table:
        text = text.replace("|", "\\|")
    return f"{fence}{text}{fence}"


def prose(text: str, in_table: bool) -> str:
    """Plain text made safe for markdown: `<` would open an HTML tag; `|` ends a table cell."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    if in_table:
        text = text.replace("|", "\\|")
    return text


def render_text(text: str, in_table: bool) -> str:
    """One paragraph of an argument spec's description: whitespace collapsed, Ansible markup as markdown."""
    text = " ".join(str(text).split())
    out: list[str] = []
    position = 0
    for match in MARKUP.finditer(text):
        out.append(prose(text[position : match.start()], in_table))
        kind, content, link_text, link_url = match.groups()
        if link_text is not None:
            out.append(f"[{prose(link_text, in_table)}]({link_url.strip()})")
        elif kind in CODE_MARKUP:
            out.append(code_span(content, in_table))
        elif kind == "I":
            out.append(f"*{prose(content, in_table)}*")
        elif kind == "B":
            out.append(f"**{prose(content, in_table)}**")
        else:  # U(url)
            out.append(f"<{content}>")
        position = match.end()
    out.append(prose(text[position:], in_table))
    return "".join(out)


def paragraphs(description: Any) -> list[str]:
    """A description as its paragraphs: Ansible accepts one string or a list of strings."""
    if description is None:
        return []
    if isinstance(description, list):
        return [str(item) for item in description if str(item).strip()]
    return [str(description)] if str(description).strip() else []


def render_default(value: Any) -> str:
    """A default as inline JSON (YAML's flow style for these values), one line, escaped for a table cell."""
    return code_span(json.dumps(value, ensure_ascii=False, default=str), in_table=True)


def type_of(spec: dict) -> str:
    kind = str(spec.get("type", "str"))
    if kind == "list" and spec.get("elements"):
        return f"list of {spec['elements']}"
    return kind


def rows(options: dict, prefix: str = "") -> list[dict]:
    """One row per option, then its suboptions right below it, in file order."""
    result = []
    for name, spec in (options or {}).items():
        spec = spec or {}
        path = f"{prefix}{name}"
        result.append({"path": path, "spec": spec})
        if spec.get("options"):
            nested = f"{path}[]." if spec.get("type") == "list" else f"{path}."
            result.extend(rows(spec["options"], nested))
    return result


def cell_description(spec: dict) -> str:
    parts = [render_text(paragraph, in_table=True) for paragraph in paragraphs(spec.get("description"))]
    if spec.get("aliases"):
        parts.append("Aliases: " + ", ".join(code_span(str(alias), True) for alias in spec["aliases"]) + ".")
    if spec.get("no_log"):
        parts.append("*(no_log: never shown in output)*")
    return " ".join(parts)


def render_table(options: dict) -> list[str]:
    table = rows(options)
    with_choices = any("choices" in row["spec"] for row in table)
    header = ["variable", "type", "required", "default", "description"] + (["choices"] if with_choices else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table:
        spec = row["spec"]
        cells = [
            code_span(row["path"], True),
            prose(type_of(spec), True),
            "yes" if spec.get("required") else "no",
            render_default(spec["default"]) if "default" in spec else "",
            cell_description(spec),
        ]
        if with_choices:
            cells.append(", ".join(render_default(choice) for choice in spec.get("choices") or []))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


CONSTRAINTS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


def render_entry_point(role: str, name: str, entry: dict, main_options: dict | None = None) -> list[str]:
    """One entry point: its descriptions, then its table, or a pointer to main's when it takes the same variables
    (the `validate` entry points share main's options through a YAML anchor)."""
    entry = entry or {}
    lines = [f"### {role}: {name}", ""]
    if entry.get("short_description"):
        lines += [f"**{render_text(entry['short_description'], in_table=False)}**", ""]
    for paragraph in paragraphs(entry.get("description")):
        lines += [render_text(paragraph, in_table=False), ""]
    options = entry.get("options") or {}
    if options and name != "main" and options == main_options:
        lines += [f"Takes the same variables as [`{role}`: main](#{role}-main).", ""]
    elif options:
        lines += [*render_table(options), ""]
    else:
        lines += ["This entry point takes no variables.", ""]
    for constraint in CONSTRAINTS:
        if entry.get(constraint):
            value = json.dumps(entry[constraint], ensure_ascii=False)
            lines += [f"{constraint.replace('_', ' ').capitalize()}: {code_span(value, False)}", ""]
    return lines


def load_specs(root: Path = ROOT) -> dict[str, dict]:
    """Each role's argument_specs mapping, by role name, sorted."""
    specs = {}
    for path in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        specs[path.parent.parent.name] = data.get("argument_specs") or {}
    return dict(sorted(specs.items()))


def render(root: Path = ROOT) -> str:
    specs = load_specs(root)
    lines = [
        "# Role variables",
        "",
        f"<!-- Generated by `{COMMAND}` from roles/*/meta/argument_specs.yml. Do not edit by hand. -->",
        "",
        f"Generated by `{COMMAND}` from each role's `meta/argument_specs.yml`; do not edit this file by hand:",
        f"change the argument spec (and the role's `defaults/main.yml`), then run `{COMMAND}`.",
        "`tests/unit/test_variable_reference.py` fails when this file is out of date.",
        "",
        "Ansible checks every run's variables against these specs: a wrong type or value stops the run before any",
        "host is changed, with a message that names the variable. Put overrides in `group_vars/` or `host_vars/` of",
        "your inventory. A default in `{{ }}` is a Jinja expression evaluated on the controller.",
        "",
    ]
    lines += [f"- [{role}](#{role}): {render_text(short_description(spec), False)}" for role, spec in specs.items()]
    lines += ["- [Site-wide variables](#site-wide-variables): set once, the default of several roles' own", ""]
    site = yaml.safe_load((root / "docs" / SITE_VARIABLES.name).read_text(encoding="utf-8")) or {}
    lines += ["## Site-wide variables", "", f"Source: [docs/{SITE_VARIABLES.name}]({SITE_VARIABLES.name}).", ""]
    lines += [*render_table(site), ""]
    for role, entry_points in specs.items():
        source = f"roles/{role}/meta/argument_specs.yml"
        lines += [f"## {role}", "", f"Source: [{source}](../{source}).", ""]
        names = sorted(entry_points, key=lambda name: (name != "main", list(entry_points).index(name)))
        main_options = (entry_points.get("main") or {}).get("options")
        for name in names:
            lines += render_entry_point(role, name, entry_points[name], main_options)
    return "\n".join(lines).rstrip("\n") + "\n"


def short_description(entry_points: dict) -> str:
    main = entry_points.get("main") or next(iter(entry_points.values()), None) or {}
    return str(main.get("short_description", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/variables.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else None
        if current != text:
            print(f"docs/variables.md is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
