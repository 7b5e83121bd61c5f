"""The vllm_server role's unit as its template writes it (tests/integration/playbooks/render-vllm-unit.yml): every
value a single word of the command line, whatever it holds, a line break refused, and no secret in it.

Preflight refuses these values first (test_bad_input.py); this is the second line, the template's own quoting
(filter_plugins/quoting.py's systemd_word), tested without preflight."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, ansible_tool

PLAYBOOK = ROOT / "tests" / "integration" / "playbooks" / "render-vllm-unit.yml"
KEY = "sk-render-test-3e9a"
PINNED = "vllm/vllm-openai@sha256:" + "a" * 64


def render(tmp_path: Path, image: str) -> tuple[subprocess.CompletedProcess, Path]:
    dest = tmp_path / "vllm-qwen3-0.6b.service"
    extra = {"render_dest": str(dest), "render_image": image, "render_key": KEY}
    argv = [ansible_tool("ansible-playbook"), str(PLAYBOOK), "-e", json.dumps(extra)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done, dest


def exec_start(unit: Path) -> list[str]:
    """ExecStart's words as systemd reads them: continuation lines joined, double-quoted words unescaped ($$ is $,
    %% is %: systemd's own escapes, which shlex does not know)."""
    text = unit.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(line.split("=", 1)[1])]


def test_the_unit_runs_vllm_serve_through_the_secrets_reading_shell(tmp_path):
    done, unit = render(tmp_path, PINNED)
    assert done.returncode == 0, done.stdout[-3000:]
    words = exec_start(unit)
    image = words.index(PINNED)
    assert words[image - 2 : image] == ["--entrypoint", "/bin/sh"]
    assert words[image + 1 : image + 5] == [
        "-c",
        "set -a && . /run/sparkfleet/secrets.env && set +a && "
        'export PYTHONPATH="/opt/sparkfleet/python${PYTHONPATH:+:$PYTHONPATH}" && exec vllm serve "$@"',
        "vllm",
        "Qwen/Qwen3-0.6B",
    ]
    assert "/etc/sparkfleet/vllm/qwen3-0.6b.secrets.env:/run/sparkfleet/secrets.env:ro" in words
    # The keyed unit loads the key guard (module_utils/key_guard.py) and names its fingerprint.
    guard = ROOT / "roles" / "vllm_server" / "files" / "vllm_key_guard.py"
    sha256 = hashlib.sha256(guard.read_text().rstrip("\n").encode()).hexdigest()
    # Its version's own folder (module_utils/key_guard.py), so a rolled-back unit finds the guard it started with.
    assert f"/etc/sparkfleet/vllm/python/{sha256[:12]}:/opt/sparkfleet/python:ro" in words
    assert words[-6:-4] == ["--middleware", "vllm_key_guard.KeyOnEveryPath"]
    assert sha256 in unit.read_text()
    assert "--env-file" not in words
    assert KEY not in unit.read_text()
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            ["systemd-analyze", "verify", f"{unit}:vllm-qwen3-0.6b.service"], capture_output=True, text=True
        )
        assert "ExecStart" not in verify.stderr, verify.stderr


def test_an_image_with_spaces_stays_one_word_and_never_becomes_docker_flags(tmp_path):
    hostile = "--privileged --volume /:/host vllm/vllm-openai:latest"
    done, unit = render(tmp_path, hostile)
    assert done.returncode == 0, done.stdout[-3000:]
    words = exec_start(unit)
    assert hostile in words
    assert "--privileged" not in words


@pytest.mark.parametrize("hostile", ["vllm/vllm-openai:latest\nExecStartPre=/bin/sh -c id", "x\rExecStartPre=/bin/id"])
def test_an_image_with_a_line_break_is_refused_by_the_template(tmp_path, hostile):
    done, unit = render(tmp_path, hostile)
    assert done.returncode != 0
    assert "systemd_word: refusing to write" in done.stdout
    assert not unit.exists()
