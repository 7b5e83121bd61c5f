"""The logins of node_exporter and Prometheus (roles/fleet_monitoring: tasks/web.yml, filter bcrypt_login): the
bcrypt hash in the web configuration stays the same while the password does (a second run changes nothing), a
new password or user gets a new hash, check mode reports without writing, the file is root:prometheus 0640, and
no password reaches the run's output."""

from __future__ import annotations

import grp
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from helpers import ROOT, ansible_tool
from test_monitoring_rules import ROLE, ansible_env

spec = importlib.util.spec_from_file_location("bcrypt_login", ROLE / "filter_plugins" / "bcrypt_login.py")
bcrypt_login_plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bcrypt_login_plugin)
bcrypt_login = bcrypt_login_plugin.bcrypt_login

PASSWORD = "node-exporter-password-0c4d"
# Cost 4, the least bcrypt takes: these tests check which hash is kept, not how slow it is to compute.
FAST = 4


def test_a_hash_that_verifies_the_password_is_kept():
    first = bcrypt_login(PASSWORD, "", FAST)
    assert bcrypt.checkpw(PASSWORD.encode(), first.encode())
    assert bcrypt_login(PASSWORD, first, FAST) == first


@pytest.mark.parametrize(
    ("kept", "why"),
    [
        ("", "no file yet"),
        (bcrypt.hashpw(b"the-old-password", bcrypt.gensalt(FAST)).decode(), "the password changed"),
        ("$2y$10$truncated", "a damaged hash"),
        ("not a hash at all", "someone edited the file"),
        (None, "no user of that name"),
        (12345, "a number"),
    ],
)
def test_a_new_hash_replaces_one_that_does_not_verify(kept, why):
    new = bcrypt_login(PASSWORD, kept, FAST)
    assert new != kept, why
    assert new.startswith("$2b$04$")
    assert bcrypt.checkpw(PASSWORD.encode(), new.encode()), why


def test_each_new_hash_has_its_own_salt():
    """A salt from the password would make the file a fast test of guesses; a random one does not."""
    assert bcrypt_login(PASSWORD, "", FAST) != bcrypt_login(PASSWORD, "", FAST)


def test_a_hash_of_go_s_2y_variant_is_kept():
    """htpasswd and exporter-toolkit's docs write $2y$; a hash someone made that way and that verifies stays."""
    made = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(FAST)).decode().replace("$2b$", "$2y$", 1)
    assert bcrypt_login(PASSWORD, made, FAST) == made


@pytest.mark.parametrize("password", ["", None, "x" * 73])
def test_an_unusable_password_fails_without_showing_it(password):
    with pytest.raises(AnsibleFilterError) as raised:
        bcrypt_login(password, "", FAST)
    assert "x" * 12 not in str(raised.value)


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not group_exists("prometheus"),
    reason="writes a file as root:prometheus (run as root, with Debian's prometheus package installed)",
)


def run_web_tasks(tmp: Path, web: dict, check: bool = False) -> tuple[int, str]:
    """The role's tasks/web.yml through real Ansible on this machine (a file under TMP, no service touched: the
    notify goes to a handler of the test's own). Returns the number of changed tasks and the run's output."""
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Write the web configuration",
                "ansible.builtin.include_role": {"name": "fleet_monitoring", "tasks_from": "web"},
                "vars": {"__web": web | {"skip": False, "notify": "test web changed"}},
            }
        ],
        "handlers": [{"name": "Changed", "ansible.builtin.debug": {"msg": "changed"}, "listen": "test web changed"}],
    }
    (tmp / "web.yml").write_text(yaml.safe_dump([play]))
    argv = [ansible_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp / "web.yml")]
    argv += ["-e", json.dumps({"ansible_python_interpreter": sys.executable, "__fleet_monitoring_bcrypt_rounds": FAST})]
    if check:
        argv.append("--check")
    env = ansible_env() | {"ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    changed = int(re.search(r"localhost\s*:.*changed=(\d+)", output).group(1))
    return changed, output


def users_of(path: Path) -> dict[str, str]:
    return yaml.safe_load(path.read_text())["basic_auth_users"]


@needs_root
def test_the_role_keeps_the_hash_until_the_password_or_user_changes(tmp_path):
    path = tmp_path / "node-exporter" / "web.yml"
    web = {"service": "node_exporter", "enabled": True, "path": str(path), "user": "prometheus"}
    web |= {"password": PASSWORD, "cert_file": "", "key_file": ""}

    changed, output = run_web_tasks(tmp_path, web)
    assert changed == 2  # the folder and the file
    first = users_of(path)["prometheus"]
    assert bcrypt.checkpw(PASSWORD.encode(), first.encode())
    mode = path.stat()
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid, grp.getgrgid(mode.st_gid).gr_name) == (0o640, 0, "prometheus")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750

    # Second run: nothing changes, the handler is not told.
    changed, output = run_web_tasks(tmp_path, web)
    assert changed == 0, output
    assert users_of(path)["prometheus"] == first
    assert "RUNNING HANDLER" not in output

    # Check mode with a new password: reported as a change, nothing written.
    changed, output = run_web_tasks(tmp_path, web | {"password": "a-new-password-77aa"}, check=True)
    assert changed == 1, output
    assert users_of(path)["prometheus"] == first

    changed, output = run_web_tasks(tmp_path, web | {"password": "a-new-password-77aa"})
    assert changed == 1, output
    assert bcrypt.checkpw(b"a-new-password-77aa", users_of(path)["prometheus"].encode())
    assert "RUNNING HANDLER" in output

    changed, output = run_web_tasks(tmp_path, web | {"password": "a-new-password-77aa", "user": "scraper"})
    assert changed == 1, output
    assert list(users_of(path)) == ["scraper"]

    for secret in (PASSWORD, "a-new-password-77aa"):
        assert secret not in output

    # No login and no TLS any more: the file goes (the ARGS no longer name it).
    changed, output = run_web_tasks(tmp_path, web | {"enabled": False})
    assert changed == 1, output
    assert not path.exists()


@needs_root
def test_missing_tls_files_stop_before_the_file_is_written(tmp_path):
    path = tmp_path / "prometheus" / "web.yml"
    web = {"service": "Prometheus", "enabled": True, "path": str(path), "user": "sparkfleet", "password": PASSWORD}
    web |= {"cert_file": str(tmp_path / "missing.crt"), "key_file": str(tmp_path / "missing.key")}
    with pytest.raises(AssertionError) as failed:
        run_web_tasks(tmp_path, web)
    assert "missing.crt and" in str(failed.value) and "are not on this host" in str(failed.value)
    assert not path.exists()
