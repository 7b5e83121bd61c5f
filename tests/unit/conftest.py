"""In-process tests. module_utils/'s functions are imported directly (tests/conftest.py puts the folder on sys.path);
library/'s modules run in this process through `run_module`, ansible-core's own pattern for testing a module:
the module's arguments are set with patch_module_args, its main() is called, and the JSON it prints on exit is
its result. No Ansible process starts, so a case costs milliseconds instead of seconds.

What the module reads from its host is set with monkeypatch in this process: environment variables, the PATH
(see `nvidia_smi`), and for what a module does through AnsibleModule.run_command, a patched run_command."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args
from helpers import ROOT, STANDIN_NVIDIA_SMI


def load_module(name: str):
    """library/NAME.py as a fresh module object (its own globals for each run, as each Ansible run has)."""
    spec = importlib.util.spec_from_file_location(f"sparkfleet_library_{name}", ROOT / "library" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def run_module() -> Callable[..., dict]:
    """run_module(name, args, check_mode=False) -> the module's result, as `ansible -m NAME -a ARGS` returns it.

    The module runs in this process: what it leaves behind is undone after each run (environment variables,
    umask, working folder), and the warnings ansible-core collects per process are cleared before each run.
    A module that calls neither exit_json nor fail_json, or prints something else than its JSON, fails the test."""

    def run(name: str, args: dict, check_mode: bool = False) -> dict:
        module = load_module(name)
        environ, umask, cwd = dict(os.environ), os.umask(0o022), os.getcwd()
        os.umask(umask)
        for collected in (ansible_warnings._global_warnings, ansible_warnings._global_deprecations):
            collected.clear()
        out = io.StringIO()
        # A module runs on its host, never in a controller: a test that imported controller code (a filter
        # plugin, ansible.errors) has switched this process to controller mode, where warnings go to the display.
        was_controller, ansible_internal.is_controller = ansible_internal.is_controller, False
        try:
            with patch_module_args({**args, "_ansible_check_mode": check_mode}), redirect_stdout(out):
                try:
                    module.main()
                except SystemExit:
                    pass
                else:
                    raise AssertionError(f"{name} returned without exit_json or fail_json")
        finally:
            ansible_internal.is_controller = was_controller
            os.environ.clear()
            os.environ.update(environ)
            os.umask(umask)
            os.chdir(cwd)
        printed = out.getvalue()
        try:
            result = json.loads(printed)
        except json.JSONDecodeError:
            raise AssertionError(f"{name} printed no JSON result:\n{printed}") from None
        # As the controller reports it: a module that does not say whether it changed something did not, and
        # each warning is its message (the module sends ansible-core's structured form).
        result.setdefault("changed", False)
        if "warnings" in result:
            result["warnings"] = list(ansible_warnings.get_warning_messages())
        return result

    return run


@pytest.fixture
def nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str | None], None]:
    """nvidia_smi(profile): from now on this process's PATH finds the stand-in nvidia-smi answering as the recorded
    PROFILE, or finds no nvidia-smi at all with None; the PATH is restored after the test."""

    def use(profile: str | None) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "nvidia-smi").unlink(missing_ok=True)
        if profile is None:
            monkeypatch.delenv("NVIDIA_SMI_STANDIN_PROFILE", raising=False)
        else:
            (bin_dir / "nvidia-smi").symlink_to(STANDIN_NVIDIA_SMI)
            monkeypatch.setenv("NVIDIA_SMI_STANDIN_PROFILE", profile)
        # Only the stand-in directory and the system's own; a real nvidia-smi elsewhere must not leak in.
        monkeypatch.setenv(
            "PATH", os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        )

    return use


class Clock:
    """time.monotonic and time.sleep for a wait: sleeping moves the clock, and nothing else does, so how long
    something waited is exact however busy the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def watch_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The clock of module_utils/status_watch.py, the wait behind job_watch: its wait then passes at once, and the
    test reads how long it waited."""
    import ansible.module_utils.status_watch as status_watch

    clock = Clock()
    monkeypatch.setattr(status_watch, "time", clock)
    return clock
