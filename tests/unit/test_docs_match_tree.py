"""The pages that describe the tree match it, as docs/variables.md matches the argument specs
(test_variable_reference.py): docs/modules.md documents every module in library/ and no other, and docs/layout.md
names every root playbook, every top-level folder and every file or folder of library/ and module_utils/, and
names nothing that does not exist.

docs/layout.md is one code block of entries: a path at the start of a line (a file or folder of the root, or a
folder below it such as inventories/local/), its description on the same and the indented lines below. A name in
a description is looked up under its entry's folder (anywhere below it, so tests/'s `run-all.sh` or molecule/'s
`molecule.yml` count), then from the root; an indented line that starts with a file name (library/'s and
module_utils/'s lists) names a file of the entry's folder itself."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

LAYOUT = ROOT / "docs" / "layout.md"
MODULES = ROOT / "docs" / "modules.md"
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A file name with one of the repository's extensions, or a folder name ending in /; globs (*) allowed.
EXTENSIONS = "yml|yaml|py|sh|md|txt|cfg|json|j2|toml"
NAME = re.compile(rf"(?<![\w./*-])((?:[\w.*-]+/)*[\w*-][\w.*-]*\.(?:{EXTENSIONS})|(?:[\w.*-]+/)+)(?![\w/-])")
ENTRY = re.compile(r"^(\S+)")
LISTED_FILE = re.compile(rf"^ {{2}}([\w.-]+\.(?:{EXTENSIONS}))\s")
MODULE_BULLET = re.compile(r"^- `([a-z0-9_]+)`:", re.MULTILINE)
SKIPPED_FOLDERS = {"__pycache__"}


@functools.cache
def ignored_top_level() -> set[str]:
    """Top-level names .gitignore leaves out (a venv, caches, results): not part of the repository's layout."""
    names = set()
    for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "*" not in line:
            names.add(line.strip("/"))
    return names


def layout_block() -> list[str]:
    blocks = FENCED.findall(LAYOUT.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"{LAYOUT}: expected one code block of entries, found {len(blocks)}"
    return blocks[0].splitlines()


def in_repository(path: Path) -> bool:
    """Whether PATH is the repository's own: not in a cache folder, nor below .git or an ignored top-level folder
    (.venv, .cache: what a test run leaves there must not make a name in the docs exist)."""
    parts = path.relative_to(ROOT).parts
    top = parts[0] if parts else ""
    return not (set(parts) & SKIPPED_FOLDERS) and top not in ignored_top_level() | {".git"}


def found(pattern: str, base: Path) -> list[Path]:
    """What NAME (maybe a glob, maybe with a trailing /) is under BASE: the path itself, else anywhere below."""
    pattern = pattern.rstrip("/")
    if not base.is_dir():
        return []
    direct = [path for path in base.glob(pattern) if in_repository(path)]
    if direct or "/" in pattern:
        return direct
    return [path for path in base.rglob(pattern) if in_repository(path)]


@functools.cache
def layout_names() -> tuple[dict[Path, str], list[str]]:
    """(every path named in docs/layout.md -> the line that names it, the names that lead nowhere)."""
    named: dict[Path, str] = {}
    missing: list[str] = []
    folder = ROOT
    for line in layout_block():
        if not line.strip():
            continue
        if not line.startswith(" "):
            entry = ENTRY.match(line).group(1)
            paths = found(entry, ROOT) if "/" not in entry.rstrip("/") else list(ROOT.glob(entry.rstrip("/")))
            if not paths:
                missing.append(f"{entry} (an entry)")
            for path in paths:
                named[path] = line
                # inventories/local/ names inventories/ as well
                named.setdefault(ROOT / path.relative_to(ROOT).parts[0], line)
            folder = ROOT / entry.rstrip("/") if entry.endswith("/") else ROOT
            description = line[len(entry) :]
        else:
            listed = LISTED_FILE.match(line)
            if listed:
                target = folder / listed.group(1)
                if target.exists():
                    named[target] = line
                else:
                    missing.append(f"{target.relative_to(ROOT)} (listed under {folder.relative_to(ROOT)}/)")
                description = line[listed.end() :]
            else:
                description = line
        for name in NAME.findall(description):
            paths = found(name, folder) or found(name, ROOT)
            if not paths:
                where = f"under {folder.relative_to(ROOT)}/ or " if folder != ROOT else ""
                missing.append(f"{name} (not {where}at the root)")
            for path in paths:
                named.setdefault(path, line)
    return named, missing


def is_playbook(path: Path) -> bool:
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    return (
        isinstance(entries, list)
        and bool(entries)
        and all(isinstance(e, dict) and ("hosts" in e or "ansible.builtin.import_playbook" in e) for e in entries)
    )


ROOT_PLAYBOOKS = sorted(path for path in ROOT.glob("*.yml") if is_playbook(path))
TOP_FOLDERS = sorted(
    path
    for path in ROOT.iterdir()
    if path.is_dir() and not path.name.startswith(".") and path.name not in ignored_top_level() | SKIPPED_FOLDERS
)
CODE = sorted(
    path
    for folder in ("library", "module_utils")
    for path in (ROOT / folder).iterdir()
    if path.name not in SKIPPED_FOLDERS and not path.name.endswith(".pyc")
)
LIBRARY_MODULES = sorted(path.stem for path in (ROOT / "library").glob("*.py"))


def test_the_layout_check_reads_the_page():
    named, _ = layout_names()
    assert ROOT / "site.yml" in named
    assert ROOT / "library" / "spark_gpu_info.py" in named
    assert ROOT / "module_utils" / "recipe_rules.py" in named
    assert ROOT / "bench" / "converge-time.sh" in named


def test_the_layout_names_nothing_that_does_not_exist():
    _, missing = layout_names()
    assert not missing, f"{LAYOUT.relative_to(ROOT)} names what is not in the tree:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", ROOT_PLAYBOOKS + TOP_FOLDERS, ids=lambda path: path.name)
def test_the_layout_names_each_root_playbook_and_folder(path):
    named, _ = layout_names()
    assert path in named, f"{LAYOUT.relative_to(ROOT)} does not name {path.name} (a line that starts with it)"
    assert named[path].startswith(path.name), f"{path.name} is named only in passing: give it a line of its own"


@pytest.mark.parametrize("path", CODE, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_layout_names_each_file_of_library_and_module_utils(path):
    named, _ = layout_names()
    assert path in named, (
        f"{LAYOUT.relative_to(ROOT)} does not name {path.relative_to(ROOT)}: add a line `  {path.name}  what it is` "
        f"under {path.parent.name}/"
    )


def documented_modules() -> list[str]:
    return MODULE_BULLET.findall(MODULES.read_text(encoding="utf-8"))


def test_the_module_check_reads_the_page():
    assert "spark_gpu_info" in documented_modules()


@pytest.mark.parametrize("module", LIBRARY_MODULES)
def test_every_module_is_documented(module):
    assert module in documented_modules(), (
        f"library/{module}.py is not in {MODULES.relative_to(ROOT)}: add a bullet - `{module}`: what it does"
    )


def test_the_module_page_documents_only_modules_that_exist():
    listed = documented_modules()
    assert not set(listed) - set(LIBRARY_MODULES), f"not in library/: {sorted(set(listed) - set(LIBRARY_MODULES))}"
    assert len(listed) == len(set(listed)), f"documented twice: {sorted({m for m in listed if listed.count(m) > 1})}"
