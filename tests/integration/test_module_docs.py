"""Every module in library/ documents itself as ansible-core's modules do: `ansible-doc` renders its options,
examples and return values."""

import subprocess

import pytest
from helpers import ROOT, ansible_tool

MODULES = sorted(path.stem for path in (ROOT / "library").glob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_the_module(module):
    done = subprocess.run(
        [ansible_tool("ansible-doc"), "-M", "library", module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"MODULE {module}" in done.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")
    for section in ("OPTIONS", "EXAMPLES", "RETURN VALUES"):
        assert section in done.stdout, f"{module}: no {section}"
