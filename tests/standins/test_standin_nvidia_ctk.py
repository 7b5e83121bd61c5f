"""Tests of the stand-in for NVIDIA's container-toolkit apt repository (tests/standins/nvidia-container-toolkit).

Two halves:
- nvidia-ctk's "runtime configure --runtime=docker", run from its source, on real daemon.json files;
- the repository built by tests/fixtures/build-apt-repo.sh, served on loopback by http.server and read by the
  real apt-get/apt-cache in a throwaway root: the signature verifies with the dearmored gpgkey, both versions
  are listed, pins resolve, and tampered indexes are refused.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import ROOT

STANDIN = ROOT / "tests" / "standins" / "nvidia-container-toolkit"
NVIDIA_CTK = STANDIN / "packages" / "nvidia-container-toolkit-base" / "root" / "usr" / "bin" / "nvidia-ctk"
BUILD_SCRIPT = ROOT / "tests" / "fixtures" / "build-apt-repo.sh"
VERSIONS = ("1.17.7-1", "1.17.8-1")
PACKAGES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)
KEYRING_NAME = "nvidia-container-toolkit-keyring.gpg"
NVIDIA_RUNTIME = {"args": [], "path": "nvidia-container-runtime"}


def run_ctk(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the stand-in nvidia-ctk from its source tree."""
    return subprocess.run([sys.executable, str(NVIDIA_CTK), *args], capture_output=True, text=True, check=False)


def configure(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """nvidia-ctk runtime configure --runtime=docker --config=CONFIG EXTRA..."""
    return run_ctk("runtime", "configure", "--runtime=docker", f"--config={config}", *extra)


# --------------------------------------------------------------------------------------------------------------
# nvidia-ctk runtime configure
# --------------------------------------------------------------------------------------------------------------

USER_CONFIGS = {
    "log-opts and registry-mirrors": {
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "3"},
        "registry-mirrors": ["https://mirror.example.internal"],
    },
    "another runtime kept": {"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "data-root": "/srv/docker"},
    "default-runtime untouched": {"default-runtime": "runc", "live-restore": True, "max-concurrent-downloads": 6},
    "runtimes null": {"runtimes": None, "log-driver": "journald"},
    "stale nvidia entry replaced": {"runtimes": {"nvidia": {"path": "/old/path", "runtimeArgs": ["--debug"]}}},
}


@pytest.mark.parametrize("user_config", USER_CONFIGS.values(), ids=USER_CONFIGS.keys())
def test_configure_keeps_user_keys_and_adds_runtime(tmp_path: Path, user_config: dict) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(json.dumps(user_config))

    result = configure(daemon_json)

    assert result.returncode == 0, result.stderr
    written = json.loads(daemon_json.read_text())
    expected = {key: value for key, value in user_config.items() if key != "runtimes"}
    expected_runtimes = {
        name: runtime for name, runtime in (user_config.get("runtimes") or {}).items() if name != "nvidia"
    }
    expected["runtimes"] = {**expected_runtimes, "nvidia": NVIDIA_RUNTIME}
    assert written == expected
    assert f"Loading config from {daemon_json}" in result.stderr
    assert f"Wrote updated config to {daemon_json}" in result.stderr
    assert "It is recommended that docker daemon be restarted." in result.stderr


def test_configure_writes_go_marshalindent_layout(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text('{"registry-mirrors": ["https://m.example"], "log-opts": {"max-size": "10m"}, "mtu": 1.0}\n')

    assert configure(daemon_json).returncode == 0

    # keys sorted, 4-space indent, numbers as Go's float64 prints them, no trailing newline (as NVIDIA's tool)
    assert daemon_json.read_text() == (
        "{\n"
        '    "log-opts": {\n'
        '        "max-size": "10m"\n'
        "    },\n"
        '    "mtu": 1,\n'
        '    "registry-mirrors": [\n'
        '        "https://m.example"\n'
        "    ],\n"
        '    "runtimes": {\n'
        '        "nvidia": {\n'
        '            "args": [],\n'
        '            "path": "nvidia-container-runtime"\n'
        "        }\n"
        "    }\n"
        "}"
    )


@pytest.mark.parametrize("existing_default", [None, "runc"])
def test_configure_set_as_default(tmp_path: Path, existing_default: str | None) -> None:
    daemon_json = tmp_path / "daemon.json"
    user_config = {"log-opts": {"max-size": "10m"}}
    if existing_default:
        user_config["default-runtime"] = existing_default
    daemon_json.write_text(json.dumps(user_config))

    assert configure(daemon_json, "--set-as-default").returncode == 0

    written = json.loads(daemon_json.read_text())
    assert written["default-runtime"] == "nvidia"
    assert written["runtimes"] == {"nvidia": NVIDIA_RUNTIME}
    assert written["log-opts"] == {"max-size": "10m"}


def test_configure_creates_missing_file_and_directories(tmp_path: Path) -> None:
    daemon_json = tmp_path / "etc" / "docker" / "daemon.json"

    result = configure(daemon_json)

    assert result.returncode == 0, result.stderr
    assert "Config file does not exist; using empty config" in result.stderr
    assert f"Wrote updated config to {daemon_json}" in result.stderr
    assert daemon_json.read_text() == json.dumps({"runtimes": {"nvidia": NVIDIA_RUNTIME}}, indent=4)
    assert (daemon_json.parent.stat().st_mode & 0o777) == 0o755


@pytest.mark.parametrize("extra", [(), ("--set-as-default",), ("--cdi.enabled",)], ids=["plain", "default", "cdi"])
def test_configure_second_run_is_byte_identical(tmp_path: Path, extra: tuple[str, ...]) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text('{"registry-mirrors": ["https://m.example"], "features": {"buildkit": true}}')

    assert configure(daemon_json, *extra).returncode == 0
    first = daemon_json.read_bytes()
    assert configure(daemon_json, *extra).returncode == 0

    assert daemon_json.read_bytes() == first


def test_configure_dry_run_prints_and_leaves_file_alone(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"
    original = '{"log-opts": {"max-size": "10m"}}'
    daemon_json.write_text(original)

    result = configure(daemon_json, "--dry-run", "--set-as-default")

    assert result.returncode == 0, result.stderr
    assert daemon_json.read_text() == original
    assert json.loads(result.stdout) == {
        "default-runtime": "nvidia",
        "log-opts": {"max-size": "10m"},
        "runtimes": {"nvidia": NVIDIA_RUNTIME},
    }
    assert "Wrote updated config" not in result.stderr


def test_configure_custom_name_and_path(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"

    result = configure(daemon_json, "--nvidia-runtime-name", "gpu", "--runtime-path=/usr/bin/nvidia-container-runtime")

    assert result.returncode == 0, result.stderr
    assert json.loads(daemon_json.read_text()) == {
        "runtimes": {"gpu": {"args": [], "path": "/usr/bin/nvidia-container-runtime"}}
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "unable to load config for runtime docker: EOF"),
        ("{not json", "unable to load config for runtime docker: invalid JSON"),
        ('["a"]', "json: cannot unmarshal array into Go value of type docker.Config"),
        ('{"runtimes": ["nvidia"]}', "unable to update config:"),
    ],
    ids=["empty", "invalid", "array", "runtimes-not-object"],
)
def test_configure_refuses_bad_config_and_leaves_it(tmp_path: Path, content: str, message: str) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(content)

    result = configure(daemon_json)

    assert result.returncode == 1
    assert "level=error" in result.stderr
    assert message in result.stderr
    assert daemon_json.read_text() == content


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("runtime", "configure", "--runtime=podman"), "unrecognized runtime 'podman'"),
        (("runtime", "configure", "--runtime=containerd"), "implements only --runtime=docker"),
        (("runtime", "configure", "--drop-in-config=/etc/docker/x.json"), "does not support drop-in configs"),
        (("runtime", "configure", "--bogus"), "flag provided but not defined: -bogus"),
        (("cdi", "generate"), "does not implement 'nvidia-ctk cdi generate'"),
    ],
)
def test_unsupported_commands_fail_loudly(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = run_ctk(*args, f"--config={tmp_path / 'daemon.json'}") if args[0] == "runtime" else run_ctk(*args)

    assert result.returncode == 1
    assert message in result.stderr
    assert not (tmp_path / "daemon.json").exists()


# --------------------------------------------------------------------------------------------------------------
# The built repository
# --------------------------------------------------------------------------------------------------------------

REPO_TOOLS = ("bash", "dpkg", "dpkg-deb", "apt-ftparchive", "apt-get", "apt-cache", "gpg", "xz", "flock")
needs_repo_tools = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in REPO_TOOLS),
    reason=f"needs {', '.join(REPO_TOOLS)} (Debian packages dpkg, apt, apt-utils, gnupg, xz-utils, util-linux)",
)


def native_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def build_repo(outdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD_SCRIPT), str(outdir)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in repository, built once for this module."""
    outdir = tmp_path_factory.mktemp("nvidia-repo")
    result = build_repo(outdir)
    assert result.returncode == 0, result.stderr
    return outdir


# A readiness wait sized for a loaded 2-core machine: a slow start only waits longer; a dead process fails at once.
START_TIMEOUT_S = 300


@contextmanager
def http_server(directory: Path) -> Iterator[int]:
    """Serve directory on 127.0.0.1 with python -m http.server on a free port; yield the port."""
    argv = [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(directory), "0"]
    with tempfile.TemporaryFile() as log:  # its stderr: one line per request, and why it did not start
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
            line = process.stdout.readline() if ready else ""
            match = re.search(r"port (\d+)", line)
            if not match:
                log.seek(0)
                said = log.read().decode(errors="replace")
                raise AssertionError(
                    f"http.server did not start within {START_TIMEOUT_S} s: {line!r}; its log:\n{said}"
                )
            yield int(match.group(1))
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class AptRoot:
    """A throwaway apt configuration root: real apt-get/apt-cache, none of the host's sources or state."""

    def __init__(self, root: Path, arch: str) -> None:
        self.root = root
        self.arch = arch
        for directory in (
            "etc/apt/sources.list.d",
            "etc/apt/apt.conf.d",
            "etc/apt/preferences.d",
            "etc/apt/trusted.gpg.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/lib/dpkg",
            "usr/share/keyrings",
        ):
            (root / directory).mkdir(parents=True, exist_ok=True)
        (root / "var/lib/dpkg/status").touch()
        self.keyring = root / "usr/share/keyrings" / KEYRING_NAME

    def options(self) -> list[str]:
        settings = {
            "Dir": self.root,
            "Dir::State::status": self.root / "var/lib/dpkg/status",
            "Dir::Etc::trusted": self.root / "etc/apt/trusted.gpg",
            "Dir::Etc::trustedparts": self.root / "etc/apt/trusted.gpg.d",
            "APT::Architecture": self.arch,
            "APT::Architectures": self.arch,
            "APT::Sandbox::User": "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody"),
            "Acquire::Languages": "none",
            "Debug::NoLocking": "1",
        }
        return [item for key, value in settings.items() for item in ("-o", f"{key}={value}")]

    def install_key(self, armored_key: Path) -> None:
        """gpg --dearmor the repository's gpgkey into the keyring, as NVIDIA's install guide does."""
        home = self.root / "gnupg"
        home.mkdir(mode=0o700, exist_ok=True)
        subprocess.run(
            [
                "gpg",
                "--homedir",
                str(home),
                "--batch",
                "--yes",
                "--dearmor",
                "--output",
                str(self.keyring),
                str(armored_key),
            ],
            check=True,
            capture_output=True,
        )

    def add_source(self, port: int) -> None:
        line = f"deb [signed-by={self.keyring}] http://127.0.0.1:{port}/stable/deb/$(ARCH) /\n"
        (self.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").write_text(line)

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {key: value for key, value in os.environ.items() if key != "APT_CONFIG"}
        env["LC_ALL"] = "C"
        return subprocess.run([tool, *self.options(), *args], capture_output=True, text=True, env=env, check=False)


def apt_update(tmp_path: Path, served: Path, arch: str) -> tuple[AptRoot, subprocess.CompletedProcess[str]]:
    """apt-get update against served (over loopback HTTP) with the served gpgkey; return root and result."""
    apt = AptRoot(tmp_path / f"aptroot-{arch}", arch)
    apt.install_key(served / "gpgkey")
    with http_server(served) as port:
        apt.add_source(port)
        return apt, apt.run("apt-get", "update")


def policy_versions(apt: AptRoot, package: str) -> list[str]:
    output = apt.run("apt-cache", "policy", package).stdout
    return re.findall(r"^\s+(?:\*\*\*\s+)?(\d[^\s]*) \d+$", output, flags=re.MULTILINE)


@needs_repo_tools
def test_repo_layout_copies_nvidia_flat_repository(repo: Path) -> None:
    assert (repo / "gpgkey").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    for arch in sorted({native_arch(), "amd64", "arm64"}):
        archdir = repo / "stable" / "deb" / arch
        debs = sorted(path.name for path in archdir.glob("*.deb"))
        assert debs == sorted(f"{pkg}_{version}_{arch}.deb" for pkg in PACKAGES for version in VERSIONS)
        packages = (archdir / "Packages").read_text()
        assert packages.count("Package: ") == len(PACKAGES) * len(VERSIONS)
        assert f"Filename: ./nvidia-container-toolkit_1.17.8-1_{arch}.deb" in packages
        release = (archdir / "Release").read_text()
        for field in (
            "Origin: https://nvidia.github.io/libnvidia-container/stable",
            "Codename: stable",
            "Components: main",
            f"Architectures: {arch}",
            "Version: 1.0",
            "SHA512:",
        ):
            assert field in release
        assert "MD5Sum:" not in release
        assert "SHA256:" not in release
        assert (archdir / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512")
        assert (archdir / "Release.gpg").read_text().startswith("-----BEGIN PGP SIGNATURE-----")


@needs_repo_tools
@pytest.mark.parametrize("package", PACKAGES)
def test_packages_are_labelled_stand_ins_with_real_relations(repo: Path, package: str) -> None:
    deb = repo / "stable" / "deb" / "arm64" / f"{package}_1.17.7-1_arm64.deb"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "sparkfleet test stand-in" in fields
    assert "Architecture: arm64" in fields
    expected_depends = {
        "nvidia-container-toolkit": "Depends: nvidia-container-toolkit-base (= 1.17.7-1), "
        "libnvidia-container-tools (>= 1.17.7-1), libnvidia-container-tools (<< 2.0.0)",
        "libnvidia-container-tools": "Depends: libnvidia-container1 (>= 1.17.7)",
    }.get(package)
    if expected_depends:
        assert expected_depends in fields
    else:
        assert "Depends:" not in fields


@needs_repo_tools
def test_packaged_programs_behave(repo: Path, tmp_path: Path) -> None:
    arch = native_arch()
    for package in PACKAGES:
        deb = repo / "stable" / "deb" / arch / f"{package}_1.17.7-1_{arch}.deb"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")], check=True)
    usr_bin = tmp_path / "root" / "usr" / "bin"
    assert sorted(path.name for path in usr_bin.iterdir()) == [
        "nvidia-container-cli",
        "nvidia-container-runtime",
        "nvidia-container-runtime-hook",
        "nvidia-ctk",
    ]
    assert (tmp_path / "root/usr/share/doc/libnvidia-container1/README.sparkfleet-stand-in").is_file()

    version = subprocess.run(
        [sys.executable, str(usr_bin / "nvidia-ctk"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.17.7"

    # nvidia-container-runtime execs runc with its arguments unchanged
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    fake_runc = fake_bin / "runc"
    fake_runc.write_text('#!/bin/sh\necho "runc called with: $*"\n')
    fake_runc.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    shim = subprocess.run(
        [str(usr_bin / "nvidia-container-runtime"), "--root", "/run/x", "create", "--bundle", "b"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert shim.stdout == "runc called with: --root /run/x create --bundle b\n"

    hook = subprocess.run(
        [str(usr_bin / "nvidia-container-runtime-hook"), "prestart"],
        input='{"id": "c1"}',
        capture_output=True,
        text=True,
        check=False,
    )
    assert hook.returncode == 0

    cli = subprocess.run([str(usr_bin / "nvidia-container-cli"), "--version"], capture_output=True, text=True)
    assert cli.stdout.startswith("cli-version: 1.17.7\nlib-version: 1.17.7\n")
    assert subprocess.run([str(usr_bin / "nvidia-container-cli"), "info"], capture_output=True).returncode == 1


@needs_repo_tools
def test_rebuild_with_same_sources_is_cached(repo: Path) -> None:
    inrelease = repo / "stable" / "deb" / "amd64" / "InRelease"
    before = (inrelease.stat().st_mtime_ns, (repo / "gpgkey").read_bytes())
    started = time.monotonic()

    result = build_repo(repo)

    assert result.returncode == 0, result.stderr
    assert "is up to date" in result.stdout
    assert time.monotonic() - started < 2
    assert (inrelease.stat().st_mtime_ns, (repo / "gpgkey").read_bytes()) == before


@needs_repo_tools
@pytest.mark.parametrize("arch", sorted({"amd64", "arm64"}))
def test_apt_verifies_signature_and_lists_both_versions(repo: Path, tmp_path: Path, arch: str) -> None:
    apt, update = apt_update(tmp_path, repo, arch)

    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    for package in PACKAGES:
        assert policy_versions(apt, package) == ["1.17.8-1", "1.17.7-1"]
    policy = apt.run("apt-cache", "policy", "nvidia-container-toolkit").stdout
    assert "Candidate: 1.17.8-1" in policy
    assert f"/stable/deb/{arch}  Packages" in policy


@needs_repo_tools
def test_apt_resolves_pins_like_the_real_repository(repo: Path, tmp_path: Path) -> None:
    apt, update = apt_update(tmp_path, repo, native_arch())
    assert update.returncode == 0, update.stderr

    pinned = apt.run("apt-get", "-s", "install", *(f"{package}=1.17.7-1" for package in PACKAGES))
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    installs = dict(re.findall(r"^Inst (\S+) \((\S+) ", pinned.stdout, flags=re.MULTILINE))
    assert installs == dict.fromkeys(PACKAGES, "1.17.7-1")

    latest = apt.run("apt-get", "-s", "install", "nvidia-container-toolkit")
    assert dict(re.findall(r"^Inst (\S+) \((\S+) ", latest.stdout, flags=re.MULTILINE)) == dict.fromkeys(
        PACKAGES, "1.17.8-1"
    )

    # toolkit pinned alone cannot pull the matching -base: the exact-version dependency is real
    alone = apt.run("apt-get", "-s", "install", "nvidia-container-toolkit=1.17.7-1")
    assert alone.returncode != 0
    assert "Depends: nvidia-container-toolkit-base (= 1.17.7-1)" in alone.stdout


@needs_repo_tools
def test_apt_refuses_tampered_packages_index(repo: Path, tmp_path: Path) -> None:
    served = tmp_path / "tampered"
    shutil.copytree(repo, served, ignore=shutil.ignore_patterns(".sparkfleet-standin.*"))
    archdir = served / "stable" / "deb" / "amd64"
    packages = archdir / "Packages"
    packages.write_text(packages.read_text().replace("Version: 1.17.8-1\n", "Version: 1.17.9-1\n"))
    for compressed in ("Packages.gz", "Packages.xz"):
        (archdir / compressed).unlink()
    subprocess.run(["gzip", "-9nk", str(packages)], check=True)
    subprocess.run(["xz", "-k", str(packages)], check=True)

    apt, update = apt_update(tmp_path, served, "amd64")

    assert update.returncode != 0
    assert "Hash Sum mismatch" in update.stdout + update.stderr
    assert policy_versions(apt, "nvidia-container-toolkit") == []


@needs_repo_tools
def test_apt_refuses_tampered_signed_release(repo: Path, tmp_path: Path) -> None:
    served = tmp_path / "tampered"
    shutil.copytree(repo, served, ignore=shutil.ignore_patterns(".sparkfleet-standin.*"))
    archdir = served / "stable" / "deb" / "amd64"
    for name in ("InRelease", "Release"):
        path = archdir / name
        path.write_text(path.read_text().replace("Version: 1.0\n", "Version: 1.1\n"))

    apt, update = apt_update(tmp_path, served, "amd64")

    assert update.returncode != 0
    assert "BADSIG" in update.stdout + update.stderr
    assert policy_versions(apt, "nvidia-container-toolkit") == []
