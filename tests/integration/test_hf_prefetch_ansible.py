"""hf_prefetch where Ansible's own processes matter, against the stand-in Hugging Face Hub on loopback: a run
killed mid-download (ansible and the module it started, as a kill -9 would) leaves an orphan that the next run
removes, and a wrong token never shows in -vvv output. Everything else hf_prefetch does is tested in-process in
tests/unit/test_hf_prefetch_module.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import hf_snapshot as snap
import pytest
from helpers import ROOT, ansible_tool, hf_standin, log_tails, wait_until

build = hf_standin.builder()
QWEN = build.QWEN
COMMIT = build.pinned_revision()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in Hub over fresh fixture repos: (base URL, its root folder)."""
    root = hf_standin.build_fixture_models(tmp_path_factory.mktemp("hub"))
    with hf_standin.running_standin(root) as url:
        yield url, root


@pytest.fixture(autouse=True)
def clean_hub(hub):
    url, root = hub
    hf_standin.set_faults(root, [])
    hf_standin.reset(url)
    yield
    hf_standin.set_faults(root, [])


def module_env() -> dict[str, str]:
    env = dict(os.environ, ANSIBLE_LIBRARY=str(ROOT / "library"), ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"))
    env.pop("HF_TOKEN", None)
    return env


@pytest.fixture
def prefetch(run_ansible_module):
    """prefetch(cache, endpoint, check=False, **options): hf_prefetch's result through `ansible localhost -m`."""

    def run(cache: Path, endpoint: str, check: bool = False, **options) -> dict:
        args = {"repo_id": QWEN, "revision": COMMIT, "cache_dir": str(cache), "endpoint": endpoint}
        args.update({"status_file": str(cache.parent / "status.json"), "disk_reserve_gib": 0, **options})
        return run_ansible_module("hf_prefetch", module_env(), json.dumps(args), check)

    return run


def ansible_argv(args: dict, *extra: str) -> list[str]:
    """`ansible localhost -m hf_prefetch -a JSON`, for runs that need the raw process or output."""
    inventory = ["localhost", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return [ansible_tool("ansible"), *inventory, *extra, "-m", "hf_prefetch", "-a", json.dumps(args)]


def kill_process_groups_mentioning(text: str) -> None:
    """SIGKILL every process whose command line holds TEXT, with its process group. Ansible's worker process
    starts a session of its own (setsid) and runs the module in it; the main process stays in ours, so it alone
    is killed by pid."""
    for proc in Path("/proc").iterdir():
        try:
            if not (proc.name.isdigit() and text in (proc / "cmdline").read_text(errors="replace")):
                continue
            pid = int(proc.name)
            group = os.getpgid(pid)
            if group == os.getpgrp():
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def test_a_killed_run_leaves_an_orphan_that_the_next_run_removes_before_completing(prefetch, hub, tmp_path):
    url, root = hub
    commit, files = hf_standin.add_big_repo(root, "sparkfleet-test/killed")
    hf_standin.set_faults(
        root,
        [
            {
                "repo": "sparkfleet-test/killed",
                "path": "model.safetensors",
                "kind": "stall",
                "offset": 12 * 2**20,
                "seconds": 60,
            }
        ],
    )
    cache = tmp_path / "hub"
    args = {"repo_id": "sparkfleet-test/killed", "revision": commit, "cache_dir": str(cache), "endpoint": url,
            "status_file": str(tmp_path / "status.json"), "disk_reserve_gib": 0, "max_workers": 1}  # fmt: skip
    log = tmp_path / "ansible.log"
    with log.open("wb") as out:
        run = subprocess.Popen(ansible_argv(args), env=module_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    blobs = Path(snap.repo_folder(str(cache), "sparkfleet-test/killed")) / "blobs"
    try:
        # The download stalls at 12 MiB for a minute; it is killed once more than 10 MiB are on disk.
        wait_until(
            lambda: any(p.stat().st_size >= 10 * 2**20 for p in blobs.glob("*.incomplete")) or run.poll() is not None,
            "10 MiB of the shard on disk",
            [log, root / "standin.log"],
        )
        assert run.poll() is None, f"hf_prefetch ended before it was killed:{log_tails([log])}"
    finally:
        kill_process_groups_mentioning(str(cache))  # ansible and the module it started, as a kill -9 would
        run.wait()
    orphans = list(blobs.glob("*.incomplete"))
    assert len(orphans) == 1 and orphans[0].stat().st_size >= 10 * 2**20

    hf_standin.set_faults(root, [])
    result = prefetch(cache, url, repo_id="sparkfleet-test/killed", revision=commit)
    assert result.get("failed") is not True, result.get("msg")
    assert result["orphans_removed"] == [str(orphans[0])]
    assert not list(blobs.glob("*.incomplete"))
    # The file that had completed before the kill was kept; only the unfinished one was fetched.
    assert result["downloaded"] == ["model.safetensors"]
    hf_standin.assert_snapshot_equals(cache, files, "sparkfleet-test/killed", commit)


def test_a_wrong_token_gives_a_clear_error_and_never_shows_the_token(prefetch, hub, tmp_path):
    url, _root = hub
    token = "hf_wrong_token_that_must_not_leak_5e1a"
    args = {"repo_id": build.PRIVATE, "revision": "main", "cache_dir": str(tmp_path / "hub"), "endpoint": url,
            "token": token, "status_file": str(tmp_path / "status.json")}  # fmt: skip
    done = subprocess.run(
        ansible_argv(args, "-vvv"), env=module_env(), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "refused the token (HTTP 401)" in done.stdout
    assert token not in done.stdout + done.stderr
    assert token not in (tmp_path / "status.json").read_text()

    good = prefetch(tmp_path / "hub", url, repo_id=build.PRIVATE, revision="main", token=build.PRIVATE_TOKEN)
    assert good.get("failed") is not True, good.get("msg")


def files_holding(folder: Path, text: str) -> list[str]:
    return [str(path) for path in folder.rglob("*") if path.is_file() and text in path.read_text(errors="replace")]


@pytest.mark.parametrize("given_as", ["token", "token_file"])
def test_a_background_fetch_keeps_a_token_file_out_of_the_jobs_files(hub, tmp_path, given_as):
    # Run as the role runs it (async), keeping the module's files on the host as Ansible wrote them. A token given
    # as an argument lands in them (the control case); one given as a file does not, and still opens the repo.
    url, _root = hub
    token_file = tmp_path / "hf-token"
    token_file.write_text(build.PRIVATE_TOKEN + "\n")
    token_file.chmod(0o600)
    args = {"repo_id": build.PRIVATE, "revision": "main", "cache_dir": str(tmp_path / "hub"), "endpoint": url,
            "status_file": str(tmp_path / "status.json"), "disk_reserve_gib": 0,
            **({"token": build.PRIVATE_TOKEN} if given_as == "token" else {"token_file": str(token_file)})}  # fmt: skip
    env = dict(module_env(), ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TMP=str(tmp_path / "remote"))
    env["ANSIBLE_ASYNC_DIR"] = str(tmp_path / "async")
    done = subprocess.run(
        ansible_argv(args, "-B", "600", "-P", "1"), env=env, cwd=ROOT, capture_output=True, text=True, timeout=660
    )
    assert done.returncode == 0, done.stdout[-2000:]
    kept = files_holding(tmp_path / "remote", build.PRIVATE_TOKEN) + files_holding(
        tmp_path / "async", build.PRIVATE_TOKEN
    )
    if given_as == "token":
        assert kept, "the control case found no token in the job's files: the test cannot see what it looks for"
    else:
        assert kept == []
