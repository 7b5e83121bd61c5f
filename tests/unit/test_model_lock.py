"""Model revisions locked like the image (module_utils/model_lock.py, library/hf_model_lock.py): a model without a
commit follows a branch; the first run resolves it on the Hub (the stand-in, tests/standins/hf_hub, on loopback) and
writes the models lock; later runs serve the locked commit even when the branch moves, until an update shows the
old and the new commit; an explicit commit wins and asks nothing; no Hub and no lock entry stops with both fixes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, hf_standin
from model_lock import lock_problems, with_locked_revision
from recipe_rules import checked_recipe, load_recipe
from vllm_flags import load_flag_list

RECIPES_DIR = ROOT / "recipes"
REPO = "sparkfleet-test/lock-model"
FIRST, SECOND = "1" * 40, "2" * 40
# Nothing listens on port 9 of loopback (discard): the Hub out of reach.
NO_HUB = "http://127.0.0.1:9"
FOLLOWS = {"recipe": "qwen3-0.6b", "port": 8000, "hf_repo": REPO, "hf_revision": None}


def publish(root: Path, commit: str) -> None:
    hf_standin.publish_commit(root, REPO, commit)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("lock-hub")
    publish(root, FIRST)
    with hf_standin.running_standin(root) as url:
        yield url, root


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def lock(run_module, path: Path, endpoint: str, entries: list[dict], **options) -> dict:
    check_mode = options.pop("_check", False)
    args = {"entries": entries, "recipes_dir": str(RECIPES_DIR), "path": str(path), "endpoint": endpoint}
    return run_module("hf_model_lock", {**args, **options}, check_mode=check_mode)


def test_the_first_run_resolves_and_locks_later_runs_keep_the_commit_until_an_update(run_module, hub, tmp_path):
    url, root = hub
    publish(root, FIRST)
    path = tmp_path / "models.lock.yml"
    first = lock(run_module, path, url, [FOLLOWS])
    assert not first.get("failed"), first
    assert first["revisions"] == {f"{REPO}@main": FIRST} and first["changed"] is True
    assert first["moved"] == [{"key": f"{REPO}@main", "old": None, "new": FIRST}]
    written = yaml.safe_load(path.read_text())["models"][f"{REPO}@main"]
    assert (written["commit"], written["previous_commit"]) == (FIRST, None)
    assert path.read_text().startswith("# The commit each model's branch was resolved to")

    # The branch moves on the Hub; the lock holds, and it needs no Hub to hold.
    publish(root, SECOND)
    for endpoint in (url, NO_HUB):
        again = lock(run_module, path, endpoint, [FOLLOWS])
        assert (again["revisions"], again["changed"]) == ({f"{REPO}@main": FIRST}, False), again
        assert again["resolved"] == [f"{REPO}@main: {FIRST} (from the lock {path})"]

    # Asked to move: old and new are shown, the old one kept in the entry.
    moved = lock(run_module, path, url, [FOLLOWS], update=True)
    assert moved["moved"] == [{"key": f"{REPO}@main", "old": FIRST, "new": SECOND}]
    assert moved["resolved"] == [f"{REPO}@main: {SECOND} (resolved on {url} now, moved from {FIRST})"]
    entry = yaml.safe_load(path.read_text())["models"][f"{REPO}@main"]
    assert (entry["commit"], entry["previous_commit"]) == (SECOND, FIRST)
    # Updating to where it already is changes nothing.
    assert lock(run_module, path, url, [FOLLOWS], update=True)["changed"] is False


def test_check_mode_resolves_but_writes_no_lock(run_module, hub, tmp_path):
    url, root = hub
    publish(root, FIRST)
    path = tmp_path / "models.lock.yml"
    checked = lock(run_module, path, url, [FOLLOWS], _check=True)
    assert (checked["revisions"], checked["changed"]) == ({f"{REPO}@main": FIRST}, True)
    assert not path.exists()


def test_an_explicit_commit_wins_and_asks_nothing(run_module, tmp_path):
    path = tmp_path / "models.lock.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    f"{REPO}@main": {"commit": FIRST, "previous_commit": None, "locked_at": "2026-12-04T10:00:00Z"}
                }
            }
        )
    )
    pinned = lock(run_module, path, NO_HUB, [{**FOLLOWS, "hf_revision": SECOND}, {"recipe": "qwen3-0.6b", "port": 1}])
    assert (pinned["revisions"], pinned["changed"]) == ({}, False), pinned
    # And the recipe keeps its own commit even though the lock names another for that branch.
    recipe = with_locked_revision({"hf_repo": REPO, "hf_revision": SECOND}, {f"{REPO}@main": FIRST})
    assert recipe["hf_revision"] == SECOND


def test_a_branch_of_its_own_is_locked_apart(run_module, hub, tmp_path):
    url, root = hub
    hf_standin.builder().write_repo(root, "sparkfleet-test/lock-branches", FIRST, {"config.json": b"{}"})
    repo_json = root / "sparkfleet-test" / "lock-branches" / "repo.json"
    refs = json.loads(repo_json.read_text())
    (root / "sparkfleet-test" / "lock-branches" / SECOND).mkdir()
    (root / "sparkfleet-test" / "lock-branches" / SECOND / "config.json").write_text("{}")
    repo_json.write_text(json.dumps({**refs, "refs": {"main": FIRST, "v2": SECOND}}))
    entries = [
        {**FOLLOWS, "hf_repo": "sparkfleet-test/lock-branches", "hf_branch": branch} for branch in ("main", "v2")
    ]
    done = lock(run_module, tmp_path / "models.lock.yml", url, entries)
    assert done["revisions"] == {
        "sparkfleet-test/lock-branches@main": FIRST,
        "sparkfleet-test/lock-branches@v2": SECOND,
    }


def test_no_hub_and_no_lock_entry_stops_naming_the_entry_and_both_fixes(run_module, tmp_path):
    done = lock(run_module, tmp_path / "models.lock.yml", NO_HUB, [{"recipe": "qwen3-0.6b", "port": 1}, FOLLOWS])
    assert done["failed"] is True
    message = done["msg"]
    assert message.startswith(
        "vllm_server_models[1] (recipe qwen3-0.6b): sparkfleet-test/lock-model has no pinned commit"
    )
    assert "Set hf_revision to a commit of sparkfleet-test/lock-model" in message
    assert "reach the Hub once (or the site's mirror, vllm_server_hf_endpoint)" in message
    assert not (tmp_path / "models.lock.yml").exists()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("models: [\n", "cannot be read"),
        ("models:\n  no-branch: {commit: " + "1" * 40 + "}\n", "the key must be REPO@BRANCH"),
        ("models:\n  a/b@main: {commit: abc, locked_at: '2026-12-04T10:00:00Z'}\n", "commit='abc': expected a commit"),
        ("models:\n  a/b@main: {commit: " + "1" * 40 + ", locked_at: now, extra: 1}\n", "extra is not a key"),
    ],
)
def test_a_damaged_lock_stops_the_run_naming_what_is_wrong(run_module, tmp_path, content, named):
    path = tmp_path / "models.lock.yml"
    path.write_text(content)
    done = lock(run_module, path, NO_HUB, [FOLLOWS])
    assert done["failed"] is True and named in done["msg"], done["msg"]
    assert "restore" in done["msg"]


def test_the_locked_commit_reaches_the_command_line_and_an_unlocked_branch_is_refused():
    flags = load_flag_list(RECIPES_DIR / "vllm-serve-flags.txt")
    overrides = {key: value for key, value in FOLLOWS.items() if key not in ("recipe", "port")}
    recipe, found = checked_recipe("qwen3-0.6b", RECIPES_DIR, overrides, flags, "e", revisions={f"{REPO}@main": FIRST})
    assert found == [] and recipe["hf_revision"] == FIRST
    recipe, found = checked_recipe("qwen3-0.6b", RECIPES_DIR, overrides, flags, "e", revisions={})
    assert recipe is None and any("the models lock holds the commit its hf_branch" in problem for problem in found)
    _, found = checked_recipe("qwen3-0.6b", RECIPES_DIR, {**overrides, "hf_branch": FIRST}, flags, "e")
    assert any("e.hf_branch=" in problem and "a commit belongs in hf_revision" in problem for problem in found)


def test_a_lock_entry_of_the_written_shape_passes():
    entry = {"commit": FIRST, "previous_commit": None, "locked_at": "2026-12-04T10:00:00Z"}
    assert lock_problems({"models": {f"{REPO}@main": entry}}) == []
    assert lock_problems(None) == []
    # A hand edit that drops the quotes: YAML reads the time back as a datetime, which is still a time.
    edited = yaml.safe_load(f"models:\n  {REPO}@main: {{commit: '{FIRST}', locked_at: 2026-12-04T10:00:00Z}}\n")
    assert lock_problems(edited) == []


def test_a_branch_with_an_at_sign_is_refused_before_it_breaks_the_lock_key():
    flags = load_flag_list(RECIPES_DIR / "vllm-serve-flags.txt")
    overrides = {"hf_repo": REPO, "hf_revision": None, "hf_branch": "v1@rc"}
    _, found = checked_recipe("qwen3-0.6b", RECIPES_DIR, overrides, flags, "e")
    assert any(problem.startswith("e.hf_branch='v1@rc': expected a branch or tag") for problem in found), found


def test_entries_by_host_are_named_by_host_and_a_malformed_entry_is_left_to_the_model_check(run_module, tmp_path):
    by_host = {"spark-a": [{"recipe": "qwen3-0.6b", "port": 1}], "spark-b": [{"recipe": 123, "port": 2}, FOLLOWS]}
    args = {"by_host": by_host, "recipes_dir": str(RECIPES_DIR), "path": str(tmp_path / "lock.yml")}
    done = run_module("hf_model_lock", {**args, "endpoint": NO_HUB})
    assert done["failed"] is True
    assert done["msg"].startswith("spark-b: vllm_server_models[1] (recipe qwen3-0.6b): sparkfleet-test/lock-model")


def resolve(run_module, entry: dict, locked: dict) -> dict:
    args = {
        "models": [entry],
        "recipes_dir": str(RECIPES_DIR),
        "listen_address": "127.0.0.1",
        "data_dir": "/var/lib/sparkfleet",
        "config_dir": "/etc/sparkfleet/vllm",
        "host": "spark-1",
        "memory_total_bytes": 127_601_400 * 1024,
        "revisions": locked["revisions"],
        "figures": locked["figures"],
    }
    return run_module("vllm_models", args, check_mode=True)


def test_a_locked_commit_is_measured_and_the_plan_uses_the_measured_figures(run_module, hub, tmp_path):
    """The lock keeps what hf_model_figures reads at the locked commit; the planner takes the measured value of
    each key the recipe states, says where weight_bytes differ from the estimate, and an entry's own key wins."""
    url, root = hub
    figures_build = hf_standin.figure_builder()
    model = figures_build.llama_dense("sparkfleet-test/lock-measured")
    figures_build.write_model(root, model)
    key = f"{model.repo_id}@main"
    entry = {"recipe": "llama-3.1-8b-instruct-fp8", "port": 8000, "hf_repo": model.repo_id, "hf_revision": None}
    path = tmp_path / "models.lock.yml"
    locked = lock(run_module, path, url, [entry])
    assert locked["revisions"] == {key: model.commit}, locked
    direct = run_module("hf_model_figures", {"repo_id": model.repo_id, "revision": model.commit, "endpoint": url})
    assert locked["figures"][key] == direct["architecture"]
    assert yaml.safe_load(path.read_text())["models"][key]["figures"] == direct["architecture"]
    # Read back from the lock on the next run, with no Hub.
    assert lock(run_module, path, NO_HUB, [entry])["figures"] == locked["figures"]

    resolved = resolve(run_module, entry, locked)
    assert not resolved.get("failed"), resolved
    estimate = load_recipe("llama-3.1-8b-instruct-fp8", RECIPES_DIR)["architecture"]
    planned = resolved["models"][0]["settings"]["architecture"]
    for name in estimate:
        assert planned[name] == direct["architecture"].get(name, estimate[name]), name
    measured_gb = direct["architecture"]["weight_bytes"] / 1e9
    (note,) = resolved["notes"]
    assert note.startswith("vllm_server_models[0] (recipe llama-3.1-8b-instruct-fp8): the plan uses weight_bytes")
    assert f"{measured_gb:.2f} GB, over the recipe's estimate, 9.08 GB" in note

    own = resolve(run_module, {**entry, "architecture": {"weight_bytes": 9_000_000_000}}, locked)
    assert own["models"][0]["settings"]["architecture"]["weight_bytes"] == 9_000_000_000
    assert own["models"][0]["settings"]["architecture"]["kv_heads"] == direct["architecture"]["kv_heads"]
    assert own["notes"] == []
