"""What the Sparks serve, settled in the real preflight play.

The models lock: two Sparks (this machine twice, over the local connection, with
the stand-in nvidia-smi) serve a model that names no commit. The first run resolves its branch once on the stand-in
Hub (on loopback), writes models.lock.yml beside the inventory and both Sparks serve that commit; when the branch
moves on the Hub the next run keeps the locked commit; vllm_server_models_update moves it, showing old and new.

The one-model choice: -e sparkfleet_model=RECIPE serves that recipe alone on port 8000, over the inventory's
vllm_server_models, and a name that is no recipe stops preflight listing the recipes there are."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool, hf_standin
from test_preflight_role import FITS, said

REPO = "sparkfleet-test/lock-model"
SAY = (
    "{{ inventory_hostname }} serves {{ vllm_server_resolved.models | map(attribute='recipe') | join(',') }} at "
    "{{ vllm_server_resolved.models[0].hf_revision }} on {{ vllm_server_resolved.models[0].port }}"
)
FIRST, SECOND = "a" * 40, "b" * 40


def publish(root: Path, commit: str) -> None:
    hf_standin.publish_commit(root, REPO, commit)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("lock-hub")
    publish(root, FIRST)
    with hf_standin.running_standin(root) as url:
        yield url, root


def run(folder: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """preflight.yml, then a play that says the commit each Spark will serve."""
    playbook = folder / "preflight-and-say.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {"name": "Preflight", "ansible.builtin.import_playbook": str(ROOT / "playbooks" / "preflight.yml")},
                {
                    "name": "Say what each Spark serves",
                    "hosts": "sparks",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Say the commit",
                            "ansible.builtin.debug": {"msg": SAY},
                        }
                    ],
                },
            ],
            sort_keys=False,
        )
    )
    argv = [ansible_tool("ansible-playbook"), "-i", str(folder / "inventory.yml"), str(playbook), *extra]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_one_commit_is_locked_for_every_spark_and_kept_until_an_update(hub, nvidia_smi_env, tmp_path):
    url, root = hub
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    entry = {"recipe": "qwen3-0.6b", "port": 8000, "hf_repo": REPO, "hf_revision": None}
    variables = {**FITS, **local, "vllm_server_models": [entry], "vllm_server_hf_endpoint": url}
    inventory = {"sparks": {"hosts": {"spark-a": None, "spark-b": None}, "vars": variables}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = {**nvidia_smi_env("gb10"), "no_proxy": "127.0.0.1"}
    lock_file = tmp_path / "models.lock.yml"

    first = run(tmp_path, env)
    assert first.returncode == 0, first.stdout[-3000:]
    text = said(first)
    assert f"{REPO}@main: {FIRST} (resolved on {url} now)" in text
    assert f"spark-a serves qwen3-0.6b at {FIRST}" in text and f"spark-b serves qwen3-0.6b at {FIRST}" in text
    assert yaml.safe_load(lock_file.read_text())["models"][f"{REPO}@main"]["commit"] == FIRST

    publish(root, SECOND)
    again = run(tmp_path, env)
    assert again.returncode == 0, again.stdout[-3000:]
    text = said(again)
    assert f"{REPO}@main: {FIRST} (from the lock {lock_file})" in text
    assert f"spark-a serves qwen3-0.6b at {FIRST}" in text and f"spark-b serves qwen3-0.6b at {FIRST}" in text

    moved = run(tmp_path, env, "-e", "vllm_server_models_update=true")
    assert moved.returncode == 0, moved.stdout[-3000:]
    text = said(moved)
    assert f"{REPO}@main: {SECOND} (resolved on {url} now, moved from {FIRST})" in text
    assert f"spark-a serves qwen3-0.6b at {SECOND}" in text and f"spark-b serves qwen3-0.6b at {SECOND}" in text
    entry = yaml.safe_load(lock_file.read_text())["models"][f"{REPO}@main"]
    assert (entry["commit"], entry["previous_commit"]) == (SECOND, FIRST)


def test_one_variable_chooses_the_model_over_the_inventory_list(nvidia_smi_env, tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    # The inventory's list: a model far too large for this machine, which preflight would refuse.
    listed = [{"recipe": "nemotron-3-super-120b-a12b-nvfp4", "port": 9000}]
    inventory = {"sparks": {"hosts": {"spark-a": None}, "vars": {**FITS, **local, "vllm_server_models": listed}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = nvidia_smi_env("gb10")

    chosen = run(tmp_path, env, "-e", "sparkfleet_model=qwen3-0.6b")
    assert chosen.returncode == 0, chosen.stdout[-3000:]
    assert "spark-a serves qwen3-0.6b at c1899de289a04d12100db370d81485cdf75e47ca on 8000" in said(chosen)

    unknown = run(tmp_path, env, "-e", "sparkfleet_model=qwen3-0.6")
    assert unknown.returncode != 0
    text = said(unknown)
    assert "sparkfleet_model[0] (recipe qwen3-0.6): recipe 'qwen3-0.6' was not found" in text, text[-3000:]
    assert "qwen3-0.6b" in text.split("available:", 1)[1]

    # Set in the inventory as a number (YAML's 2 is no recipe name): the check names the variable.
    inventory["sparks"]["vars"]["sparkfleet_model"] = 2
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    number = run(tmp_path, env)
    assert number.returncode != 0
    assert "sparkfleet_model must name one recipe, e.g. gpt-oss-120b (got 2)" in said(number), said(number)[-3000:]
