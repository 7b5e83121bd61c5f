"""What every test folder needs: tests/ and module_utils/ on sys.path.

    tests/unit/         in-process: module_utils/'s functions, and library/'s modules through `run_module`
                        (tests/unit/conftest.py); nothing runs Ansible
    tests/integration/  real `ansible` / `ansible-playbook` runs, and live services on loopback (Prometheus, the
                        router, network namespaces, a Docker registry)
    tests/standins/     the stand-ins (vLLM, Hugging Face Hub, nvidia-smi, NVIDIA's apt repository) and their tests
    tests/helpers/      code the tests share (ROOT, the stand-ins' start and stop); no tests

Each folder's own fixtures are in its conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# tests/ for `helpers`; module_utils/ so that tests import its plain functions without Ansible's loader.
for folder in (TESTS, TESTS.parent / "module_utils"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

# module_utils/ also as part of ansible.module_utils, as Ansible's module loader makes it for a module it runs: a
# module_utils file that imports another (`from ansible.module_utils.recipe_rules import ...`) then works here too.
import ansible.module_utils  # noqa: E402 -- after sys.path is set

if str(TESTS.parent / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(TESTS.parent / "module_utils"))
