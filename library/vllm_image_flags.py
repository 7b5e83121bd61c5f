#!/usr/bin/python
"""Ansible module vllm_image_flags: check the served models' flags against the pinned image's own vLLM."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_image_flags
short_description: Check every recipe and override flag against the C(vllm serve --help=all) of the image itself
description:
  - Preflight checks the flags against the committed flag list of a vLLM release; the image the Spark runs is the
    authority. This module runs C(vllm serve --help=all) inside O(image) once per image ID, keeps the answer in
    O(cache_dir), and checks every model in O(models) against it, with the same messages (and "did you mean")
    as the preflight check.
  - Fails listing every problem before any unit is written, so a flag the image's vLLM lacks stops the run
    instead of a unit that dies after a long weight load.
  - In check mode an image whose help is not cached yet is not run; the answer says so.
version_added: "0.2.0"
author: sparkfleet
options:
  image:
    description: The image the models run (an image ID, or a reference Docker resolves locally).
    type: str
    required: true
  cache_dir:
    description: Folder for the cached help texts, one file per image ID.
    type: path
    required: true
  models:
    description: The checked models, each C(label) (how messages name it) and C(recipe) (merged, as C(vllm_recipe)
      returns it).
    type: list
    elements: dict
    required: true
  docker_args:
    description: Arguments of C(docker run) before the image, e.g. C(--gpus all) (platform plugins can add flags).
    type: list
    elements: str
    default: [--gpus, all]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the flags against the image's own vLLM
  vllm_image_flags:
    image: "{{ vllm_image_id }}"
    cache_dir: /var/lib/sparkfleet/image-flags
    models:
      - label: vllm_server_models[0] (recipe qwen3-0.6b)
        recipe: "{{ checked.recipe }}"
"""

RETURN = r"""
image_id:
  description: The ID of the image whose help was read.
  returned: success
  type: str
help_file:
  description: The cached C(vllm serve --help=all) of that image.
  returned: success
  type: str
flags:
  description: How many flags the image's C(vllm serve) has (0 when check mode could not read them).
  returned: always
  type: int
problems:
  description: Every problem found; empty on success.
  returned: always
  type: list
  elements: str
"""

import os
import re
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vllm_flags import parse_serve_help
from ansible.module_utils.vllm_recipe import flag_problems


def cache_file(cache_dir: str, image_id: str) -> Path:
    """Where the help of one image ID is kept: sha256:abc… -> sha256-abc….help.txt."""
    return Path(cache_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "-", image_id) + ".help.txt")


def write_atomically(path: Path, text: str) -> None:
    """Beside the target, then rename: a reader never sees half a help text."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".help-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "cache_dir": {"type": "path", "required": True},
            "models": {"type": "list", "elements": "dict", "required": True},
            "docker_args": {"type": "list", "elements": "str", "default": ["--gpus", "all"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    docker = module.get_bin_path("docker", required=True)
    rc, out, err = module.run_command([docker, "image", "inspect", "--format", "{{.Id}}", params["image"]])
    if rc != 0:
        module.fail_json(msg=f"the image {params['image']} is not on this host ({err.strip()}): run vllm_image first")
    image_id = out.strip()
    help_file = cache_file(params["cache_dir"], image_id)
    changed = False
    if help_file.is_file():
        help_text = help_file.read_text(encoding="utf-8")
    elif module.check_mode:
        module.exit_json(changed=True, image_id=image_id, help_file=str(help_file), flags=0, problems=[])
    else:
        argv = [docker, "run", "--rm", "--pull", "never", *params["docker_args"], "--entrypoint", "vllm"]
        rc, help_text, err = module.run_command([*argv, image_id, "serve", "--help=all"])
        if rc != 0:
            module.fail_json(msg=f"`vllm serve --help=all` failed in the image {image_id} (exit {rc}): {err[-2000:]}")
        write_atomically(help_file, help_text)
        changed = True
    try:
        specs = parse_serve_help(help_text)
    except ValueError as error:
        module.fail_json(msg=f"{help_file}: {error}; delete the file to read the image's help again")
    source = f"the pinned image's vLLM ({image_id[:19]})"
    problems = [
        problem
        for model in params["models"]
        for problem in flag_problems(model["recipe"], specs, model["label"], source)
    ]
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems, image_id=image_id, flags=len(specs))
    module.exit_json(changed=changed, image_id=image_id, help_file=str(help_file), flags=len(specs), problems=[])


if __name__ == "__main__":
    main()
