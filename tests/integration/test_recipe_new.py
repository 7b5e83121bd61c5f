"""recipe_new.yml, run by the real ansible-playbook against the stand-in Hub on loopback serving the
figure fixtures (tests/fixtures/build_figure_models.py): the recipe it writes passes the checks
tests/unit/test_recipes.py applies to every recipe, carries hf_model_figures' own figures and the planner's
settings; check mode writes nothing, a second run refuses to overwrite, and a bad repo id is refused before any
request. Four ansible-playbook runs in all."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, ansible_tool, hf_standin
from memory_plan import build_inputs, plan
from recipe_rules import checked_recipe, flag_problems, load_recipe, schema_problems
from vllm_flags import load_flag_list

REPO = "sparkfleet-test/qwen3-moe"
NAME = "qwen3-moe"
FLAGS_FILE = ROOT / "recipes" / "vllm-serve-flags.txt"
SPARK_MEM_TOTAL_BYTES = 130663833600  # the playbook's spark_memory_total_bytes


def _load(name: str, path: Path) -> ModuleType:
    """A Python file as a module: the fixture builder, and library/hf_model_figures for its plain functions."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


BUILD = _load("build_figure_models", ROOT / "tests" / "fixtures" / "build_figure_models.py")
FIGURES = _load("library_hf_model_figures", ROOT / "library" / "hf_model_figures.py")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict, Path]]:
    """(stand-in URL, the fixture models by repo id, its request log), built and started once for the module."""
    root = tmp_path_factory.mktemp("recipe-new-hub")
    models = BUILD.build(root)
    log = root / "standin.log"
    with hf_standin.running_standin(root, log) as url:
        yield url, models, log


@pytest.fixture(scope="module")
def recipes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("recipes")
    shutil.copy(FLAGS_FILE, folder / FLAGS_FILE.name)
    return folder


def playbook(extra: dict, check: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), no_proxy="127.0.0.1")
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    argv = [ansible_tool("ansible-playbook"), "recipe_new.yml", "-e", json.dumps(extra)]
    if check:
        argv.append("--check")
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def said(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def test_a_bad_repo_id_is_refused_before_any_request(hub, recipes_dir):
    url, _, log = hub
    before = log.read_text(encoding="utf-8")
    done = playbook({"hf_repo": "no-org-here", "hf_endpoint": url, "recipes_dir": str(recipes_dir)})
    assert done.returncode != 0
    assert "hf_repo='no-org-here' is not a Hugging Face repo id ORG/NAME" in said(done)
    assert log.read_text(encoding="utf-8") == before  # the stand-in logs every request it gets
    assert list(recipes_dir.glob("*.yml")) == []


def test_check_mode_writes_nothing(hub, recipes_dir):
    url, _, _ = hub
    done = playbook({"hf_repo": REPO, "hf_endpoint": url, "recipes_dir": str(recipes_dir)}, check=True)
    assert done.returncode == 0, said(done)
    assert f"Would write {recipes_dir}/{NAME}.yml" in said(done)
    assert list(recipes_dir.glob("*.yml")) == []


def test_the_written_recipe_passes_the_recipe_checks_and_carries_the_module_s_figures(hub, recipes_dir):
    url, models, _ = hub
    model = models[REPO]
    done = playbook({"hf_repo": REPO, "hf_revision": "release", "hf_endpoint": url, "recipes_dir": str(recipes_dir)})
    assert done.returncode == 0, said(done)

    data = load_recipe(NAME, recipes_dir)
    lint = [ansible_tool("yamllint"), "-s", "-c", str(ROOT / ".yamllint"), str(recipes_dir / f"{NAME}.yml")]
    linted = subprocess.run(lint, capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    flags = load_flag_list(recipes_dir / FLAGS_FILE.name)
    assert data["name"] == NAME
    assert schema_problems(data, NAME) == []
    assert flag_problems(data, flags, NAME) == []
    recipe, problems = checked_recipe(NAME, recipes_dir, {}, flags, NAME)
    assert problems == [] and recipe == data

    figures, _ = FIGURES.measure(FIGURES.Hub(url, REPO, model.commit, None, 30), "auto")
    assert data["hf_repo"] == REPO
    assert data["hf_revision"] == model.commit == figures["commit"]
    assert data["architecture"] == figures["architecture"]
    assert data["sources"]["architecture_keys"] == figures["sources"]
    assert "none yet" in data["sources"]["flags"]
    assert (data["serve_flags"], data["env"], data["kv_cache_dtype"]) == ({}, {}, "auto")

    # A tiny model: one Spark at its full context, and the planner agrees with the written settings.
    assert data["tensor_parallel_size"] == 1
    assert data["max_model_len"] == figures["architecture"]["max_context"]
    inputs, problems = build_inputs(data, memory_total_bytes=SPARK_MEM_TOTAL_BYTES, name=NAME)
    assert problems == []
    assert plan(inputs).fits
    assert 1 <= data["max_num_seqs"] <= 4


def test_a_second_run_refuses_to_overwrite(hub, recipes_dir):
    url, _, _ = hub
    path = recipes_dir / f"{NAME}.yml"
    before = path.read_bytes()
    done = playbook({"hf_repo": REPO, "hf_endpoint": url, "recipes_dir": str(recipes_dir)})
    assert done.returncode != 0
    assert f"{path} already exists and is not overwritten" in said(done)
    assert "-e recipe_name=NAME" in said(done)
    assert path.read_bytes() == before
