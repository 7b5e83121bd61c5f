"""docker_pull and job_watch run by real Ansible against this machine's dockerd and a loopback registry: pulls by
digest and by a moving tag, check mode, what a registry cannot serve, and the background pull with its watch
task retried until the pull ends, as the vllm_image role runs it. What the modules do without an engine is tested
in-process in tests/unit/test_docker_pull_modules.py.

The registry is Debian's docker-registry on 127.0.0.1 (dockerd treats 127.0.0.0/8 as an insecure registry, so
plain HTTP works), started for this module and killed by its PID. Its images are built here from random bytes
(FROM scratch, no network) under sparkfleet-helper-test/..., and every local image under that name is removed
before each test and at the end. A throttling TCP proxy in front of the registry makes one pull slow enough
to watch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import ROOT, ansible_tool, wait_until

PREFIX = "sparkfleet-helper-test"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


# --- the loopback registry and its images ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=check, env=env)


def local_images() -> list[str]:
    """IDs of every local image with a repository under our prefix (tagged or by digest only)."""
    listed = docker("image", "ls", "--digests", "--format", "{{.ID}} {{.Repository}}").stdout.split("\n")
    return sorted(
        {line.split()[0] for line in listed if f"/{PREFIX}/" in line or line.split(" ")[-1].startswith(PREFIX)}
    )


def forget_local_images() -> None:
    for image_id in local_images():
        docker("rmi", "-f", image_id, check=False)


def build_image(context: Path, tag: str, layer_sizes: list[int]) -> None:
    """An image FROM scratch with one layer of random (incompressible) bytes per size."""
    context.mkdir(parents=True)
    lines = ["FROM scratch"]
    for number, size in enumerate(layer_sizes):
        (context / f"layer{number}").write_bytes(os.urandom(size))
        lines.append(f"COPY layer{number} /layer{number}")
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")
    docker("build", "-q", "-t", tag, str(context))


def manifest(port: int, repository: str, reference: str) -> tuple[str, bytes]:
    """(digest, body) of a manifest in the registry, as the registry serves it."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/{repository}/manifests/{reference}", headers={"Accept": MANIFEST_V2}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers["Docker-Content-Digest"], answer.read()


def put_tag(port: int, repository: str, tag: str, body: bytes) -> None:
    """Point `tag` at a manifest, as a push would: how a tag moves in a registry."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/{repository}/manifests/{tag}",
        data=body,
        method="PUT",
        headers={"Content-Type": MANIFEST_V2},
    )
    urllib.request.urlopen(request, timeout=10).close()


class ThrottlingProxy:
    """A TCP proxy on loopback that passes the registry's answers at `rate` bytes per second."""

    def __init__(self, target_port: int, rate: int) -> None:
        self.target_port = target_port
        self.rate = rate
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.rate), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, rate: int | None) -> None:
        try:
            while chunk := source.recv(16384):
                sink.sendall(chunk)
                if rate:
                    time.sleep(len(chunk) / rate)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A loopback registry holding sparkfleet-helper-test/app:one and :two, .../slow:v1 (3 layers, about 2.4 MB)
    and .../broken:v1 (whose layer the registry has lost). Yields names, digests and the throttled port."""
    if shutil.which("docker-registry") is None or docker("info", check=False).returncode != 0:
        pytest.skip("needs Debian's docker-registry and a running dockerd")
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    (work / "registry.yml").write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {work / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with open(work / "registry.log", "w") as log:
        server = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")], stdout=log, stderr=log)
    proxy = None
    try:
        wait_until(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=5).close() or True,
            f"the registry on 127.0.0.1:{port} answers",
            [work / "registry.log"],
        )
        host = f"127.0.0.1:{port}"
        images = {
            "one": (f"{host}/{PREFIX}/app:one", [300_000, 200_000]),
            "two": (f"{host}/{PREFIX}/app:two", [250_000]),
            "slow": (f"{host}/{PREFIX}/slow:v1", [1_200_000, 800_000, 400_000]),
            "broken": (f"{host}/{PREFIX}/broken:v1", [100_000]),
        }
        for key, (tag, sizes) in images.items():
            build_image(work / "contexts" / key, tag, sizes)
            docker("push", tag)
        digests = {
            key: manifest(port, tag.split("/", 1)[1].split(":")[0], tag.rsplit(":", 1)[1])[0]
            for key, (tag, _) in images.items()
        }
        # Lose the broken image's layer: the manifest still resolves, the blob download then fails mid-stream.
        _, body = manifest(port, f"{PREFIX}/broken", "v1")
        layer = json.loads(body)["layers"][0]["digest"].split(":")[1]
        (work / "storage/docker/registry/v2/blobs/sha256" / layer[:2] / layer / "data").unlink()
        forget_local_images()
        proxy = ThrottlingProxy(port, rate=300_000)
        yield {"host": host, "port": port, "slow_host": f"127.0.0.1:{proxy.port}", "digests": digests}
    finally:
        if proxy:
            proxy.close()
        server.terminate()
        server.wait(timeout=10)
        forget_local_images()


@pytest.fixture
def clean(registry):
    """Each test starts with none of our images on this machine."""
    forget_local_images()
    return registry


# --- running the modules --------------------------------------------------------------------------------------


def ansible_env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )


@pytest.fixture
def ansible_module(run_ansible_module):
    """ansible_module(module, check=False, **args): run a module ad hoc against localhost, return its result."""

    def run(module: str, check: bool = False, **args) -> dict:
        arguments = " ".join(f"{key}={value}" for key, value in args.items())
        return run_ansible_module(module, ansible_env(), arguments, check)

    return run


def is_local(reference: str) -> bool:
    return docker("image", "inspect", reference, check=False).returncode == 0


def status_of(path: Path) -> dict:
    return json.loads(path.read_text())


# --- docker_pull ----------------------------------------------------------------------------------------------


def test_pull_by_digest_pulls_once_then_changes_nothing(ansible_module, clean, tmp_path):
    name, digest = f"{clean['host']}/{PREFIX}/app", clean["digests"]["one"]
    status_file = tmp_path / "run" / "sparkfleet" / "docker-pull.json"
    first = ansible_module("docker_pull", name=name, reference=digest, status_file=status_file)
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] is True and first["pulled"] is True
    assert first["digest"] == digest
    assert first["repo_digests"] == [f"{name}@{digest}"]
    assert is_local(f"{name}@{digest}")
    assert first["image_id"] == docker("image", "inspect", "-f", "{{.Id}}", f"{name}@{digest}").stdout.strip()
    status = status_of(status_file)
    assert status["state"] == "done" and status["layers_total"] == status["layers_done"] == 2
    assert status["bytes_done"] > 500_000 and status["error"] is None
    assert oct(status_file.stat().st_mode & 0o777) == "0o644"
    assert oct(status_file.parent.stat().st_mode & 0o777) == "0o755"

    second = ansible_module("docker_pull", name=name, reference=digest, status_file=status_file)
    assert second["changed"] is False and second["pulled"] is False
    assert second["image_id"] == first["image_id"] and second["digest"] == digest
    assert status_of(status_file)["state"] == "done"


def test_pull_by_tag_returns_the_digest_and_changes_only_when_the_tag_moves(ansible_module, clean, tmp_path):
    name = f"{clean['host']}/{PREFIX}/app"
    digests = clean["digests"]
    _, one = manifest(clean["port"], f"{PREFIX}/app", "one")
    _, two = manifest(clean["port"], f"{PREFIX}/app", "two")
    put_tag(clean["port"], f"{PREFIX}/app", "moving", one)
    status_file = tmp_path / "pull.json"

    first = ansible_module("docker_pull", name=name, reference="moving", status_file=status_file)
    assert not first.get("failed"), first.get("msg")
    assert (first["changed"], first["pulled"], first["digest"]) == (True, True, digests["one"])

    again = ansible_module("docker_pull", name=name, reference="moving", status_file=status_file)
    assert (again["changed"], again["pulled"], again["digest"]) == (False, True, digests["one"])
    assert again["image_id"] == first["image_id"]
    assert "Image is up to date" in status_of(status_file)["outcome"]

    put_tag(clean["port"], f"{PREFIX}/app", "moving", two)
    moved = ansible_module("docker_pull", name=name, reference="moving", status_file=status_file)
    assert (moved["changed"], moved["pulled"], moved["digest"]) == (True, True, digests["two"])
    assert moved["image_id"] != first["image_id"]


def test_check_mode_only_inspects(ansible_module, clean, tmp_path):
    name, digest = f"{clean['host']}/{PREFIX}/app", clean["digests"]["two"]
    status_file = tmp_path / "pull.json"
    absent = ansible_module("docker_pull", check=True, name=name, reference=digest, status_file=status_file)
    assert (absent["changed"], absent["pulled"], absent["image_id"]) == (True, False, None)
    tag = ansible_module("docker_pull", check=True, name=name, reference="two", status_file=status_file)
    assert (tag["changed"], tag["pulled"]) == (True, False)
    assert not is_local(f"{name}@{digest}") and not is_local(f"{name}:two")
    assert not status_file.exists()

    ansible_module("docker_pull", name=name, reference=digest, status_file=status_file)
    present = ansible_module("docker_pull", check=True, name=name, reference=digest, status_file=status_file)
    assert (present["changed"], present["pulled"], present["digest"]) == (False, False, digest)


@pytest.mark.parametrize(
    ("repository", "reference", "words", "advice"),
    [
        ("app", "nope", "manifest unknown", "Check that the tag or digest exists in 127.0.0.1:"),
        ("nothere", "v1", "manifest unknown", "that the name is spelled right"),
        ("app", "sha256:" + "0" * 64, "manifest unknown", "Check that the tag or digest exists"),
        ("broken", "v1", "unknown blob", "served a broken or missing layer"),
    ],
    ids=["unknown-tag", "unknown-repository", "unknown-digest", "lost-layer-mid-stream"],
)
def test_a_pull_the_registry_cannot_serve_fails_naming_the_image(
    ansible_module, clean, tmp_path, repository, reference, words, advice
):
    name = f"{clean['host']}/{PREFIX}/{repository}"
    status_file = tmp_path / "pull.json"
    result = ansible_module("docker_pull", name=name, reference=reference, status_file=status_file)
    assert result["failed"] is True
    assert result["msg"].startswith(f"Pulling {name}{'@' if ':' in reference else ':'}{reference} failed: ")
    assert words in result["msg"] and advice in result["msg"]
    status = status_of(status_file)
    assert status["state"] == "failed" and words in status["error"]


def test_an_unreachable_registry_fails_saying_so(ansible_module, tmp_path):
    name = f"127.0.0.1:{free_port()}/{PREFIX}/app"
    result = ansible_module("docker_pull", name=name, reference="v1", status_file=tmp_path / "pull.json")
    assert result["failed"] is True
    assert f"Pulling {name}:v1 failed" in result["msg"]
    assert "connection refused" in result["msg"]
    assert "is reachable from this host" in result["msg"]


# --- the background pull with a watch task retried until it ends, as the role runs it ---------------------------


def run_background_pull(name: str, reference: str, status_file: Path) -> tuple[int, dict[str, dict]]:
    """Run tests/integration/playbooks/pull-in-background.yml with the default callback at -vvv, as a person
    reads it; (exit status, {task name: what it printed}), see printed_tasks."""
    extra = {
        "pull_name": name,
        "pull_reference": reference,
        "pull_status_file": str(status_file),
        "pull_watch_seconds": 1,
    }
    argv = [
        ansible_tool("ansible-playbook"),
        "tests/integration/playbooks/pull-in-background.yml",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-e",
        json.dumps(extra),
        "-vvv",
    ]
    # JSON instead of ansible.cfg's YAML for the results: the same lines, and a long message is never wrapped.
    env = dict(ansible_env(), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    return done.returncode, printed_tasks(done.stdout)


RETRY = re.compile(r"^FAILED - RETRYING: \[localhost\]: (.*) \((\d+) retries left\)\.Result was: ", re.MULTILINE)
RESULT = re.compile(r"^(ok|changed|fatal|skipping): \[localhost\](?:: FAILED!)? => ", re.MULTILINE)
# The progress line action_plugins/job_watch.py prints on the controller for each round, at any verbosity.
PROGRESS = re.compile(r"^  \[localhost\] (.*)$", re.MULTILINE)


def printed_tasks(stdout: str) -> dict[str, dict]:
    """{task name: {"retries": [(retries left, result)], "status": "ok", "changed" or "fatal", "result": the final
    result, "progress": [lines job_watch's action plugin printed]}} from the default callback's -vvv output: a
    "FAILED - RETRYING" line with the result for each round that did not end the task. The callback leaves "failed"
    out of a result; "status" says it."""
    decoder = json.JSONDecoder()
    tasks = {}
    for section in stdout.split("\nTASK [")[1:]:
        name = section.split("]", 1)[0]
        retries = [(int(line[2]), decoder.raw_decode(section, line.end())[0]) for line in RETRY.finditer(section)]
        final = RESULT.search(section)
        tasks[name] = {
            "retries": retries,
            "status": final[1] if final else None,
            "result": decoder.raw_decode(section, final.end())[0] if final else None,
            "progress": PROGRESS.findall(section),
        }
    return tasks


def test_async_pull_with_a_retried_watch_and_async_status(clean, tmp_path):
    name, digest = f"{clean['slow_host']}/{PREFIX}/slow", clean["digests"]["slow"]
    rc, tasks = run_background_pull(name, digest, tmp_path / "run" / "docker-pull.json")
    assert rc == 0, tasks
    watch = tasks["Image | Watch the pull"]
    # The throttled registry takes a few seconds: more than one round, one line each, counting down by one.
    lefts = [left for left, _ in watch["retries"]]
    assert lefts and lefts == list(range(lefts[0], lefts[0] - len(lefts), -1)), lefts
    assert lefts[0] == (600 + 60) // 1 + 1
    lines = [result["message"] for _, result in watch["retries"]]
    assert all(not result["done"] for _, result in watch["retries"])
    # Each round describes a pull in flight: waiting, bytes of the estimated total, or (on a busy machine, where the
    # first round may come late) everything downloaded and the layers unpacking.
    in_flight = (" of about ", "estimating", "waiting", "asking the registry", " downloaded, unpacking ")
    assert lines and all(any(state in line for state in in_flight) for line in lines), lines
    # Each round's progress line is printed as it happens, not only in the -vvv retry line.
    assert watch["progress"] == lines
    final = watch["result"]
    assert (watch["status"], final["done"], final["state"], final["attempts"]) == ("ok", True, "done", len(lefts) + 1)
    assert final["message"].startswith(f"{name}@{digest[:19]}…: done, 2.4 MB downloaded in "), final
    assert tasks["Image | Say how the pull ended"]["result"]["msg"] == final["message"]
    collected = tasks["Image | Collect the pull's result"]["result"]
    assert collected["finished"] and collected["changed"] is True
    assert (collected["digest"], collected["pulled"]) == (digest, True)
    assert is_local(f"{name}@{digest}")


def test_a_failed_background_pull_ends_the_watch_and_fails_at_async_status(clean, tmp_path):
    name = f"{clean['host']}/{PREFIX}/app"
    rc, tasks = run_background_pull(name, "nope", tmp_path / "docker-pull.json")
    assert rc != 0
    final = tasks["Image | Watch the pull"]["result"]
    assert (tasks["Image | Watch the pull"]["status"], final["done"], final["state"]) == ("ok", True, "failed")
    assert "manifest unknown" in final["error"]
    assert final["message"].startswith(f"{name}:nope: the pull failed after ")
    assert list(tasks)[-1] == "Image | Collect the pull's result"
    collected = tasks["Image | Collect the pull's result"]["result"]
    assert tasks["Image | Collect the pull's result"]["status"] == "fatal"
    assert collected["msg"].startswith(f"Pulling {name}:nope failed: manifest for ")
