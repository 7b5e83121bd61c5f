"""The documentation: docs/variables.md is what docs/render_variables.py writes from every role's argument specs,
it names every option, and every relative link in README.md and docs/*.md leads to a file (and heading) that
exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

RENDER = ROOT / "docs" / "render_variables.py"
REFERENCE = ROOT / "docs" / "variables.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SPECS = sorted((ROOT / "roles").glob("*/meta/argument_specs.yml"))

FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def option_paths(options: dict, prefix: str = "") -> list[tuple[str, str]]:
    """(parent path, option name) of every option and suboption, in file order."""
    found = []
    for name, spec in (options or {}).items():
        found.append((prefix, name))
        if (spec or {}).get("options"):
            found.extend(option_paths(spec["options"], f"{prefix}{name}"))
    return found


def links(page: Path) -> list[str]:
    """Every link target of a markdown page, leaving out code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but - and _ dropped, spaces as -."""
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCED.sub("", page.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_the_reference_is_current():
    result = subprocess.run(
        [sys.executable, str(RENDER), "--check"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_the_check_names_the_fix_when_the_reference_is_stale(tmp_path, monkeypatch, capsys):
    """--check fails on a reference that differs, with the command that fixes it, and leaves the file alone."""
    sys.path.insert(0, str(RENDER.parent))
    try:
        import render_variables
    finally:
        sys.path.remove(str(RENDER.parent))
    stale = tmp_path / "variables.md"
    stale.write_text(REFERENCE.read_text(encoding="utf-8").replace("| yes |", "| no |", 1) + "edited\n", "utf-8")
    before = stale.read_text(encoding="utf-8")
    monkeypatch.setattr(render_variables, "OUTPUT", stale)
    assert render_variables.main(["--check"]) == 1
    assert "docs/variables.md is out of date: run python3 docs/render_variables.py" in capsys.readouterr().err
    assert stale.read_text(encoding="utf-8") == before
    monkeypatch.setattr(render_variables, "OUTPUT", tmp_path / "missing.md")
    assert render_variables.main(["--check"]) == 1


def test_there_are_argument_specs():
    assert any(path.parts[-3] == "spark_preflight" for path in SPECS)


@pytest.mark.parametrize("spec_file", SPECS, ids=lambda path: path.parts[-3])
def test_every_option_is_in_the_reference(spec_file):
    reference = REFERENCE.read_text(encoding="utf-8")
    rows = [line for line in reference.splitlines() if line.startswith("| `")]
    entry_points = (yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}).get("argument_specs") or {}
    assert entry_points, f"{spec_file}: no argument_specs"
    role = spec_file.parts[-3]
    for entry_point, spec in entry_points.items():
        assert f"### {role}: {entry_point}" in reference, f"{role}: entry point {entry_point} is not in {REFERENCE}"
        for parent, name in option_paths((spec or {}).get("options") or {}):
            missing = f"{role}/{entry_point}: option {parent + '.' if parent else ''}{name} is not in {REFERENCE}"
            if not parent:
                assert any(row.startswith(f"| `{name}` |") for row in rows), missing
            else:
                assert any(row.startswith(f"| `{parent}") and f"{name}` |" in row for row in rows), missing


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in links(page):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file {destination}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with anchor #{anchor} in {destination.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_link_check_sees_links():
    assert any("docs/variables.md" in target for target in links(ROOT / "README.md"))
